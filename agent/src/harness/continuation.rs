//! A waiting run goes on: its allowed and approved calls run (each taken once, in whichever process gets it), and
//! once every call of its batch is settled, whoever claims the batch first samples on from its saved state.

use std::sync::Arc;

use super::drive::{NoEvents, Segment};
use super::finish::abort_settlement;
use super::{Harness, Unavailable};
use crate::events::AgentEvent;
use crate::ids::RunId;
use crate::runtime::{RunContext, RunError, encode, execute};
use crate::store::{EndClaim, FinishRun, RunState, StoreError};

impl Harness {
    /// Advances a waiting run in a task of this process.
    pub(super) fn spawn_advance(&self, run_id: RunId) {
        let harness = self.clone();
        self.inner.tasks.spawn(async move {
            if let Err(error) = harness.advance(&run_id).await {
                tracing::error!(%run_id, %error, "cannot advance the run");
            }
        });
    }

    /// Runs the calls of a waiting run that are to run and nobody has taken, then claims the batch if it is
    /// settled.
    async fn advance(&self, run_id: &RunId) -> Result<(), Unavailable> {
        let store = &self.inner.store;
        let Some(info) = store.run(run_id).await? else {
            return Ok(());
        };
        if info.state != RunState::Waiting {
            return Ok(());
        }
        let calls = match store.calls(run_id).await {
            Ok(calls) => calls,
            // A call this process cannot read: the claim looks at the calls' statuses alone, and says whether the
            // run is left for an instance that can read it or, aborted, ends.
            Err(StoreError::Corrupt(why)) => {
                self.unreadable_here(run_id, &why);
                return self.claim(run_id).await;
            }
            Err(error) => return Err(error.into()),
        };
        let runnable: Vec<_> = calls
            .iter()
            .filter(|record| record.status.is_runnable())
            .map(|record| record.call.id.clone())
            .collect();
        if !runnable.is_empty() && !self.inner.closing.is_cancelled() {
            let local = self.inner.local.enter(run_id);
            // The policy of a call being run was decided when its batch opened; only the tools matter here.
            let context = self
                .context(
                    &info,
                    self.inner.config.permissions.policy,
                    local.abort.clone(),
                    Arc::new(NoEvents),
                    0,
                )
                .await;
            // Each call under a switch of its own, which the run's abort throws too (see `LocalRuns::calls`).
            let results = futures::future::join_all(runnable.iter().map(|call_id| {
                let call = local.call(call_id);
                let context = RunContext {
                    abort: call.abort.clone(),
                    ..context.clone()
                };
                async move {
                    let result = execute(&context, call_id, None).await;
                    drop(call);
                    result
                }
            }))
            .await;
            for result in results {
                match result {
                    Ok(_) | Err(RunError::Lost) => {}
                    Err(error) => {
                        tracing::error!(%run_id, %error, "a call of the run failed to run")
                    }
                }
            }
        }
        self.claim(run_id).await
    }

    /// Claims a settled batch and samples on, in a task of this process.
    async fn claim(&self, run_id: &RunId) -> Result<(), Unavailable> {
        if self.inner.closing.is_cancelled() && self.inner.store.kind().is_durable() {
            // Claimed later: after a restart, or by another instance. (A memory store's runs end now: nothing
            // of them could outlive the process.)
            return Ok(());
        }
        let store = &self.inner.store;
        // Before the run is this instance's: see `LocalRun`.
        let local = self.inner.local.enter(run_id);
        let claimed = match store.claim_batch(run_id, abort_settlement(None)).await {
            Ok(Some(claimed)) => claimed,
            Ok(None) => return Ok(()),
            Err(StoreError::Corrupt(why)) => return self.unreadable(run_id, why).await,
            Err(error) => return Err(error.into()),
        };
        let info = claimed.run.clone();
        let epoch = claimed.epoch;
        let policy = claimed.batch.policy;
        self.spawn_segment(
            info,
            policy,
            epoch,
            Segment::Continue(Box::new(claimed)),
            local,
        );
        Ok(())
    }

    /// A waiting run whose saved state this process cannot read (a row written by a newer version during a rolling
    /// deploy, a file changed by hand, a damaged disk) is left as it is, for an instance that can read it. Once it
    /// was aborted, nothing is left to read it for: it ends, failed with a store error that says what could not be
    /// read, and its session is free. (An abort ends a waiting run through its claim, so without this a run nobody
    /// can read would hold its session for good.)
    async fn unreadable(&self, run_id: &RunId, why: String) -> Result<(), Unavailable> {
        let store = &self.inner.store;
        let aborted = store
            .run(run_id)
            .await?
            .is_some_and(|info| info.state == RunState::Waiting && info.abort.is_some());
        if !aborted {
            self.unreadable_here(run_id, &why);
            return Ok(());
        }
        tracing::error!(%run_id, %why, "an aborted run's saved state cannot be read; it ends failed");
        self.inner.unreadable.forget(run_id);
        let error = RunError::Store(format!(
            "the run was aborted, and its saved state could not be read to end it as usual ({why})"
        ));
        let failure = AgentEvent::RunFailed {
            code: error.code(),
            message: error.to_string(),
        };
        let finish = FinishRun {
            run_id: run_id.clone(),
            // Nobody holds a waiting run. Should another instance (one that can read it) claim it meanwhile, this
            // end is refused: that instance ends it, as aborted.
            claim: EndClaim::Waiting,
            state: RunState::Failed,
            history: Vec::new(),
            conversation: None,
            suspension: None,
            events: encode(run_id, failure),
            audit: Vec::new(),
            // No call is running (the claim looked at every call's status before it read anything else): the
            // calls are final, or left unsettled by the abort because it could not read them. Like recovery's,
            // this end reads no call's row; it deletes them.
            settle_pending: None,
        };
        if let Err(fenced) = store.finish_run(finish).await? {
            tracing::warn!(%run_id, %fenced, "the aborted run ended, or was claimed by an instance that can read it, meanwhile");
        }
        Ok(())
    }

    /// Logs that a waiting run's saved state cannot be read here: once a run, as an error; again (every look for
    /// stalled runs on a shared database meets it) only at debug level.
    fn unreadable_here(&self, run_id: &RunId, why: &str) {
        if self.inner.unreadable.first(run_id.clone()) {
            tracing::error!(%run_id, %why, "a waiting run's saved state cannot be read here; it is left for an instance that can read it");
        } else {
            tracing::debug!(%run_id, %why, "a waiting run's saved state still cannot be read here");
        }
    }

    /// Advances every waiting run that has work nobody is doing (after a restart, say).
    pub(super) async fn kick_stalled(&self) -> Result<(), Unavailable> {
        for run_id in self.inner.store.stalled_runs().await? {
            self.spawn_advance(run_id);
        }
        Ok(())
    }
}
