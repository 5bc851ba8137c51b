//! A property of the approval registry: whatever the interleaving of registrations, decisions (approve or deny,
//! repeated, for unknown keys too), timeouts and aborts over several keys, every registered approval resolves
//! exactly once.
//!
//! The test keeps a model of what must be pending and checks the registry against it after every step. Time is
//! tokio's paused clock, moved only by the test (`tokio::time::advance`), and waiters are tasks of a
//! current-thread runtime, so they run only while the test awaits: between two awaits nothing moves but what the
//! test does, and the model can say exactly what each call must return.

use std::time::Duration;

use agent::approvals::{AlreadyPending, ApprovalRegistry, NewApproval};
use agent::ids::{RunId, ToolCallId};
use agent::wire::{Decision, DenialSource, Resolution};
use futures::FutureExt;
use proptest::prelude::*;
use serde_json::json;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const RUNS: usize = 2;
/// Calls that get registered; decisions also go to call `CALLS`, which never is.
const CALLS: usize = 2;

#[derive(Clone, Debug)]
enum Step {
    /// The tool runtime asks for approval of `call` in `run`.
    Register {
        run: usize,
        call: usize,
        timeout_ms: u64,
    },
    /// A person decides.
    Resolve {
        run: usize,
        call: usize,
        approve: bool,
    },
    /// Time passes (and the waiters whose time is up may run).
    Advance { ms: u64 },
    /// The run is aborted; with `renew`, its later registrations get a fresh token (a new attempt), otherwise
    /// they register with the cancelled one.
    Abort { run: usize, renew: bool },
    /// The test yields once, so waiters that were woken may run.
    Yield,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => (0..RUNS, 0..CALLS, prop::sample::select(vec![1u64, 50, 100, 250, 1_000]))
            .prop_map(|(run, call, timeout_ms)| Step::Register { run, call, timeout_ms }),
        4 => (0..RUNS, 0..=CALLS, any::<bool>())
            .prop_map(|(run, call, approve)| Step::Resolve { run, call, approve }),
        2 => prop::sample::select(vec![1u64, 49, 50, 51, 100, 300, 2_000])
            .prop_map(|ms| Step::Advance { ms }),
        1 => (0..RUNS, any::<bool>()).prop_map(|(run, renew)| Step::Abort { run, renew }),
        2 => Just(Step::Yield),
    ]
}

fn run_id(run: usize) -> RunId {
    RunId::parse(format!("run-{run}")).unwrap()
}

fn call_id(call: usize) -> ToolCallId {
    ToolCallId::parse(format!("call-{call}")).unwrap()
}

/// One registration and what the model knows of it.
struct Registration {
    key: (usize, usize),
    waiter: JoinHandle<Resolution>,
    deadline: Instant,
    cancel: CancellationToken,
    /// The resolution a successful decision was told it made.
    decided: Option<Resolution>,
    /// What the waiter returned, once it did.
    outcome: Option<Resolution>,
}

impl Registration {
    /// Still in the registry: nobody decided it and its waiter has not settled it.
    fn is_pending(&self) -> bool {
        self.decided.is_none() && self.outcome.is_none()
    }
}

struct Model {
    registry: ApprovalRegistry,
    cancels: Vec<CancellationToken>,
    registrations: Vec<Registration>,
}

fn denial_source(resolution: &Resolution) -> Option<DenialSource> {
    match resolution {
        Resolution::Denied { source, .. } => Some(*source),
        Resolution::Approved { .. } => None,
    }
}

impl Model {
    fn new() -> Self {
        Self {
            registry: ApprovalRegistry::new(Duration::from_secs(120)),
            cancels: (0..RUNS).map(|_| CancellationToken::new()).collect(),
            registrations: Vec::new(),
        }
    }

    fn pending_for(&self, key: (usize, usize)) -> Vec<usize> {
        (0..self.registrations.len())
            .filter(|&i| self.registrations[i].key == key && self.registrations[i].is_pending())
            .collect()
    }

