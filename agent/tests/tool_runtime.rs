//! The seed's `agent-approvals` tests for the tool runtime in interactive mode, and the permission paths that never
//! reach a person.

mod support;

use agent::events::AgentEvent;
use agent::runtime::{AbortReason, RunError, execute_tool_call};
use agent::wire::{
    ApprovalMode, ApprovalPolicy, Decision, DecisionScope, DenialSource, PermissionDecision,
    Resolution, ToolErrorCode, ToolOutput,
};
use serde_json::json;
use support::*;

const DENIAL_TAIL: &str = "The action was not performed. Do not retry the same call; take a different approach or explain what you need in the final answer.";

#[tokio::test]
async fn interactive_tool_runtime_executes_the_tool_after_approval() {
    let mut fx = interactive();
    let call = call("call-1", "delete_file", json!({"path": "a.txt"}));
    let execution = execute_tool_call(&call, 1, &fx.context);
    tokio::pin!(execution);
    // One poll runs the call up to its wait: the approval is registered by then, with no sleep.
    assert!(futures::poll!(&mut execution).is_pending());
    let resolved = fx
        .registry
        .resolve(&fx.context.run_id, &call.id, Decision::approve())
        .expect("the approval is pending");
    assert_eq!(resolved.pending.tool_name, "delete_file");
    assert_eq!(resolved.pending.reason, "delete_file is destructive.");

    let output = execution.await.unwrap();
    assert!(output.is_ok(), "{output:?}");
    assert_eq!(fx.deletes.inputs(), vec![json!({"path": "a.txt"})]);

    let events = drain(&mut fx.events);
    let kinds: Vec<&str> = events
        .iter()
        .map(|e| match e {
            AgentEvent::ToolCallDecided { .. } => "decided",
            AgentEvent::ApprovalRequested { .. } => "requested",
            AgentEvent::ApprovalResolved { .. } => "resolved",
            AgentEvent::ToolFinished { .. } => "finished",
            _ => "other",
        })
        .collect();
    assert_eq!(kinds, ["decided", "requested", "resolved", "finished"]);
}

#[tokio::test]
async fn interactive_tool_runtime_returns_a_recoverable_error_after_denial() {
    let fx = interactive();
    let call = call("call-1", "delete_file", json!({"path": "a.txt"}));
    let execution = execute_tool_call(&call, 1, &fx.context);
    tokio::pin!(execution);
    assert!(futures::poll!(&mut execution).is_pending());
    fx.registry
        .resolve(
            &fx.context.run_id,
            &call.id,
            Decision::Deny {
                reason: Some("keep that file".into()),
            },
        )
        .unwrap();

    let output = execution.await.expect("a denial does not end the run");
    assert_eq!(
        output,
        ToolOutput::Error {
            code: ToolErrorCode::ApprovalDenied,
            message: format!("The user denied this tool call: keep that file. {DENIAL_TAIL}"),
        }
    );
    assert_eq!(fx.deletes.count(), 0, "nothing ran");
}

#[tokio::test]
async fn interactive_tool_runtime_denies_when_the_run_aborts_while_waiting_for_approval() {
    let mut fx = interactive();
    let call = call("call-1", "delete_file", json!({"path": "a.txt"}));
    let execution = execute_tool_call(&call, 1, &fx.context);
    tokio::pin!(execution);
    assert!(futures::poll!(&mut execution).is_pending());
    fx.context.abort.abort(AbortReason::Cancelled);

    let output = execution.await.unwrap();
    assert_eq!(
        output,
        ToolOutput::Error {
            code: ToolErrorCode::ApprovalDenied,
            message: format!("The run was aborted before a decision arrived. {DENIAL_TAIL}"),
        }
    );
    assert_eq!(fx.deletes.count(), 0);
    assert!(fx.registry.is_empty(), "nothing is left pending");
    let resolved = drain(&mut fx.events).into_iter().find_map(|e| match e {
        AgentEvent::ApprovalResolved { resolution, .. } => Some(resolution),
        _ => None,
    });
    assert!(matches!(
        resolved,
        Some(Resolution::Denied {
            source: DenialSource::Abort,
            ..
        })
    ));
}

