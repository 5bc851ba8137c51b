//! `run_command` over HTTP: no shell unless the command names one, output bounded. (That the model key never
//! reaches its environment is proved against the real binary, in `binary.rs`: only there can the server's
//! environment hold a key without touching this test process's environment.)

use agent::wire::ApprovalPolicy;
use serde_json::{Value, json};

use crate::helpers::{TestApp, spawn_app_with};

async fn trusted() -> TestApp {
    spawn_app_with(|config| config.policy = ApprovalPolicy::Trusted).await
}

/// Runs `message` to the end and returns the first tool call's output.
async fn first_output(app: &TestApp, message: &str) -> Value {
    let response = app
        .post_json("/api/agent", &json!({"message": message}))
        .await;
    let body: Value = response.json().await.unwrap();
    body["steps"][0]["toolCalls"][0]["output"].clone()
}

#[tokio::test]
async fn shell_syntax_reaches_the_program_as_text() {
    let app = trusted().await;
    let output = first_output(&app, "run echo $HOME;id `whoami` $(id) >out.txt | cat").await;
    assert_eq!(output["status"], "ok", "{output}");
    assert_eq!(
        output["content"]["stdout"],
        "$HOME;id `whoami` $(id) >out.txt | cat\n"
    );
    assert!(!app.file("out.txt").exists(), "no redirection happened");

    // A whole command line in `command` is refused, not handed to a shell.
    let output = first_output(&app, "run \"echo hi; id\"").await;
    assert_eq!(output["status"], "error");
    assert_eq!(output["code"], "INVALID_INPUT");
}

#[tokio::test]
async fn a_shell_runs_only_when_the_command_names_one() {
    let app = trusted().await;
    let output = first_output(&app, "run sh -c 'echo $((6 * 7))'").await;
    assert_eq!(output["content"]["stdout"], "42\n", "{output}");
    assert_eq!(output["content"]["exitCode"], 0);
}

#[tokio::test]
async fn command_output_is_bounded() {
    let app = trusted().await;
    let output = first_output(&app, "run seq 1 200000").await;
    assert_eq!(output["content"]["truncated"], true, "{output}");
    assert_eq!(
        output["content"]["stdout"].as_str().unwrap().len(),
        64 * 1024
    );
    assert_eq!(
        output["content"]["exitCode"], 0,
        "the command ran to its end"
    );
}
