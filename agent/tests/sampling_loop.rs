//! The seed's sampling-loop tests, and the loop's own guarantees: batches, parallel approvals, the repeated-call
//! guard, the step limit and aborts.

mod support;

use std::sync::Arc;

use agent::agent_loop::{LoopLimits, run_loop};
use agent::events::AgentEvent;
use agent::model::{ModelChunk, ScriptedModel};
use agent::runtime::AbortReason;
use agent::wire::{
    ApprovalMode, ApprovalPolicy, Decision, Message, RunErrorCode, ToolErrorCode, ToolOutput,
};
use serde_json::json;
use support::*;

fn limits() -> LoopLimits {
    LoopLimits::default()
}

#[tokio::test]
async fn resumes_the_loop_after_an_interactive_approval_is_granted() {
    let mut fx = interactive();
    let model = Arc::new(ReplayModel::new(vec![
        tool_step(&[call("call-1", "delete_file", json!({"path": "a.txt"}))]),
        text_step("Deleted a.txt."),
    ]));
    let context = fx.context.clone();
    let loop_model = Arc::clone(&model);
    let run = tokio::spawn(async move {
        run_loop(&*loop_model, &context, limits(), &[], "delete a.txt").await
    });

    let call_id = next_approval(&mut fx.events).await;
    fx.registry
        .resolve(&fx.context.run_id, &call_id, Decision::approve())
        .unwrap();
    let outcome = run.await.unwrap();

    assert_eq!(outcome.answer(), Some("Deleted a.txt."));
    assert_eq!(outcome.steps, 2);
    assert_eq!(fx.deletes.count(), 1);
    let second_request = &model.requests()[1];
    let results = tool_results(second_request);
    assert_eq!(results.len(), 1);
    assert!(results[0].1.is_ok(), "the model saw the tool's output");
    assert!(matches!(
        drain(&mut fx.events).last(),
        Some(AgentEvent::RunFinished { steps: 2, .. })
    ));
}

#[tokio::test]
async fn resumes_the_loop_with_a_recoverable_error_after_an_interactive_denial() {
    let mut fx = interactive();
    let model = Arc::new(ReplayModel::new(vec![
        tool_step(&[call("call-1", "delete_file", json!({"path": "a.txt"}))]),
        text_step("I left a.txt alone."),
    ]));
    let context = fx.context.clone();
    let loop_model = Arc::clone(&model);
    let run = tokio::spawn(async move {
        run_loop(&*loop_model, &context, limits(), &[], "delete a.txt").await
    });

    let call_id = next_approval(&mut fx.events).await;
    fx.registry
        .resolve(
            &fx.context.run_id,
            &call_id,
            Decision::Deny {
                reason: Some("not today".into()),
            },
        )
        .unwrap();
    let outcome = run.await.unwrap();

    assert_eq!(outcome.answer(), Some("I left a.txt alone."));
    assert_eq!(fx.deletes.count(), 0);
    let results = tool_results(&model.requests()[1]);
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
    let mut fx = fixture(
        ApprovalMode::default(),
        ApprovalPolicy::default(),
        rules(""),
    );
    assert_eq!(
        fx.context.approval_mode,
        ApprovalMode::FailClosed,
        "fail-closed is the default"
    );
    // A batch with a safe call and a risky one: nothing in it runs.
    let model = ReplayModel::new(vec![tool_step(&[
        call("call-1", "read_file", json!({"path": "a.txt"})),
        call("call-2", "delete_file", json!({"path": "a.txt"})),
    ])]);
    let outcome = run_loop(&model, &fx.context, limits(), &[], "read then delete").await;

    let error = outcome.error().cloned().unwrap();
    assert_eq!(error.code(), RunErrorCode::ApprovalRequired);
    assert!(
        error
            .to_string()
            .contains("delete_file needs approval (delete_file is destructive.)")
    );
    assert_eq!(
        fx.reads.count(),
        0,
        "the batch is refused before any of it runs"
    );
    assert_eq!(fx.deletes.count(), 0);
    assert!(fx.registry.is_empty());
    assert!(matches!(
        drain(&mut fx.events).last(),
        Some(AgentEvent::RunFailed {
            code: RunErrorCode::ApprovalRequired,
            ..
        })
    ));
    // The conversation stays valid for the next run: every call is answered.
    let answered = outcome
        .messages
        .iter()
        .filter(|m| matches!(m, Message::Tool { .. }))
        .count();
    assert_eq!(answered, 2);
}

