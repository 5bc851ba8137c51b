//! The sampling loop's approval tests (resume after approval, recover after denial), and the loop's own
//! guarantees: batches, parallel approvals, the repeated-call guard, the step limit and aborts.

mod support;

use std::sync::Arc;

use agent::agent_loop::LoopLimits;
use agent::model::{ModelChunk, ScriptedModel};
use agent::runtime::AbortReason;
use agent::wire::{
    ApprovalMode, ApprovalPolicy, Decision, Message, RunErrorCode, StreamEvent, ToolErrorCode,
    ToolOutput,
};
use serde_json::json;
use support::*;

#[tokio::test]
async fn resumes_the_loop_after_an_interactive_approval_is_granted() {
    let fx = on_request(vec![
        tool_step(&[call("call-1", "delete_file", json!({"path": "a.txt"}))]),
        text_step("Deleted a.txt."),
    ]);
    let run = fx.start(ApprovalMode::Interactive, "delete a.txt").await;
    let request = Events::of(&run).next_approval().await;
    fx.decide(&request, Decision::approve()).await;

    let events = all_events(&run).await;
    assert_eq!(answer(&events), Some("Deleted a.txt."));
    assert!(matches!(
        events.last(),
        Some(StreamEvent::Done { steps: 2, .. })
    ));
    assert_eq!(fx.deletes.count(), 1);
    let second_request = &fx.model.requests()[1];
    let results = tool_results(second_request);
    assert_eq!(results.len(), 1);
    assert!(results[0].1.is_ok(), "the model saw the tool's output");
}

#[tokio::test]
async fn resumes_the_loop_with_a_recoverable_error_after_an_interactive_denial() {
    let fx = on_request(vec![
        tool_step(&[call("call-1", "delete_file", json!({"path": "a.txt"}))]),
        text_step("I left a.txt alone."),
    ]);
    let run = fx.start(ApprovalMode::Interactive, "delete a.txt").await;
    let request = Events::of(&run).next_approval().await;
    fx.decide(
        &request,
        Decision::Deny {
            reason: Some("not today".into()),
        },
    )
    .await;

    let events = all_events(&run).await;
    assert_eq!(answer(&events), Some("I left a.txt alone."));
    assert_eq!(fx.deletes.count(), 0);
    let results = tool_results(&fx.model.requests()[1]);
    match &results[0].1 {
        ToolOutput::Error { code, message } => {
            assert_eq!(*code, ToolErrorCode::ApprovalDenied);
            assert!(message.starts_with(
                "The user denied this tool call: not today. The action was not performed."
            ));
        }
        other => panic!("the model should see the denial, saw {other:?}"),
    }
}

#[tokio::test]
async fn risky_tools_request_approval_and_fail_closed_by_default() {
    assert_eq!(
        ApprovalMode::default(),
        ApprovalMode::FailClosed,
        "fail-closed is the default"
    );
    // A batch with a safe call and a risky one: nothing in it runs.
    let fx = on_request(vec![tool_step(&[
        call("call-1", "read_file", json!({"path": "a.txt"})),
        call("call-2", "delete_file", json!({"path": "a.txt"})),
    ])]);
    let run = fx.start(ApprovalMode::default(), "read then delete").await;
    let events = all_events(&run).await;

    let (code, message) = failure(&events).unwrap();
    assert_eq!(code, RunErrorCode::ApprovalRequired);
    assert!(message.contains("delete_file needs approval (delete_file is destructive.)"));
    assert_eq!(
        fx.reads.count(),
        0,
        "the batch is refused before any of it runs"
    );
    assert_eq!(fx.deletes.count(), 0);
    assert!(fx.pending().await.is_empty());
    // The conversation stays valid for the next run: every call is answered.
    let history = fx.harness.store().history(run.session_id()).await.unwrap();
    let answered = history
        .iter()
        .filter(|m| matches!(m, Message::Tool { .. }))
        .count();
    assert_eq!(answered, 2);
}

#[tokio::test]
async fn parallel_approvals_resolve_independently() {
    let fx = on_request(vec![
        tool_step(&[
            call("call-a", "delete_file", json!({"path": "a.txt"})),
            call("call-b", "delete_file", json!({"path": "b.txt"})),
            call("call-c", "read_file", json!({"path": "c.txt"})),
        ]),
        text_step("done"),
    ]);
    let run = fx.start(ApprovalMode::Interactive, "x").await;
    let mut events = Events::of(&run);
    let first = events.next_approval().await;
    let second = events.next_approval().await;
    assert_eq!(fx.pending().await.len(), 2, "both wait at once");
    // The read-only call does not wait for either of them.
    events
        .until(|e| matches!(e, StreamEvent::ToolResult { tool_call_id, .. } if tool_call_id.as_str() == "call-c"))
        .await;
    assert_eq!(fx.reads.count(), 1);
    // Decide the second first, then the first: each resolves on its own.
    fx.decide(&second, Decision::deny()).await;
    assert_eq!(fx.pending().await.len(), 1);
    fx.decide(&first, Decision::approve()).await;

    let events = all_events(&run).await;
    assert_eq!(answer(&events), Some("done"));
    assert_eq!(fx.deletes.inputs(), vec![json!({"path": "a.txt"})]);
    let results = tool_results(&fx.model.requests()[1]);
    let codes: Vec<Option<ToolErrorCode>> = results
        .iter()
        .map(|(_, output)| match output {
            ToolOutput::Ok { .. } => None,
            ToolOutput::Error { code, .. } => Some(*code),
        })
        .collect();
    assert_eq!(
        codes,
        [None, Some(ToolErrorCode::ApprovalDenied), None],
        "results keep the calls' order"
    );
}

