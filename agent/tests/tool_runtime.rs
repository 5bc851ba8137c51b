//! The approval contract's tests for one tool call in interactive mode, and the permission paths that never reach
//! a person. Each drives a real harness (memory store) and reads the run's own event stream.

#[cfg(feature = "sql")]
#[path = "support/postgres.rs"]
mod postgres;
mod support;

use std::sync::Arc;

use agent::runtime::AbortReason;
use agent::tools::{Tool, ToolContext, ToolFuture, Toolbox};
use agent::wire::{
    ApprovalMode, ApprovalPolicy, Decision, DecisionScope, DenialSource, Message,
    PermissionDecision, Resolution, RunErrorCode, StreamEvent, ToolAnnotations, ToolCall,
    ToolErrorCode, ToolOutput,
};
use serde_json::json;
use support::*;
use tokio::sync::Notify;

const DENIAL_TAIL: &str = "The action was not performed. Do not retry the same call; take a different approach or explain what you need in the final answer.";

fn delete_a() -> Vec<Vec<agent::model::ModelChunk>> {
    vec![
        tool_step(&[call("call-1", "delete_file", json!({"path": "a.txt"}))]),
        text_step("Finished."),
    ]
}

/// The output the model got for a call.
fn output_of(events: &[StreamEvent], call_id: &str) -> ToolOutput {
    events
        .iter()
        .find_map(|event| match event {
            StreamEvent::ToolResult {
                tool_call_id,
                output,
                ..
            } if tool_call_id.as_str() == call_id => Some(output.clone()),
            _ => None,
        })
        .expect("the call has a result")
}

#[tokio::test]
async fn interactive_tool_runtime_executes_the_tool_after_approval() {
    let fx = on_request(delete_a());
    let run = fx.start(ApprovalMode::Interactive, "delete a.txt").await;
    let mut events = Events::of(&run);
    let request = events.next_approval().await;
    assert_eq!(request.tool_name, "delete_file");
    assert_eq!(request.reason, "delete_file is destructive.");
    // Whoever sees the event can decide at once: the approval was pending before the event could be read.
    fx.decide(&request, Decision::approve()).await;

    let events = all_events(&run).await;
    assert!(output_of(&events, "call-1").is_ok());
    assert_eq!(fx.deletes.inputs(), vec![json!({"path": "a.txt"})]);
    assert_eq!(
        call_kinds(&events, "call-1"),
        [
            "toolCall",
            "approvalRequired",
            "approvalResolved",
            "toolResult"
        ]
    );
}

#[tokio::test]
async fn interactive_tool_runtime_returns_a_recoverable_error_after_denial() {
    let fx = on_request(delete_a());
    let run = fx.start(ApprovalMode::Interactive, "delete a.txt").await;
    let request = Events::of(&run).next_approval().await;
    fx.decide(
        &request,
        Decision::Deny {
            reason: Some("keep that file".into()),
        },
    )
    .await;

    let events = all_events(&run).await;
    assert_eq!(
        output_of(&events, "call-1"),
        ToolOutput::Error {
            code: ToolErrorCode::ApprovalDenied,
            message: format!("The user denied this tool call: keep that file. {DENIAL_TAIL}"),
        }
    );
    assert_eq!(
        answer(&events),
        Some("Finished."),
        "a denial does not end the run"
    );
    assert_eq!(fx.deletes.count(), 0, "nothing ran");
}

#[tokio::test]
async fn interactive_tool_runtime_denies_when_the_run_aborts_while_waiting_for_approval() {
    let fx = on_request(delete_a());
    let run = fx.start(ApprovalMode::Interactive, "delete a.txt").await;
    Events::of(&run).next_approval().await;
    fx.harness
        .cancel(run.run_id(), &agent::harness::Actor::local())
        .await
        .unwrap();
    assert!(fx.pending().await.is_empty(), "nothing is left pending");

    let events = all_events(&run).await;
    assert_eq!(
        output_of(&events, "call-1"),
        ToolOutput::Error {
            code: ToolErrorCode::ApprovalDenied,
            message: format!("The run was aborted before a decision arrived. {DENIAL_TAIL}"),
        }
    );
    assert_eq!(fx.deletes.count(), 0);
    let resolved = events.iter().find_map(|e| match e {
        StreamEvent::ApprovalResolved { resolution, .. } => Some(resolution.clone()),
        _ => None,
    });
    assert!(matches!(
        resolved,
        Some(Resolution::Denied {
            source: DenialSource::Abort,
            ..
        })
    ));
    assert_eq!(failure(&events).unwrap().0, RunErrorCode::Aborted);
}

#[tokio::test]
async fn a_run_cancelled_before_its_task_began_runs_none_of_its_calls() {
    // `read_file` is read-only: the policy lets it run without asking, in the run's own task.
    let fx = on_request(vec![
        tool_step(&[call("call-1", "read_file", json!({"path": "a.txt"}))]),
        text_step("done"),
    ]);
    // One thread, and the test does not yield between the start and the cancel: the run's task has not begun when
    // the abort is recorded, so nothing of this process hears of it through the run's abort switch.
    let run = fx.start(ApprovalMode::Interactive, "read a.txt").await;
    let cancelled = fx
        .harness
        .cancel(run.run_id(), &agent::harness::Actor::local())
        .await
        .unwrap();
    assert_eq!(cancelled.run.state, agent::store::RunState::Running);

    let events = all_events(&run).await;
    assert_eq!(fx.reads.count(), 0, "the allowed call did not run");
    assert_eq!(failure(&events).unwrap().0, RunErrorCode::Aborted);
}

#[tokio::test]
async fn a_run_cancelled_before_its_task_began_ends_aborted_even_with_nothing_to_call() {
    let fx = on_request(vec![text_step("hello")]);
    // As above: the abort is recorded before the run's task is first polled.
    let run = fx.start(ApprovalMode::Interactive, "hi").await;
    fx.harness
        .cancel(run.run_id(), &agent::harness::Actor::local())
        .await
        .unwrap();

    let events = all_events(&run).await;
    assert_eq!(failure(&events).unwrap().0, RunErrorCode::Aborted);
    assert_eq!(answer(&events), None, "no answer after the cancel");
}

/// A model that never answers: its run samples until it is stopped.
struct Silent;

impl agent::model::Model for Silent {
    fn name(&self) -> &str {
        "silent"
    }

    fn stream<'a>(&'a self, _: agent::model::ModelRequest<'a>) -> agent::model::ModelStream<'a> {
        futures::StreamExt::boxed(futures::stream::pending())
    }
}