    async fn apply(&mut self, step: &Step) {
        match *step {
            Step::Register {
                run,
                call,
                timeout_ms,
            } => {
                let timeout = Duration::from_millis(timeout_ms);
                let cancel = self.cancels[run].clone();
                let registered = self.registry.register_with_timeout(
                    NewApproval {
                        run_id: run_id(run),
                        tool_call_id: call_id(call),
                        tool_name: "delete_file".into(),
                        arguments: json!({"path": "a.txt"}),
                        reason: "delete_file is destructive.".into(),
                    },
                    cancel.clone(),
                    timeout,
                );
                let already = !self.pending_for((run, call)).is_empty();
                match registered {
                    Ok(pending) => {
                        assert!(!already, "a second registration of a pending key succeeded");
                        self.registrations.push(Registration {
                            key: (run, call),
                            deadline: Instant::now() + timeout,
                            waiter: tokio::spawn(pending.wait()),
                            cancel,
                            decided: None,
                            outcome: None,
                        });
                    }
                    Err(AlreadyPending {
                        run_id: r,
                        tool_call_id: c,
                    }) => {
                        assert!(
                            already,
                            "registration refused although nothing is pending for the key"
                        );
                        assert_eq!((r, c), (run_id(run), call_id(call)));
                    }
                }
            }
            Step::Resolve { run, call, approve } => {
                let decision = if approve {
                    Decision::approve()
                } else {
                    Decision::deny()
                };
                let result = self
                    .registry
                    .resolve(&run_id(run), &call_id(call), decision.clone());
                let pending = self.pending_for((run, call));
                assert!(pending.len() <= 1, "two pending registrations for one key");
                match (result, pending.first()) {
                    (Ok(resolved), Some(&index)) => {
                        assert_eq!(resolved.resolution, Resolution::from_decision(decision));
                        assert_eq!(resolved.pending.run_id, run_id(run));
                        assert_eq!(resolved.pending.tool_call_id, call_id(call));
                        self.registrations[index].decided = Some(resolved.resolution);
                    }
                    (Err(not_found), None) => {
                        assert_eq!(
                            not_found.to_string(),
                            format!(
                                "No pending approval found for run run-{run} and tool call call-{call}. It may have already been resolved or timed out."
                            )
                        );
                    }
                    (Ok(resolved), None) => {
                        panic!("a decision resolved what was not pending: {resolved:?}")
                    }
                    (Err(_), Some(_)) => {
                        panic!("a decision found nothing although ({run}, {call}) is pending")
                    }
                }
            }
            Step::Advance { ms } => tokio::time::advance(Duration::from_millis(ms)).await,
            Step::Abort { run, renew } => {
                self.cancels[run].cancel();
                if renew {
                    self.cancels[run] = CancellationToken::new();
                }
            }
            Step::Yield => tokio::task::yield_now().await,
        }
    }

    /// Checks what a waiter returned against what must have happened.
    fn record(&mut self, index: usize, outcome: Resolution) {
        let registration = &mut self.registrations[index];
        assert!(registration.outcome.is_none(), "a waiter resolved twice");
        match &registration.decided {
            // The waiter gets exactly what the decision was told.
            Some(decided) => assert_eq!(&outcome, decided),
            // Otherwise the waiter settled it itself: an abort wins over a timeout when both are due.
            None if registration.cancel.is_cancelled() => {
                assert_eq!(
                    denial_source(&outcome),
                    Some(DenialSource::Abort),
                    "{outcome:?}"
                );
            }
            None => {
                assert_eq!(
                    denial_source(&outcome),
                    Some(DenialSource::Timeout),
                    "{outcome:?}"
                );
                assert!(Instant::now() >= registration.deadline, "timed out early");
            }
        }
        registration.outcome = Some(outcome);
    }