#[tokio::test(start_paused = true)]
async fn interactive_tool_runtime_denies_when_nobody_decides_in_time() {
    let fx = interactive();
    let call = call("call-1", "delete_file", json!({"path": "a.txt"}));
    let output = execute_tool_call(&call, 1, &fx.context).await.unwrap();
    assert_eq!(
        output,
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
    let fx = fixture(
        ApprovalMode::FailClosed,
        ApprovalPolicy::OnRequest,
        rules(""),
    );
    let call = call("call-1", "delete_file", json!({"path": "a.txt"}));
    let error = execute_tool_call(&call, 1, &fx.context).await.unwrap_err();
    assert_eq!(
        error,
        RunError::ApprovalRequired {
            tool_name: "delete_file".into(),
            reason: "delete_file is destructive.".into()
        }
    );
    assert!(
        error
            .to_string()
            .starts_with("delete_file needs approval (delete_file is destructive.)")
    );
    assert_eq!(fx.deletes.count(), 0);
    assert!(
        fx.registry.is_empty(),
        "fail-closed never registers an approval"
    );
}

#[tokio::test]
async fn allowed_calls_run_without_touching_the_approval_system() {
    for mode in [ApprovalMode::FailClosed, ApprovalMode::Interactive] {
        let fx = fixture(mode, ApprovalPolicy::OnRequest, rules(""));
        let output = execute_tool_call(
            &call("c", "read_file", json!({"path": "a"})),
            1,
            &fx.context,
        )
        .await
        .unwrap();
        assert!(output.is_ok());
        assert_eq!(fx.reads.count(), 1);
        assert!(fx.registry.is_empty());
    }
}

#[tokio::test]
async fn a_denying_rule_returns_permission_denied_and_never_asks() {
    for mode in [ApprovalMode::FailClosed, ApprovalMode::Interactive] {
        let fx = fixture(mode, ApprovalPolicy::Strict, rules("delete_file=deny"));
        let output = execute_tool_call(
            &call("c", "delete_file", json!({"path": "a"})),
            1,
            &fx.context,
        )
        .await
        .unwrap();
        assert_eq!(
            output,
            ToolOutput::Error {
                code: ToolErrorCode::PermissionDenied,
                message: "A rule denies delete_file.".into()
            }
        );
        assert_eq!(fx.deletes.count(), 0);
        assert!(fx.registry.is_empty());
    }
}

#[tokio::test]
async fn invalid_input_is_a_recoverable_output_and_is_never_put_to_a_person() {
    let fx = interactive();
    let cases = [
        (
            call("c1", "delete_file", json!({"nope": 1})),
            ToolErrorCode::InvalidInput,
        ),
        (
            agent::wire::ToolCall {
                id: "c2".parse().unwrap(),
                name: "delete_file".into(),
                arguments: "{\"path\": ".into(),
            },
            ToolErrorCode::InvalidArguments,
        ),
        (
            call("c3", "format_disk", json!({})),
            ToolErrorCode::UnknownTool,
        ),
    ];
    for (call, code) in cases {
        let output = execute_tool_call(&call, 1, &fx.context).await.unwrap();
        assert!(
            matches!(&output, ToolOutput::Error { code: got, .. } if *got == code),
            "{output:?}"
        );
    }
    assert_eq!(fx.deletes.count(), 0);
    assert!(fx.registry.is_empty());
}

#[tokio::test]
async fn approving_for_the_session_lets_later_calls_of_that_tool_run_without_asking() {
    let fx = interactive();
    let first = call("call-1", "delete_file", json!({"path": "a.txt"}));
    let execution = execute_tool_call(&first, 1, &fx.context);
    tokio::pin!(execution);
    assert!(futures::poll!(&mut execution).is_pending());
    fx.registry
        .resolve(
            &fx.context.run_id,
            &first.id,
            Decision::Approve {
                scope: DecisionScope::Session,
                reason: None,
                arguments: None,
            },
        )
        .unwrap();
    assert!(execution.await.unwrap().is_ok());

    let second = call("call-2", "delete_file", json!({"path": "b.txt"}));
    let output = execute_tool_call(&second, 2, &fx.context).await.unwrap();
    assert!(output.is_ok(), "ran without a decision: {output:?}");
    assert_eq!(fx.deletes.count(), 2);
    let decision = fx.context.permissions.decide(
        &fx.context.toolbox.spec("delete_file").unwrap(),
        &fx.context.grants.lock().unwrap(),
    );
    assert_eq!(
        decision,
        PermissionDecision::Allow {
            reason: "delete_file was approved for this session.".into()
        }
    );
}

#[tokio::test]
async fn approved_edited_arguments_are_what_runs() {
    let mut fx = interactive();
    let call = call("call-1", "delete_file", json!({"path": "important.txt"}));
    let execution = execute_tool_call(&call, 1, &fx.context);
    tokio::pin!(execution);
    assert!(futures::poll!(&mut execution).is_pending());
    fx.registry
        .resolve(
            &fx.context.run_id,
            &call.id,
            Decision::Approve {
                scope: DecisionScope::Once,
                reason: None,
                arguments: Some(json!({"path": "scratch.txt"})),
            },
        )
        .unwrap();
    assert!(execution.await.unwrap().is_ok());
    assert_eq!(fx.deletes.inputs(), vec![json!({"path": "scratch.txt"})]);
    let executed = drain(&mut fx.events).into_iter().find_map(|e| match e {
        AgentEvent::ToolFinished {
            executed_arguments, ..
        } => executed_arguments,
        _ => None,
    });
    assert_eq!(executed, Some(json!({"path": "scratch.txt"})));
}