#[tokio::test(start_paused = true)]
async fn an_abort_recorded_where_this_process_did_not_hear_of_it_still_stops_the_run() {
    let tools = counting_tools(
        Arc::new(Silent),
        ApprovalPolicy::OnRequest,
        Default::default(),
        Default::default(),
    );
    let run = start_run(&tools.harness, ApprovalMode::Interactive, "hello").await;
    // Recorded in the store alone, as another instance records it when the doorbell that would tell this one is
    // lost: nothing tells this process's task.
    tools
        .harness
        .store()
        .abort_run(
            run.run_id(),
            AbortReason::Cancelled,
            Box::new(|record| {
                agent::approvals::settlement(record, agent::approvals::not_run_after_abort(), None)
            }),
        )
        .await
        .unwrap()
        .expect("the run is there");

    let events = tokio::time::timeout(std::time::Duration::from_secs(60), all_events(&run))
        .await
        .expect("the run ends");
    assert_eq!(failure(&events).unwrap().0, RunErrorCode::Aborted);
}

#[tokio::test(start_paused = true)]
async fn interactive_tool_runtime_denies_when_nobody_decides_in_time() {
    let fx = on_request(delete_a());
    let run = fx.start(ApprovalMode::Interactive, "delete a.txt").await;
    let events = all_events(&run).await;
    assert_eq!(
        output_of(&events, "call-1"),
        ToolOutput::Error {
            code: ToolErrorCode::ApprovalDenied,
            message: format!(
                "No decision arrived within 120 s, so the call was denied. {DENIAL_TAIL}"
            ),
        }
    );
    assert_eq!(fx.deletes.count(), 0);
}

#[tokio::test]
async fn fail_closed_refuses_a_call_that_asks_and_runs_nothing() {
    let fx = on_request(delete_a());
    let run = fx.start(ApprovalMode::FailClosed, "delete a.txt").await;
    let events = all_events(&run).await;
    let (code, message) = failure(&events).unwrap();
    assert_eq!(code, RunErrorCode::ApprovalRequired);
    assert!(
        message.starts_with("delete_file needs approval (delete_file is destructive.)"),
        "{message}"
    );
    assert_eq!(fx.deletes.count(), 0);
    assert!(
        !events
            .iter()
            .any(|e| matches!(e, StreamEvent::ApprovalRequired { .. })),
        "fail-closed never asks"
    );
}

#[tokio::test]
async fn allowed_calls_run_without_touching_the_approval_system() {
    for mode in [ApprovalMode::FailClosed, ApprovalMode::Interactive] {
        let fx = on_request(vec![
            tool_step(&[call("c", "read_file", json!({"path": "a"}))]),
            text_step("read"),
        ]);
        let run = fx.start(mode, "read a").await;
        let events = all_events(&run).await;
        assert!(output_of(&events, "c").is_ok());
        assert_eq!(fx.reads.count(), 1);
        assert_eq!(call_kinds(&events, "c"), ["toolCall", "toolResult"]);
    }
}

#[tokio::test]
async fn a_denying_rule_returns_permission_denied_and_never_asks() {
    for mode in [ApprovalMode::FailClosed, ApprovalMode::Interactive] {
        let fx = fixture(
            ApprovalPolicy::Strict,
            rules("delete_file=deny"),
            vec![
                tool_step(&[call("c", "delete_file", json!({"path": "a"}))]),
                text_step("denied"),
            ],
        );
        let run = fx.start(mode, "delete a").await;
        let events = all_events(&run).await;
        assert_eq!(
            output_of(&events, "c"),
            ToolOutput::Error {
                code: ToolErrorCode::PermissionDenied,
                message: "The rule delete_file=deny denies this call.".into()
            }
        );
        assert_eq!(fx.deletes.count(), 0);
        assert_eq!(call_kinds(&events, "c"), ["toolCall", "toolResult"]);
    }
}

#[tokio::test]
async fn invalid_input_is_a_recoverable_output_and_is_never_put_to_a_person() {
    let fx = on_request(vec![
        tool_step(&[
            call("c1", "delete_file", json!({"nope": 1})),
            ToolCall {
                id: "c2".parse().unwrap(),
                name: "delete_file".into(),
                arguments: "{\"path\": ".into(),
            },
            call("c3", "format_disk", json!({})),
        ]),
        text_step("none of that worked"),
    ]);
    let run = fx.start(ApprovalMode::Interactive, "do things").await;
    let events = all_events(&run).await;
    for (call, code) in [
        ("c1", ToolErrorCode::InvalidInput),
        ("c2", ToolErrorCode::InvalidArguments),
        ("c3", ToolErrorCode::UnknownTool),
    ] {
        let output = output_of(&events, call);
        assert!(
            matches!(&output, ToolOutput::Error { code: got, .. } if *got == code),
            "{call}: {output:?}"
        );
    }
    assert_eq!(fx.deletes.count(), 0);
    assert!(
        !events
            .iter()
            .any(|e| matches!(e, StreamEvent::ApprovalRequired { .. }))
    );
}

#[tokio::test]
async fn approving_for_the_session_lets_later_calls_of_that_tool_run_without_asking() {
    let fx = on_request(vec![
        tool_step(&[call("call-1", "delete_file", json!({"path": "a.txt"}))]),
        tool_step(&[call("call-2", "delete_file", json!({"path": "b.txt"}))]),
        text_step("both gone"),
    ]);
    let run = fx.start(ApprovalMode::Interactive, "delete a and b").await;
    let request = Events::of(&run).next_approval().await;
    fx.decide(
        &request,
        Decision::Approve {
            scope: DecisionScope::Session,
            reason: None,
            arguments: None,
        },
    )
    .await;

    let events = all_events(&run).await;
    assert!(
        output_of(&events, "call-2").is_ok(),
        "ran without a decision"
    );
    assert_eq!(call_kinds(&events, "call-2"), ["toolCall", "toolResult"]);
    assert_eq!(fx.deletes.count(), 2);
    let grants = fx.harness.grants(run.session_id()).await.unwrap();
    let decision = fx.harness.config().permissions.decide(
        fx.harness.toolbox().lookup("delete_file").unwrap().spec(),
        &json!({"path": "c.txt"}),
        &grants,
    );
    assert_eq!(
        decision,
        PermissionDecision::Allow {
            reason: "Approved for this session: delete_file on any path in the workspace.".into()
        }
    );
}

#[tokio::test]
async fn approved_edited_arguments_are_what_runs() {
    let fx = on_request(vec![
        tool_step(&[call(
            "call-1",
            "delete_file",
            json!({"path": "important.txt"}),
        )]),
        text_step("done"),
    ]);
    let run = fx.start(ApprovalMode::Interactive, "delete").await;
    let request = Events::of(&run).next_approval().await;
    fx.decide(
        &request,
        Decision::Approve {
            scope: DecisionScope::Once,
            reason: None,
            arguments: Some(json!({"path": "scratch.txt"})),
        },
    )
    .await;
    let events = all_events(&run).await;
    assert_eq!(fx.deletes.inputs(), vec![json!({"path": "scratch.txt"})]);
    let executed = events.iter().find_map(|e| match e {
        StreamEvent::ToolResult {
            executed_arguments, ..
        } => executed_arguments.clone(),
        _ => None,
    });
    assert_eq!(executed, Some(json!({"path": "scratch.txt"})));
}