#[tokio::test]
async fn the_repeated_call_guard_warns_the_model_then_ends_the_run() {
    let same = || tool_step(&[call("c", "read_file", json!({"path": "a.txt"}))]);
    let fx = fixture(
        ApprovalPolicy::Trusted,
        rules(""),
        vec![same(), same(), same(), same(), same(), same()],
    );
    let run = fx.start(ApprovalMode::Interactive, "loop").await;
    let events = all_events(&run).await;

    assert_eq!(failure(&events).unwrap().0, RunErrorCode::RepeatedCall);
    assert_eq!(fx.reads.count(), 2, "the same call runs at most twice");
    let requests = fx.model.requests();
    let last_results = tool_results(requests.last().unwrap());
    match &last_results.last().unwrap().1 {
        ToolOutput::Error { code, message } => {
            assert_eq!(*code, ToolErrorCode::RepeatedCall);
            assert!(message.contains("Do not call it again"), "{message}");
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn the_repeated_call_guard_counts_across_a_batch_that_waited_for_a_person() {
    let same = || tool_step(&[call("c", "delete_file", json!({"path": "a.txt"}))]);
    let fx = on_request(vec![same(), same(), same(), text_step("gave up")]);
    let run = fx.start(ApprovalMode::Interactive, "loop").await;
    let mut events = Events::of(&run);
    for _ in 0..2 {
        let request = events.next_approval().await;
        fx.decide(&request, Decision::approve()).await;
    }
    let events = all_events(&run).await;
    assert_eq!(fx.deletes.count(), 2, "the third identical call is refused");
    let refused = tool_results(fx.model.requests().last().unwrap());
    assert!(matches!(
        refused.last().unwrap().1,
        ToolOutput::Error {
            code: ToolErrorCode::RepeatedCall,
            ..
        }
    ));
    assert_eq!(answer(&events), Some("gave up"));
}

#[tokio::test]
async fn the_loop_stops_at_the_step_limit() {
    let steps = (0..5)
        .map(|i| {
            tool_step(&[call(
                &format!("c{i}"),
                "read_file",
                json!({"path": format!("{i}.txt")}),
            )])
        })
        .collect();
    let fx = fixture_with(
        ApprovalPolicy::Trusted,
        rules(""),
        LoopLimits {
            max_steps: 3,
            ..LoopLimits::default()
        },
        steps,
    );
    let run = fx.start(ApprovalMode::Interactive, "go").await;
    let events = all_events(&run).await;
    assert_eq!(failure(&events).unwrap().0, RunErrorCode::StepLimit);
    let steps = events
        .iter()
        .filter(|e| matches!(e, StreamEvent::Step { .. }))
        .count();
    assert_eq!(steps, 3);
    assert_eq!(fx.reads.count(), 3);
}

/// The step limit counts the steps that went on after a person decided: a run that asks at its last step ends there
/// once the batch is decided, instead of sampling past the limit, step after step, each asking again.
#[tokio::test]
async fn the_step_limit_holds_across_batches_that_waited_for_a_person() {
    let delete = |i: u32| {
        tool_step(&[call(
            &format!("c{i}"),
            "delete_file",
            json!({"path": format!("{i}.txt")}),
        )])
    };
    let fx = fixture_with(
        ApprovalPolicy::OnRequest,
        rules(""),
        LoopLimits {
            max_steps: 2,
            ..LoopLimits::default()
        },
        (0..4).map(delete).collect(),
    );
    let run = fx.start(ApprovalMode::Interactive, "go").await;
    let mut events = Events::of(&run);
    for _ in 0..2 {
        let request = events.next_approval().await;
        fx.decide(&request, Decision::approve()).await;
    }
    let events = all_events(&run).await;
    assert_eq!(failure(&events).unwrap().0, RunErrorCode::StepLimit);
    assert_eq!(fx.model.requests().len(), 2, "the model is sampled twice");
    assert_eq!(fx.deletes.count(), 2);
    assert!(fx.pending().await.is_empty());
}

#[tokio::test]
async fn aborting_while_waiting_ends_the_run_and_nothing_runs_after() {
    // At a step before the limit, and at the last step the limit allows (where the run would end at the limit once
    // the batch is decided): either way the run ends aborted.
    for max_steps in [12, 1] {
        let fx = fixture_with(
            ApprovalPolicy::OnRequest,
            rules(""),
            LoopLimits {
                max_steps,
                ..LoopLimits::default()
            },
            vec![
                tool_step(&[call("call-1", "delete_file", json!({"path": "a.txt"}))]),
                text_step("should not be reached"),
            ],
        );
        let run = fx.start(ApprovalMode::Interactive, "x").await;
        Events::of(&run).next_approval().await;
        run.abort(AbortReason::Disconnected);
        let events = all_events(&run).await;

        let (code, message) = failure(&events).unwrap();
        assert_eq!(code, RunErrorCode::Aborted, "at most {max_steps} steps");
        assert_eq!(message, "The client disconnected, so the run was aborted.");
        assert_eq!(fx.deletes.count(), 0);
        assert_eq!(fx.model.requests().len(), 1, "the model is not asked again");
        assert!(fx.pending().await.is_empty());
    }
}

#[tokio::test]
async fn the_scripted_model_runs_a_whole_conversation_offline() {
    let dir = tempfile::tempdir().unwrap();
    let workspace = agent::tools::Workspace::open(dir.path()).unwrap();
    let harness = harness_over(
        Arc::new(ScriptedModel::new()),
        agent::tools::workspace_tools(&workspace, Default::default()),
        ApprovalPolicy::OnRequest,
    );
    let run = start_interactive(&harness, "write notes.txt: hello and list files").await;
    let request = Events::of(&run).next_approval().await;
    harness
        .decide(
            &request.run_id,
            &request.tool_call_id,
            Decision::approve(),
            &agent::harness::Actor::local(),
        )
        .await
        .unwrap();
    let events = all_events(&run).await;
    let answer = answer(&events).unwrap().to_owned();
    assert!(
        answer.contains("write_file wrote 5 bytes to notes.txt."),
        "{answer}"
    );
    assert!(answer.contains("list_files found"), "{answer}");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("notes.txt")).unwrap(),
        "hello"
    );
    let deltas = events
        .iter()
        .filter(|e| matches!(e, StreamEvent::AssistantDelta { .. }))
        .count();
    assert!(deltas > 1, "the answer streams in several deltas");
}

#[tokio::test]
async fn a_model_error_ends_the_run_with_its_message() {
    struct Broken;
    impl agent::model::Model for Broken {
        fn name(&self) -> &str {
            "broken"
        }
        fn stream<'a>(
            &'a self,
            _: agent::model::ModelRequest<'a>,
        ) -> agent::model::ModelStream<'a> {
            use futures::StreamExt;
            futures::stream::iter(vec![
                Ok(ModelChunk::Text("partial".into())),
                Err(agent::model::ModelError::Connection("reset by peer".into())),
            ])
            .boxed()
        }
    }
    let harness = harness_over(
        Arc::new(Broken),
        agent::tools::Toolbox::new(),
        ApprovalPolicy::OnRequest,
    );
    let run = start_interactive(&harness, "x").await;
    let events = all_events(&run).await;
    let (code, message) = failure(&events).unwrap();
    assert_eq!(code, RunErrorCode::Model);
    assert!(message.contains("reset by peer"));
}