#[tokio::test]
async fn parallel_approvals_resolve_independently() {
    let mut fx = interactive();
    let model = Arc::new(ReplayModel::new(vec![
        tool_step(&[
            call("call-a", "delete_file", json!({"path": "a.txt"})),
            call("call-b", "delete_file", json!({"path": "b.txt"})),
            call("call-c", "read_file", json!({"path": "c.txt"})),
        ]),
        text_step("done"),
    ]));
    let context = fx.context.clone();
    let loop_model = Arc::clone(&model);
    let run =
        tokio::spawn(async move { run_loop(&*loop_model, &context, limits(), &[], "x").await });

    let first = next_approval(&mut fx.events).await;
    let second = next_approval(&mut fx.events).await;
    assert_eq!(fx.registry.pending(None).len(), 2, "both wait at once");
    // The read-only call did not wait for either of them.
    assert_eq!(fx.reads.count(), 1);
    // Decide the second first, then the first: each resolves on its own.
    fx.registry
        .resolve(&fx.context.run_id, &second, Decision::deny())
        .unwrap();
    assert_eq!(fx.registry.pending(None).len(), 1);
    fx.registry
        .resolve(&fx.context.run_id, &first, Decision::approve())
        .unwrap();
    let outcome = run.await.unwrap();

    assert_eq!(outcome.answer(), Some("done"));
    assert_eq!(fx.deletes.inputs(), vec![json!({"path": "a.txt"})]);
    let results = tool_results(&model.requests()[1]);
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
    let fx = fixture(
        ApprovalMode::Interactive,
        ApprovalPolicy::Trusted,
        rules(""),
    );
    let same = || tool_step(&[call("c", "read_file", json!({"path": "a.txt"}))]);
    let model = ReplayModel::new(vec![same(), same(), same(), same(), same(), same()]);
    let outcome = run_loop(&model, &fx.context, limits(), &[], "loop").await;

    assert_eq!(
        outcome.error().cloned().unwrap().code(),
        RunErrorCode::RepeatedCall
    );
    assert_eq!(fx.reads.count(), 2, "the same call runs at most twice");
    let requests = model.requests();
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
async fn the_loop_stops_at_the_step_limit() {
    let fx = fixture(
        ApprovalMode::Interactive,
        ApprovalPolicy::Trusted,
        rules(""),
    );
    let steps = (0..5)
        .map(|i| {
            tool_step(&[call(
                &format!("c{i}"),
                "read_file",
                json!({"path": format!("{i}.txt")}),
            )])
        })
        .collect();
    let model = ReplayModel::new(steps);
    let limits = LoopLimits {
        max_steps: 3,
        ..LoopLimits::default()
    };
    let outcome = run_loop(&model, &fx.context, limits, &[], "go").await;
    assert_eq!(
        outcome.error().cloned().unwrap().code(),
        RunErrorCode::StepLimit
    );
    assert_eq!(outcome.steps, 3);
    assert_eq!(fx.reads.count(), 3);
}

#[tokio::test]
async fn aborting_while_waiting_ends_the_run_and_nothing_runs_after() {
    let mut fx = interactive();
    let model = Arc::new(ReplayModel::new(vec![
        tool_step(&[call("call-1", "delete_file", json!({"path": "a.txt"}))]),
        text_step("should not be reached"),
    ]));
    let context = fx.context.clone();
    let loop_model = Arc::clone(&model);
    let run =
        tokio::spawn(async move { run_loop(&*loop_model, &context, limits(), &[], "x").await });
    next_approval(&mut fx.events).await;
    fx.context.abort.abort(AbortReason::Disconnected);
    let outcome = run.await.unwrap();

    let error = outcome.error().cloned().unwrap();
    assert_eq!(error.code(), RunErrorCode::Aborted);
    assert_eq!(
        error.to_string(),
        "The client disconnected, so the run was aborted."
    );
    assert_eq!(fx.deletes.count(), 0);
    assert_eq!(model.requests().len(), 1, "the model is not asked again");
    assert!(fx.registry.is_empty());
}

#[tokio::test]
async fn the_scripted_model_runs_a_whole_conversation_offline() {
    let dir = tempfile::tempdir().unwrap();
    let workspace = agent::tools::Workspace::open(dir.path()).unwrap();
    let mut fx = interactive();
    fx.context.toolbox = Arc::new(agent::tools::workspace_tools(
        &workspace,
        Default::default(),
    ));
    let model = ScriptedModel::new();
    let context = fx.context.clone();
    let run = tokio::spawn(async move {
        run_loop(
            &model,
            &context,
            limits(),
            &[],
            "write notes.txt: hello and list files",
        )
        .await
    });
    let call_id = next_approval(&mut fx.events).await;
    fx.registry
        .resolve(&fx.context.run_id, &call_id, Decision::approve())
        .unwrap();
    let outcome = run.await.unwrap();
    let answer = outcome.answer().unwrap().to_owned();
    assert!(
        answer.contains("write_file wrote 5 bytes to notes.txt."),
        "{answer}"
    );
    assert!(answer.contains("list_files found"), "{answer}");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("notes.txt")).unwrap(),
        "hello"
    );
    let deltas = drain(&mut fx.events)
        .into_iter()
        .filter(|e| matches!(e, AgentEvent::TextDelta { .. }))
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
    let fx = interactive();
    let outcome = run_loop(&Broken, &fx.context, limits(), &[], "x").await;
    let error = outcome.error().cloned().unwrap();
    assert_eq!(error.code(), RunErrorCode::Model);
    assert!(error.to_string().contains("reset by peer"));
}