#[tokio::test]
async fn an_abort_reason_is_what_the_run_ends_with() {
    let fx = on_request(delete_a());
    let run = fx.start(ApprovalMode::Interactive, "delete a.txt").await;
    Events::of(&run).next_approval().await;
    run.abort(AbortReason::Disconnected);
    let events = all_events(&run).await;
    assert_eq!(
        failure(&events),
        Some((
            RunErrorCode::Aborted,
            "The client disconnected, so the run was aborted."
        ))
    );
}

/// A test tool's definition, built in as the tools of this crate are: it takes any object of arguments.
fn test_tool(name: &str, description: &str, annotations: ToolAnnotations) -> agent::wire::ToolSpec {
    agent::wire::ToolSpec {
        name: name.into(),
        description: description.into(),
        input_schema: json!({"type": "object"}),
        annotations,
        mcp: None,
    }
}

/// Annotations that say all of a tool that changes things (it asks under `on_request`).
const DESTRUCTIVE: ToolAnnotations = ToolAnnotations {
    read_only: Some(false),
    destructive: Some(true),
    idempotent: Some(false),
    open_world: Some(false),
};

/// A read-only tool that starts, then waits to be let go before it finishes its work, whatever the run does.
struct FinishesWhenLetGo {
    spec: agent::wire::ToolSpec,
    started: Arc<Notify>,
    let_go: Arc<Notify>,
}

impl FinishesWhenLetGo {
    fn new() -> Self {
        Self {
            spec: test_tool(
                "slow_read",
                "A read that takes a while",
                ToolAnnotations {
                    read_only: Some(true),
                    destructive: Some(false),
                    idempotent: Some(true),
                    open_world: Some(false),
                },
            ),
            started: Arc::new(Notify::new()),
            let_go: Arc::new(Notify::new()),
        }
    }
}

impl Tool for FinishesWhenLetGo {
    fn spec(&self) -> &agent::wire::ToolSpec {
        &self.spec
    }

    fn execute<'a>(&'a self, _: serde_json::Value, _: &'a ToolContext) -> ToolFuture<'a> {
        Box::pin(async move {
            self.started.notify_one();
            self.let_go.notified().await;
            Ok(json!({"read": "all of it"}))
        })
    }
}

/// A destructive tool whose work panics.
struct Panics(agent::wire::ToolSpec);

impl Tool for Panics {
    fn spec(&self) -> &agent::wire::ToolSpec {
        &self.0
    }

    fn execute<'a>(&'a self, _: serde_json::Value, _: &'a ToolContext) -> ToolFuture<'a> {
        Box::pin(async { panic!("the tool's own defect") })
    }
}

/// An approved call whose tool panics fails, with a result that says so, and the run goes on. Before, the panic
/// ended the task that ran a waiting run's approved calls: the call stayed executing, so the run could neither go
/// on nor end, and its session refused every next message.
#[tokio::test]
async fn an_approved_call_whose_tool_panics_fails_and_the_run_goes_on() {
    let tool = Panics(test_tool("shred", "Shreds", DESTRUCTIVE));
    let harness = harness_over(
        Arc::new(ReplayModel::new(vec![
            tool_step(&[call("call-1", "shred", json!({}))]),
            text_step("It failed."),
        ])),
        Toolbox::new().with(tool).unwrap(),
        ApprovalPolicy::OnRequest,
    );
    let run = start_interactive(&harness, "shred").await;
    let request = Events::of(&run).next_approval().await;
    decide_pending(&harness, &request, Decision::approve()).await;
    let events = tokio::time::timeout(std::time::Duration::from_secs(10), all_events(&run))
        .await
        .expect("the run ends");
    assert!(matches!(
        output_of(&events, "call-1"),
        ToolOutput::Error { code: ToolErrorCode::ToolFailed, message }
            if message == "The tool stopped unexpectedly: it panicked."
    ));
    assert_eq!(answer(&events), Some("It failed."));
}

fn slow_read_harness(tool: FinishesWhenLetGo) -> agent::harness::Harness {
    harness_over(
        Arc::new(ReplayModel::new(vec![
            tool_step(&[call("call-1", "slow_read", json!({}))]),
            text_step("never reached"),
        ])),
        Toolbox::new().with(tool).unwrap(),
        ApprovalPolicy::OnRequest,
    )
}

#[tokio::test]
async fn a_tool_that_finishes_after_the_abort_reports_its_real_result_then_the_run_ends() {
    let tool = FinishesWhenLetGo::new();
    let (started, let_go) = (Arc::clone(&tool.started), Arc::clone(&tool.let_go));
    let harness = slow_read_harness(tool);
    let run = start_interactive(&harness, "read slowly").await;
    started.notified().await;
    harness
        .cancel(run.run_id(), &agent::harness::Actor::local())
        .await
        .unwrap();
    let_go.notify_one();

    let events = all_events(&run).await;
    assert_eq!(
        output_of(&events, "call-1"),
        ToolOutput::Ok {
            content: json!({"read": "all of it"})
        }
    );
    assert_eq!(failure(&events).unwrap().0, RunErrorCode::Aborted);
}

#[tokio::test(start_paused = true)]
async fn a_tool_that_does_not_stop_after_the_abort_is_reported_as_left_behind() {
    let tool = FinishesWhenLetGo::new();
    let started = Arc::clone(&tool.started);
    let harness = slow_read_harness(tool);
    let run = start_interactive(&harness, "read slowly").await;
    started.notified().await;
    harness
        .cancel(run.run_id(), &agent::harness::Actor::local())
        .await
        .unwrap();

    let events = all_events(&run).await;
    assert_eq!(
        output_of(&events, "call-1"),
        ToolOutput::Error {
            code: ToolErrorCode::ToolFailed,
            message: "The run was aborted while slow_read was running, and it did not stop within 2 s; what it did is unknown.".into(),
        }
    );
    assert_eq!(failure(&events).unwrap().0, RunErrorCode::Aborted);
}

/// A replayed model that holds its second step back until the test lets it go.
struct HeldSecondStep {
    steps: ReplayModel,
    asked: std::sync::atomic::AtomicUsize,
    release: tokio::sync::Semaphore,
}

impl HeldSecondStep {
    /// Deletes a.txt, then (once let go) b.txt, then answers.
    fn deleting_a_then_b() -> Arc<Self> {
        Arc::new(Self {
            steps: ReplayModel::new(vec![
                tool_step(&[call("call-1", "delete_file", json!({"path": "a.txt"}))]),
                tool_step(&[call("call-2", "delete_file", json!({"path": "b.txt"}))]),
                text_step("done"),
            ]),
            asked: Default::default(),
            release: tokio::sync::Semaphore::new(0),
        })
    }
}