#[tokio::test]
async fn a_long_conversation_sends_the_model_its_newest_turns_and_says_so() {
    let fx = fixture_with(
        ApprovalPolicy::OnRequest,
        rules(""),
        LoopLimits {
            context_bytes: 400,
            ..LoopLimits::default()
        },
        (0..6)
            .map(|i| text_step(&format!("answer number {i}, {}", "x".repeat(60))))
            .collect(),
    );
    let session: agent::ids::SessionId = "long".parse().unwrap();
    let mut last = Vec::new();
    for i in 0..6 {
        let run = fx
            .harness
            .start(agent::harness::StartRun {
                message: format!("question number {i}"),
                session_id: Some(session.clone()),
                policy: None,
                mode: ApprovalMode::Interactive,
                run_id: None,
                source: agent::harness::RunSource::Session,
                refused_while_interrupted: false,
            })
            .await
            .unwrap();
        last = all_events(&run).await;
        assert!(
            answer(&last).is_some(),
            "run {i} answers whatever the conversation's length"
        );
    }
    let sent = fx.model.requests().last().unwrap().clone();
    assert!(
        matches!(&sent[0], Message::User { .. }),
        "the window starts at a turn: {sent:?}"
    );
    assert_eq!(
        sent.last(),
        Some(&Message::User {
            content: "question number 5".into()
        }),
        "the run's own message is always sent"
    );
    let history = fx.harness.store().history(&session).await.unwrap();
    assert_eq!(history.len(), 12, "the session keeps every message");
    let omitted = last
        .iter()
        .find_map(|event| match event {
            StreamEvent::ContextTrimmed {
                omitted_messages, ..
            } => Some(*omitted_messages as usize),
            _ => None,
        })
        .expect("the transcript says some turns were left out");
    // The last run's earlier conversation: the five runs before it, a question and an answer each.
    assert_eq!(omitted + sent.len() - 1, 10);
    assert!(omitted > 0);
    let view = fx
        .harness
        .run_view(&last_run_id(&last))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(view.omitted_messages, Some(omitted as u32));
}

fn last_run_id(events: &[StreamEvent]) -> agent::ids::RunId {
    match &events[0] {
        StreamEvent::RunStarted { run_id, .. } => run_id.clone(),
        other => panic!("{other:?}"),
    }
}