    /// Collects the waiters that finished, then checks that the registry lists exactly the pending registrations.
    fn observe(&mut self) {
        for index in 0..self.registrations.len() {
            let registration = &mut self.registrations[index];
            if registration.outcome.is_some() || !registration.waiter.is_finished() {
                continue;
            }
            let outcome = (&mut registration.waiter)
                .now_or_never()
                .expect("a finished task has its output")
                .expect("the waiter did not panic");
            self.record(index, outcome);
        }

        let mut listed: Vec<(String, String)> = self
            .registry
            .pending(None)
            .into_iter()
            .map(|request| (request.run_id.to_string(), request.tool_call_id.to_string()))
            .collect();
        listed.sort();
        let mut expected: Vec<(String, String)> = self
            .registrations
            .iter()
            .filter(|r| r.is_pending())
            .map(|r| (run_id(r.key.0).to_string(), call_id(r.key.1).to_string()))
            .collect();
        expected.sort();
        assert_eq!(
            listed, expected,
            "pending() lists exactly the unresolved approvals"
        );
        assert_eq!(self.registry.len(), expected.len());
    }

    /// Lets every waiter finish (the paused clock now runs on by itself to the next deadline) and checks the end
    /// state.
    async fn finish(mut self) {
        for index in 0..self.registrations.len() {
            if self.registrations[index].outcome.is_none() {
                let outcome = (&mut self.registrations[index].waiter)
                    .await
                    .expect("the waiter did not panic");
                self.record(index, outcome);
                self.observe();
            }
        }
        for registration in &self.registrations {
            assert!(registration.outcome.is_some(), "every waiter resolved");
        }
        assert!(self.registry.is_empty(), "nothing is left pending");
    }
}

async fn check(steps: Vec<Step>) {
    let mut model = Model::new();
    for step in &steps {
        model.apply(step).await;
        model.observe();
    }
    model.finish().await;
}

fn paused_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a runtime")
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn every_registered_approval_resolves_exactly_once(steps in prop::collection::vec(step(), 1..80)) {
        paused_runtime().block_on(check(steps));
    }
}

/// The interleavings the property is most about, spelled out, so they run on every test run whatever the seed.
#[test]
fn known_interleavings() {
    use Step::*;
    let cases = [
        // A decision after the deadline but before the waiter ran wins: the entry was still there.
        vec![
            Register {
                run: 0,
                call: 0,
                timeout_ms: 50,
            },
            Advance { ms: 100 },
            Resolve {
                run: 0,
                call: 0,
                approve: true,
            },
        ],
        // An abort and a timeout both due: the abort wins.
        vec![
            Register {
                run: 0,
                call: 0,
                timeout_ms: 50,
            },
            Abort {
                run: 0,
                renew: false,
            },
            Advance { ms: 100 },
        ],
        // A decision after an abort that the waiter has not seen yet wins.
        vec![
            Register {
                run: 0,
                call: 0,
                timeout_ms: 50,
            },
            Abort {
                run: 0,
                renew: false,
            },
            Resolve {
                run: 0,
                call: 0,
                approve: false,
            },
        ],
        // Registering with an already-cancelled token, then re-registering the key after it settled.
        vec![
            Abort {
                run: 1,
                renew: false,
            },
            Register {
                run: 1,
                call: 1,
                timeout_ms: 1,
            },
            Yield,
            Yield,
            Register {
                run: 1,
                call: 1,
                timeout_ms: 1,
            },
        ],
        // A key decided and registered again before its first waiter ran.
        vec![
            Register {
                run: 0,
                call: 1,
                timeout_ms: 250,
            },
            Resolve {
                run: 0,
                call: 1,
                approve: true,
            },
            Register {
                run: 0,
                call: 1,
                timeout_ms: 250,
            },
            Resolve {
                run: 0,
                call: 1,
                approve: false,
            },
            Resolve {
                run: 0,
                call: 1,
                approve: true,
            },
        ],
        // Decisions for a key never registered.
        vec![
            Resolve {
                run: 1,
                call: CALLS,
                approve: true,
            },
            Register {
                run: 1,
                call: 0,
                timeout_ms: 1,
            },
            Resolve {
                run: 1,
                call: CALLS,
                approve: false,
            },
        ],
    ];
    for steps in cases {
        paused_runtime().block_on(check(steps));
    }
}