impl agent::model::Model for HeldSecondStep {
    fn name(&self) -> &str {
        "held"
    }

    fn stream<'a>(
        &'a self,
        request: agent::model::ModelRequest<'a>,
    ) -> agent::model::ModelStream<'a> {
        use futures::StreamExt;
        let second = self.asked.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 1;
        futures::stream::once(async move {
            if second {
                self.release.acquire().await.unwrap().forget();
            }
            self.steps.stream(request)
        })
        .flatten()
        .boxed()
    }
}

#[tokio::test]
async fn a_grant_revoked_while_the_run_goes_on_allows_none_of_its_later_calls() {
    let model = HeldSecondStep::deleting_a_then_b();
    let tools = counting_tools(
        Arc::clone(&model) as Arc<dyn agent::model::Model>,
        ApprovalPolicy::OnRequest,
        Default::default(),
        Default::default(),
    );
    let harness = &tools.harness;
    let run = start_run(harness, ApprovalMode::Interactive, "delete a and b").await;
    let mut events = Events::of(&run);
    let request = events.next_approval().await;
    decide_pending(
        harness,
        &request,
        Decision::Approve {
            scope: DecisionScope::Session,
            reason: None,
            arguments: None,
        },
    )
    .await;
    events
        .until(|e| matches!(e, StreamEvent::ToolResult { .. }))
        .await;
    let grants = harness.grants(run.session_id()).await.unwrap();
    let [grant] = grants.list() else {
        panic!("one grant: {grants:?}")
    };
    harness
        .revoke_grant(run.session_id(), &grant.id, &agent::harness::Actor::local())
        .await
        .unwrap();

    model.release.add_permits(1);
    let request = events.next_approval().await;
    assert_eq!(request.tool_call_id.as_str(), "call-2", "b asks again");
    assert_eq!(tools.deletes.count(), 1, "and has not run");
}

/// A rule removed on another instance sharing the store (PostgreSQL) allows none of a running run's later calls:
/// the run reads the rules again before each step's calls, as it reads the session's grants.
#[cfg(feature = "sql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rule_removed_on_another_instance_allows_none_of_the_runs_later_calls() {
    use agent::store::sql::{DatabaseUrl, SqlStore};
    let url = DatabaseUrl::Postgres(postgres::database());
    let model = HeldSecondStep::deleting_a_then_b();
    let here = counting_tools_on(
        Arc::clone(&model) as Arc<dyn agent::model::Model>,
        SqlStore::open(&url).await.unwrap(),
    )
    .await;
    let elsewhere = counting_tools_on(
        Arc::new(ReplayModel::new(Vec::new())),
        SqlStore::open(&url).await.unwrap(),
    )
    .await;
    let local = agent::harness::Actor::local();
    let rule = elsewhere
        .harness
        .add_rule(
            agent::policy::Rule::parse("delete_file=allow").unwrap(),
            &local,
        )
        .await
        .unwrap();

    let run = start_run(&here.harness, ApprovalMode::Interactive, "delete a and b").await;
    let mut events = Events::of(&run);
    events
        .until(|e| matches!(e, StreamEvent::ToolResult { .. }))
        .await;
    assert_eq!(here.deletes.count(), 1, "a ran under the rule");
    elsewhere
        .harness
        .remove_rule(&rule.id, &local)
        .await
        .unwrap();

    model.release.add_permits(1);
    let request = events.next_approval().await;
    assert_eq!(request.tool_call_id.as_str(), "call-2", "b asks");
    assert_eq!(here.deletes.count(), 1, "and has not run");
}

/// A destructive tool (it asks) that works until its run's abort reaches it, and then says it was stopped, or until
/// it is let go, and then says it wrote.
#[cfg(feature = "sql")]
struct WorksUntilStopped {
    spec: agent::wire::ToolSpec,
    started: Arc<Notify>,
    stopped: Arc<Notify>,
    let_go: Arc<Notify>,
}

#[cfg(feature = "sql")]
impl WorksUntilStopped {
    fn named(name: &str) -> Self {
        Self {
            spec: test_tool(
                name,
                "A write that takes until it is stopped or let go",
                DESTRUCTIVE,
            ),
            started: Arc::new(Notify::new()),
            stopped: Arc::new(Notify::new()),
            let_go: Arc::new(Notify::new()),
        }
    }
}

#[cfg(feature = "sql")]
impl Tool for WorksUntilStopped {
    fn spec(&self) -> &agent::wire::ToolSpec {
        &self.spec
    }

    fn execute<'a>(&'a self, _: serde_json::Value, context: &'a ToolContext) -> ToolFuture<'a> {
        Box::pin(async move {
            self.started.notify_one();
            tokio::select! {
                () = context.cancel.cancelled() => {
                    self.stopped.notify_one();
                    Err(agent::tools::ToolError::new(ToolErrorCode::ToolFailed, "stopped"))
                }
                () = self.let_go.notified() => Ok(json!("written")),
            }
        })
    }
}

/// The signals of a [`WorksUntilStopped`] tool, kept by a test once the toolbox has the tool.
#[cfg(feature = "sql")]
struct Signals {
    started: Arc<Notify>,
    stopped: Arc<Notify>,
    let_go: Arc<Notify>,
}

#[cfg(feature = "sql")]
fn harness_config() -> agent::harness::HarnessConfig {
    agent::harness::HarnessConfig::new(
        agent::policy::PermissionPolicy::new(ApprovalPolicy::OnRequest, Default::default()),
        std::time::Duration::from_secs(120),
    )
}

/// An instance on PostgreSQL (its heartbeat's lease ten minutes, so that it does not come back during a test) that
/// runs the approved calls of a waiting run, one [`WorksUntilStopped`] tool per call, each until it is stopped or let
/// go; the run then answers "Written.". Returns once every call has started.
#[cfg(feature = "sql")]
async fn a_waiting_runs_calls_running(
    calls: &[&str],
    config: agent::harness::HarnessConfig,
) -> (
    String,
    Arc<agent::store::sql::SqlStore>,
    agent::harness::Harness,
    agent::harness::RunHandle,
    Vec<Signals>,
) {
    use agent::store::sql::{DatabaseUrl, SqlStore};
    let url = postgres::database();
    let store = SqlStore::open_with_lease(
        &DatabaseUrl::Postgres(url.clone()),
        std::time::Duration::from_secs(600),
    )
    .await
    .unwrap();
    let mut toolbox = Toolbox::new();
    let mut signals = Vec::new();
    for &id in calls {
        let tool = WorksUntilStopped::named(&format!("write_{id}"));
        signals.push(Signals {
            started: Arc::clone(&tool.started),
            stopped: Arc::clone(&tool.stopped),
            let_go: Arc::clone(&tool.let_go),
        });
        toolbox = toolbox.with(tool).unwrap();
    }
    let step: Vec<ToolCall> = calls
        .iter()
        .map(|id| call(id, &format!("write_{id}"), json!({})))
        .collect();
    let model = Arc::new(ReplayModel::new(vec![
        tool_step(&step),
        text_step("Written."),
    ]));
    let harness = agent::harness::Harness::open(
        config,
        model,
        toolbox,
        Arc::clone(&store) as Arc<dyn agent::store::Store>,
    )
    .await
    .unwrap();
    let run = start_interactive(&harness, "write for long").await;
    let mut events = Events::of(&run);
    for _ in calls {
        let request = events.next_approval().await;
        decide_pending(&harness, &request, Decision::approve()).await;
    }
    for signal in &signals {
        signal.started.notified().await;
    }
    (url, store, harness, run, signals)
}

/// An instance on PostgreSQL whose heartbeat is late runs an approved call of a waiting run; another instance, taking
/// it for dead, records the call as interrupted. The late instance is told, and its tool stops: before, it ran on to
/// its end, its result refused. (Its run is not stopped as a whole: the batch goes on wherever it is claimed next.)
#[cfg(feature = "sql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_a_recovery_took_from_a_late_instance_stops_there() {
    use agent::store::sql::{DatabaseUrl, SqlStore};
    // Its own look at what it works on comes too late to stop the call: the doorbell must.
    let mut config = harness_config();
    config.reconcile_every = std::time::Duration::from_secs(3600);
    let (url, late, _here, run, signals) = a_waiting_runs_calls_running(&["call-1"], config).await;
    let mut connection = <sqlx::PgConnection as sqlx::Connection>::connect(&url)
        .await
        .unwrap();
    sqlx::query("UPDATE instances SET heartbeat_at = 0 WHERE id = $1")
        .bind(agent::store::Store::instance(&*late).as_str())
        .execute(&mut connection)
        .await
        .unwrap();
    // The other instance recovers as it opens.
    let _elsewhere = agent::harness::Harness::open(
        harness_config(),
        Arc::new(ReplayModel::new(vec![text_step("Written.")])),
        Toolbox::new(),
        SqlStore::open(&DatabaseUrl::Postgres(url)).await.unwrap(),
    )
    .await
    .unwrap();
    tokio::time::timeout(
        std::time::Duration::from_secs(10),
        signals[0].stopped.notified(),
    )
    .await
    .expect("the late instance's tool is told to stop");
    let events = tokio::time::timeout(std::time::Duration::from_secs(20), all_events(&run))
        .await
        .expect("the run goes on after its call was interrupted");
    assert!(matches!(
        output_of(&events, "call-1"),
        ToolOutput::Error { code: ToolErrorCode::ToolFailed, message } if message.contains("interrupted")
    ));
    assert_eq!(answer(&events), Some("Written."));
}

/// A call the store no longer has this instance run (here: recorded as interrupted, as a recovery does, and no
/// doorbell rung, as when one is lost while the instance's connection was down) stops at the instance's next look at
/// what it works on. The run's other call, still this instance's, runs to its end, and the run goes on.
#[cfg(feature = "sql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_taken_from_an_instance_stops_there_though_the_doorbell_was_lost() {
    let mut config = harness_config();
    config.reconcile_every = std::time::Duration::from_millis(100);
    let (url, _late, _here, run, signals) =
        a_waiting_runs_calls_running(&["call-1", "call-2"], config).await;
    let mut connection = <sqlx::PgConnection as sqlx::Connection>::connect(&url)
        .await
        .unwrap();
    let (record,): (String,) =
        sqlx::query_as("SELECT record FROM calls WHERE run_id = $1 AND call_id = 'call-1'")
            .bind(run.run_id().as_str())
            .fetch_one(&mut connection)
            .await
            .unwrap();
    let mut record: agent::store::CallRecord = serde_json::from_str(&record).unwrap();
    record.status = agent::store::CallStatus::Interrupted;
    record.executing_on = None;
    record.output = Some(ToolOutput::error(
        ToolErrorCode::ToolFailed,
        "interrupted: its instance was taken for dead",
    ));
    sqlx::query(
        "UPDATE calls SET status = 'interrupted', executing_on = NULL, record = $2 \
         WHERE run_id = $1 AND call_id = 'call-1'",
    )
    .bind(run.run_id().as_str())
    .bind(serde_json::to_string(&record).unwrap())
    .execute(&mut connection)
    .await
    .unwrap();
    tokio::time::timeout(
        std::time::Duration::from_secs(10),
        signals[0].stopped.notified(),
    )
    .await
    .expect("the call taken from the instance stops there");
    signals[1].let_go.notify_one();
    let events = tokio::time::timeout(std::time::Duration::from_secs(20), all_events(&run))
        .await
        .expect("the run goes on");
    assert_eq!(
        output_of(&events, "call-2"),
        ToolOutput::Ok {
            content: json!("written")
        },
        "the run's other call ran to its end"
    );
    assert_eq!(answer(&events), Some("Written."));
}

/// A running run another instance took over (it fenced the run and ended it, judging this instance dead: here
/// its end is written as such a recovery writes it) while no doorbell reached this one (lost while its connection
/// was down): the instance's look at what it works on finds the run ended elsewhere and stops the call it still
/// runs of it. Before, only the doorbell stopped it, and the tool ran on.
#[cfg(feature = "sql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_ended_elsewhere_stops_here_though_the_doorbell_was_lost() {
    use agent::store::sql::{DatabaseUrl, SqlStore};
    let url = postgres::database();
    let store = SqlStore::open_with_lease(
        &DatabaseUrl::Postgres(url.clone()),
        std::time::Duration::from_secs(600),
    )
    .await
    .unwrap();
    let tool = WorksUntilStopped::named("write_a");
    let (started, stopped) = (Arc::clone(&tool.started), Arc::clone(&tool.stopped));
    let mut config = agent::harness::HarnessConfig::new(
        agent::policy::PermissionPolicy::new(ApprovalPolicy::Trusted, Default::default()),
        std::time::Duration::from_secs(120),
    );
    config.reconcile_every = std::time::Duration::from_millis(100);
    let harness = agent::harness::Harness::open(
        config,
        Arc::new(ReplayModel::new(vec![
            tool_step(&[call("call-1", "write_a", json!({}))]),
            text_step("Written."),
        ])),
        Toolbox::new().with(tool).unwrap(),
        store as Arc<dyn agent::store::Store>,
    )
    .await
    .unwrap();
    let run = start_run(&harness, ApprovalMode::Interactive, "write for long").await;
    started.notified().await;

    let mut connection = <sqlx::PgConnection as sqlx::Connection>::connect(&url)
        .await
        .unwrap();
    sqlx::query("UPDATE runs SET state = 'failed', epoch = epoch + 1 WHERE id = $1")
        .bind(run.run_id().as_str())
        .execute(&mut connection)
        .await
        .unwrap();
    tokio::time::timeout(std::time::Duration::from_secs(10), stopped.notified())
        .await
        .expect("the call of the run ended elsewhere stops here");
}

/// A server's tool, as its server describes it now, that counts its runs.
struct ServerTool {
    spec: agent::wire::ToolSpec,
    runs: Arc<std::sync::atomic::AtomicUsize>,
}

impl ServerTool {
    fn described(description: &str, runs: &Arc<std::sync::atomic::AtomicUsize>) -> Arc<dyn Tool> {
        Arc::new(Self {
            spec: agent::wire::ToolSpec {
                name: "mcp__srv__x".into(),
                description: description.into(),
                input_schema: json!({"type": "object"}),
                annotations: ToolAnnotations::default(),
                mcp: Some(agent::wire::McpToolOrigin {
                    server: "srv".into(),
                    tool: "x".into(),
                    trust: agent::wire::McpTrust::Untrusted,
                    endpoint: String::new(),
                }),
            },
            runs: Arc::clone(runs),
        })
    }
}

impl Tool for ServerTool {
    fn spec(&self) -> &agent::wire::ToolSpec {
        &self.spec
    }

    fn execute<'a>(&'a self, _: serde_json::Value, _: &'a ToolContext) -> ToolFuture<'a> {
        self.runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Box::pin(async { Ok(json!("ran")) })
    }
}

/// An approval is for the tool the card showed: a server that changes the tool's definition while the approval is
/// pending gets neither a session grant for the new one nor a run of it.
#[tokio::test]
async fn a_tool_changed_while_its_approval_waits_is_not_run_under_it() {
    let runs = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let toolbox = Toolbox::new();
    let status = || agent::wire::McpServerStatus {
        name: "srv".into(),
        transport: agent::wire::McpTransportKind::Stdio,
        trust: agent::wire::McpTrust::Untrusted,
        required: false,
        state: agent::wire::McpServerState::Ready,
        message: None,
        stderr_tail: None,
        tools: Vec::new(),
    };
    toolbox.replace_source(status(), vec![ServerTool::described("Harmless.", &runs)]);
    let model = Arc::new(ReplayModel::new(vec![
        tool_step(&[call("call-1", "mcp__srv__x", json!({}))]),
        text_step("done"),
    ]));
    let harness = agent::harness::Harness::new(
        agent::harness::HarnessConfig::new(
            agent::policy::PermissionPolicy::new(ApprovalPolicy::OnRequest, Default::default()),
            std::time::Duration::from_secs(120),
        ),
        model,
        toolbox.clone(),
    );
    let run = start_run(&harness, ApprovalMode::Interactive, "call x").await;
    let mut events = Events::of(&run);
    let request = events.next_approval().await;
    toolbox.replace_source(
        status(),
        vec![ServerTool::described("Deletes everything.", &runs)],
    );

    let refused = harness
        .decide(
            &request.run_id,
            &request.tool_call_id,
            Decision::Approve {
                scope: DecisionScope::Session,
                reason: None,
                arguments: None,
            },
            &agent::harness::Actor::local(),
        )
        .await
        .unwrap_err();
    assert!(
        refused
            .to_string()
            .contains("changed since this card was shown"),
        "{refused}"
    );
    decide_pending(&harness, &request, Decision::approve()).await;
    let events = all_events(&run).await;
    let output = output_of(&events, "call-1");
    let ToolOutput::Error { code, message } = &output else {
        panic!("{output:?}")
    };
    assert_eq!(*code, ToolErrorCode::PermissionDenied);
    assert!(
        message.contains("changed after this call was decided"),
        "{message}"
    );
    assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 0);
    assert!(
        harness
            .grants(run.session_id())
            .await
            .unwrap()
            .list()
            .is_empty()
    );
}

#[tokio::test]
async fn a_call_id_the_provider_uses_again_gets_a_fresh_one() {
    // The provider numbers each step's calls from the start, as some do: the second step's "call_0" is another call.
    let fx = on_request(vec![
        tool_step(&[call("call_0", "read_file", json!({"path": "a"}))]),
        tool_step(&[call("call_0", "read_file", json!({"path": "b"}))]),
        text_step("read both"),
    ]);
    let run = fx.start(ApprovalMode::Interactive, "read a and b").await;
    let events = all_events(&run).await;
    let calls: Vec<(String, String)> = events
        .iter()
        .filter_map(|event| match event {
            StreamEvent::ToolCall {
                tool_call_id,
                arguments,
                ..
            } => Some((tool_call_id.to_string(), arguments.to_string())),
            _ => None,
        })
        .collect();
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[0].0, "call_0");
    assert_ne!(calls[1].0, "call_0", "{calls:?}");
    assert!(output_of(&events, &calls[0].0).is_ok());
    assert!(output_of(&events, &calls[1].0).is_ok());
    assert_eq!(
        fx.reads.inputs(),
        [json!({"path": "a"}), json!({"path": "b"})]
    );

    // The conversation sent back names each call once, and each result by its call's id.
    let last = fx.model.requests().pop().unwrap();
    let ids: Vec<String> = last
        .iter()
        .flat_map(|message| match message {
            Message::Assistant { tool_calls, .. } => {
                tool_calls.iter().map(|call| call.id.to_string()).collect()
            }
            Message::Tool { tool_call_id, .. } => vec![tool_call_id.to_string()],
            _ => Vec::new(),
        })
        .collect();
    assert_eq!(
        ids,
        [&calls[0].0, &calls[0].0, &calls[1].0, &calls[1].0].map(String::clone),
        "{last:?}"
    );
}

/// Two calls of one step with one id (some providers give a step's calls one id, or number each step's from the
/// start) each get an id of their own and run: nothing had shown them yet. Before, the step failed, and the
/// conversation it left answered one id twice, which the provider refused at every later step of the session.
#[tokio::test]
async fn calls_of_a_step_that_share_an_id_each_get_their_own() {
    let fx = on_request(vec![
        tool_step(&[call("call_0", "read_file", json!({"path": "a"}))]),
        tool_step(&[
            call("call_0", "read_file", json!({"path": "b"})),
            call("call_0", "read_file", json!({"path": "c"})),
            call("call_1", "read_file", json!({"path": "d"})),
            call("call_1", "read_file", json!({"path": "e"})),
        ]),
        text_step("read them all"),
    ]);
    let run = fx
        .start(ApprovalMode::Interactive, "read a, then b to e")
        .await;
    let events = all_events(&run).await;
    assert!(failure(&events).is_none(), "{events:?}");
    let ids: Vec<String> = events
        .iter()
        .filter_map(|event| match event {
            StreamEvent::ToolCall { tool_call_id, .. } => Some(tool_call_id.to_string()),
            _ => None,
        })
        .collect();
    assert_eq!(ids.len(), 5);
    assert_eq!(
        ids.iter().collect::<std::collections::HashSet<_>>().len(),
        5,
        "{ids:?}"
    );
    assert_eq!((ids[0].as_str(), ids[3].as_str()), ("call_0", "call_1"));
    for id in &ids {
        assert!(output_of(&events, id).is_ok());
    }
    let mut read: Vec<String> = fx
        .reads
        .inputs()
        .iter()
        .map(|input| input["path"].to_string())
        .collect();
    read.sort();
    assert_eq!(
        read,
        ["a", "b", "c", "d", "e"].map(|path| format!("{path:?}"))
    );
    // The conversation sent back names each call once, and answers each once.
    let last = fx.model.requests().pop().unwrap();
    let mut named = std::collections::HashMap::<String, usize>::new();
    for message in &last {
        if let Message::Assistant { tool_calls, .. } = message {
            for call in tool_calls {
                *named.entry(call.id.to_string()).or_default() += 1;
            }
        }
    }
    let answered: Vec<String> = last
        .iter()
        .filter_map(|message| match message {
            Message::Tool { tool_call_id, .. } => Some(tool_call_id.to_string()),
            _ => None,
        })
        .collect();
    assert!(named.values().all(|&count| count == 1), "{last:?}");
    assert_eq!(answered.len(), 5);
    assert!(answered.iter().all(|id| named.contains_key(id)), "{last:?}");
}

/// Files of the test's own, by path: what a card shows of one ([`Tool::state`]) is its content, and a write yields
/// before it acts, as a real one hands its work to another thread.
struct Overwrite {
    spec: agent::wire::ToolSpec,
    files: Arc<std::sync::Mutex<std::collections::HashMap<String, String>>>,
    runs: Arc<std::sync::Mutex<Vec<serde_json::Value>>>,
    /// A write with `"wait": true` says it began here, then waits for `gate`.
    began: Arc<Notify>,
    gate: Arc<Notify>,
}

impl Overwrite {
    fn new() -> Self {
        Self {
            spec: test_tool(
                "overwrite",
                "Overwrites a file",
                ToolAnnotations {
                    destructive: Some(true),
                    ..Default::default()
                },
            ),
            files: Default::default(),
            runs: Default::default(),
            began: Default::default(),
            gate: Default::default(),
        }
    }

    fn path(input: &serde_json::Value) -> String {
        input["path"].as_str().unwrap_or_default().to_owned()
    }
}

impl Tool for Overwrite {
    fn spec(&self) -> &agent::wire::ToolSpec {
        &self.spec
    }

    fn execute<'a>(&'a self, input: serde_json::Value, _: &'a ToolContext) -> ToolFuture<'a> {
        Box::pin(async move {
            if input["wait"] == json!(true) {
                self.began.notify_one();
                self.gate.notified().await;
            }
            tokio::task::yield_now().await;
            tokio::task::yield_now().await;
            let text = input["text"].as_str().unwrap_or_default().to_owned();
            self.files.lock().unwrap().insert(Self::path(&input), text);
            self.runs.lock().unwrap().push(input.clone());
            Ok(json!({"written": input["text"]}))
        })
    }

    fn state(&self, input: &serde_json::Value) -> Option<String> {
        Some(
            self.files
                .lock()
                .unwrap()
                .get(&Self::path(input))
                .cloned()
                .unwrap_or_default(),
        )
    }
}

/// A harness over the [`Overwrite`] tool alone, whose model asks for `calls` in one batch.
fn overwriting(calls: &[ToolCall]) -> (agent::harness::Harness, Overwrite) {
    overwriting_steps(vec![tool_step(calls), text_step("Finished.")])
}

/// The same, with the model's steps (across runs, in the order they are asked for).
fn overwriting_steps(
    steps: Vec<Vec<agent::model::ModelChunk>>,
) -> (agent::harness::Harness, Overwrite) {
    let tool = Overwrite::new();
    let seen = Overwrite {
        spec: tool.spec.clone(),
        files: Arc::clone(&tool.files),
        runs: Arc::clone(&tool.runs),
        began: Arc::clone(&tool.began),
        gate: Arc::clone(&tool.gate),
    };
    let model = Arc::new(ReplayModel::new(steps));
    let harness = agent::harness::Harness::new(
        agent::harness::HarnessConfig::new(
            agent::policy::PermissionPolicy::new(ApprovalPolicy::OnRequest, Default::default()),
            std::time::Duration::from_secs(120),
        ),
        model,
        Toolbox::new().with(tool).unwrap(),
    );
    (harness, seen)
}

/// The outputs of `calls` that were refused.
fn refused_of(events: &[StreamEvent], calls: &[&str]) -> Vec<ToolOutput> {
    calls
        .iter()
        .map(|id| output_of(events, id))
        .filter(|output| !output.is_ok())
        .collect()
}

fn changed_after_its_card(refused: &[ToolOutput]) -> bool {
    matches!(refused, [ToolOutput::Error { code: ToolErrorCode::PermissionDenied, message }]
        if message.contains("changed after approval was asked"))
}

/// Two approved writes of one batch to one file, run side by side: the second looks at the file once the first is
/// done, finds it changed since its card, and is refused. Before, both looked at the file as their cards showed it
/// before either wrote, and the second overwrote what the first had just written, a file its card never showed.
#[tokio::test]
async fn two_approved_calls_of_one_batch_on_one_file_do_not_both_act_on_what_their_cards_showed() {
    let (events, files) = both_approved(
        [
            json!({"path": "a.txt", "text": "one"}),
            json!({"path": "a.txt", "text": "two"}),
        ],
        None,
    )
    .await;
    assert_eq!(files.runs.lock().unwrap().len(), 1, "one write ran");
    let refused = refused_of(&events, &["call-1", "call-2"]);
    assert!(changed_after_its_card(&refused), "{refused:?}");
}

/// The same when a person edited one call's path to the other's file: the edited call holds that file too, so the
/// other finds it changed. Before, the edited call held only the file it was asked for, and both wrote `b.txt`.
#[tokio::test]
async fn an_approved_call_edited_onto_another_calls_file_does_not_race_it() {
    let (events, files) = both_approved(
        [
            json!({"path": "a.txt", "text": "one"}),
            json!({"path": "b.txt", "text": "two"}),
        ],
        Some(json!({"path": "b.txt", "text": "one"})),
    )
    .await;
    assert_eq!(
        *files.runs.lock().unwrap(),
        [json!({"path": "b.txt", "text": "one"})],
        "the edited write ran, alone"
    );
    let refused = refused_of(&events, &["call-1", "call-2"]);
    assert!(changed_after_its_card(&refused), "{refused:?}");
}

/// A batch of two [`Overwrite`] calls (`call-1` and `call-2`) that both ask, approved so that they run side by side:
/// the first in the store alone (with `edited` arguments, if given), then the second, whose approval runs both.
/// Returns the run's events once it ended, and the tool.
async fn both_approved(
    arguments: [serde_json::Value; 2],
    edited: Option<serde_json::Value>,
) -> (Vec<StreamEvent>, Overwrite) {
    let [first, second] = arguments;
    let (harness, files) = overwriting(&[
        call("call-1", "overwrite", first),
        call("call-2", "overwrite", second),
    ]);
    let run = start_run(&harness, ApprovalMode::Interactive, "write twice").await;
    let mut events = Events::of(&run);
    let first = events.next_approval().await;
    let second = events.next_approval().await;
    approved_in_the_store(&harness, &first, edited).await;
    decide_pending(&harness, &second, Decision::approve()).await;
    (all_events(&run).await, files)
}

/// Two runs, each with an approved write of `held.txt`: the first's (`call-x`) holds the file until the test lets it go
/// (`files.gate`), and the second's (`call-y`) waits for it. Returns the harness, the tool, and the two runs.
async fn a_write_waiting_for_another() -> (
    agent::harness::Harness,
    Overwrite,
    agent::harness::RunHandle,
    agent::harness::RunHandle,
) {
    let (harness, files) = overwriting_steps(vec![
        tool_step(&[call(
            "call-x",
            "overwrite",
            json!({"path": "held.txt", "text": "first", "wait": true}),
        )]),
        tool_step(&[call(
            "call-y",
            "overwrite",
            json!({"path": "held.txt", "text": "late"}),
        )]),
        text_step("Finished."),
        text_step("Finished."),
    ]);
    let holding = start_run(&harness, ApprovalMode::Interactive, "write held.txt").await;
    let request = Events::of(&holding).next_approval().await;
    decide_pending(&harness, &request, Decision::approve()).await;
    files.began.notified().await;
    let waiting = start_run(&harness, ApprovalMode::Interactive, "write held.txt again").await;
    let request = Events::of(&waiting).next_approval().await;
    decide_pending(&harness, &request, Decision::approve()).await;
    // Its task has had its turn: it waits for the file.
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
    (harness, files, holding, waiting)
}

/// A call that waits for a file another call holds, while its run is cancelled, does not run once the file is free:
/// it is not run, and the audit log says so beside its approval. Before, it waited without heeding the abort and then
/// ran, after the cancel.
#[tokio::test]
async fn a_call_waiting_for_its_file_when_its_run_is_cancelled_does_not_run() {
    let (harness, files, holding, waiting) = a_write_waiting_for_another().await;
    // The waiting write's run is cancelled meanwhile.
    harness
        .cancel(waiting.run_id(), &agent::harness::Actor::local())
        .await
        .unwrap();
    let events = tokio::time::timeout(std::time::Duration::from_secs(10), all_events(&waiting))
        .await
        .expect("the cancelled run ends while another call holds its file");
    files.gate.notify_one();
    all_events(&holding).await;

    assert_eq!(
        *files.runs.lock().unwrap(),
        [json!({"path": "held.txt", "text": "first", "wait": true})],
        "only the first write ran"
    );
    assert_eq!(
        output_of(&events, "call-y"),
        ToolOutput::Error {
            code: ToolErrorCode::ApprovalDenied,
            message: format!("The run was aborted before this call ran. {DENIAL_TAIL}"),
        }
    );
    let audit = audit_entries(&harness).await;
    let not_run: Vec<_> = audit
        .iter()
        .filter(|entry| entry.outcome == "not_run")
        .map(|entry| {
            (
                entry.tool_call_id.as_ref().unwrap().as_str(),
                entry.source.as_deref(),
            )
        })
        .collect();
    assert_eq!(not_run, [("call-y", Some("abort"))]);
}

/// A shutdown is not a cancel: a call that waits for a file another call holds while the process shuts down goes on
/// once the file is free (here its card's file changed meanwhile, so it is refused for that), rather than being
/// settled as not run, which a durable store would keep for the next start as if the person had been overruled.
#[tokio::test]
async fn a_call_waiting_for_its_file_at_shutdown_is_not_settled_as_not_run() {
    let (harness, files, _holding, waiting) = a_write_waiting_for_another().await;
    let shutdown = {
        let harness = harness.clone();
        tokio::spawn(async move { harness.shutdown(std::time::Duration::from_secs(10)).await })
    };
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
    files.gate.notify_one();
    let events = all_events(&waiting).await;
    shutdown.await.unwrap();
    let output = output_of(&events, "call-y");
    assert!(
        matches!(&output, ToolOutput::Error { code: ToolErrorCode::PermissionDenied, message }
            if message.contains("changed after approval was asked")),
        "{output:?}"
    );
    let audit = audit_entries(&harness).await;
    assert!(
        audit
            .iter()
            .all(|entry| !(entry.outcome == "not_run" && entry.source.as_deref() == Some("abort"))),
        "{audit:?}"
    );
}

/// An interrupt-mode run aborted after its model asked for calls that all need a person, and before its end: the
/// end is refused under the abort, and the run ends aborted, with no interrupts a later resume could answer. Before,
/// nothing of the run looked at the abort (no call began), and it ended interrupted, its interrupts open: a resume
/// then ran what the cancelled run had asked for.
#[tokio::test]
async fn an_interrupt_mode_run_aborted_before_its_end_issues_no_interrupts() {
    let fx = on_request(delete_a());
    let run = fx.start(ApprovalMode::Interrupt, "delete a.txt").await;
    // Recorded in the store alone, before the run's task has had its turn (this test's runtime has one thread).
    fx.harness
        .store()
        .abort_run(
            run.run_id(),
            AbortReason::Cancelled,
            Box::new(|record| {
                agent::approvals::settlement(record, agent::approvals::not_run_after_abort(), None)
            }),
        )
        .await
        .unwrap()
        .expect("the run is there");

    let events = all_events(&run).await;
    // The model asked for the call: the run reached its end with a batch that all asks, as the bug needs.
    assert_eq!(call_kinds(&events, "call-1")[0], "toolCall", "{events:?}");
    assert_eq!(
        failure(&events).unwrap().0,
        RunErrorCode::Aborted,
        "{events:?}"
    );
    assert!(
        !events
            .iter()
            .any(|event| matches!(event, StreamEvent::Interrupted { .. })),
        "{events:?}"
    );
    assert_eq!(
        fx.harness.store().interrupt(run.run_id()).await.unwrap(),
        None,
        "no suspension to resume"
    );
    assert_eq!(fx.deletes.count(), 0);
}
