//! The real `toolgate` binary, as a user starts it: signals end it cleanly (whatever its tools are doing, and with
//! nothing left running), it refuses to listen beyond loopback without a token, it never prints the token, and the
//! commands it runs never see the model's key.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::helpers::{PATIENCE, SseStream};
use crate::process::{EXIT_WITHIN, Home, Server, toolgate};

/// With a memory store nothing can outlive the process: a signal ends every run, its approvals resolved as
/// aborted, and the streams say why.
async fn a_signal_ends_open_streams_and_the_process(signal: libc::c_int) {
    let server = Server::start(&["--database-url", "memory"], &[]).await;
    let client = reqwest::Client::new();
    let response = client
        .post(server.url("/api/agent/stream"))
        .json(&json!({"message": "delete a.txt"}))
        .send()
        .await
        .unwrap();
    let mut stream = SseStream::new(response);
    stream.until("approvalRequired").await;

    let signalled = Instant::now();
    server.signal(signal);
    let rest = stream.rest().await;
    let resolved = rest
        .iter()
        .find(|e| e.name == "approvalResolved")
        .expect("the pending approval was resolved");
    assert_eq!(resolved.data["resolution"]["source"], "abort");
    let last = rest.last().expect("events after the signal");
    assert_eq!(
        last.name, "error",
        "the stream's last event says why it ends"
    );
    assert_eq!(last.data["code"], "SHUTDOWN");
    assert_eq!(
        last.data["message"],
        "The server is shutting down, so the run was aborted."
    );

    let (status, log) = server.exit(EXIT_WITHIN).await;
    assert!(status.success(), "exit status {status:?}; log:\n{log}");
    assert!(
        signalled.elapsed() < EXIT_WITHIN,
        "took {:?}",
        signalled.elapsed()
    );
    assert!(log.contains("shutting down"), "{log}");
}

#[tokio::test]
async fn sigterm_resolves_pending_approvals_ends_streams_and_exits_zero() {
    a_signal_ends_open_streams_and_the_process(libc::SIGTERM).await;
}

#[tokio::test]
async fn sigint_resolves_pending_approvals_ends_streams_and_exits_zero() {
    a_signal_ends_open_streams_and_the_process(libc::SIGINT).await;
}

#[tokio::test]
async fn the_binary_refuses_to_listen_beyond_loopback_without_a_token() {
    let workspace = tempfile::tempdir().unwrap();
    let path = workspace.path().join("ws");
    let output = toolgate(
        &["--addr", "0.0.0.0:0", "--workspace", path.to_str().unwrap()],
        &[],
    )
    .output();
    let output = tokio::time::timeout(PATIENCE, output)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.starts_with("toolgate: refusing to listen on 0.0.0.0:0 without an access token"),
        "{stderr}"
    );
    assert!(
        stderr.contains("--token") && stderr.contains("TOOLGATE_TOKEN"),
        "{stderr}"
    );
    assert!(!path.exists(), "it refused before creating anything");
}

#[tokio::test]
async fn the_binary_refuses_a_public_origin_beyond_loopback_without_a_token() {
    let workspace = tempfile::tempdir().unwrap();
    let path = workspace.path().join("ws");
    // Behind a reverse proxy the server itself listens on loopback; the public origin says who reaches it.
    let output = toolgate(
        &[
            "--addr",
            "127.0.0.1:0",
            "--public-origin",
            "http://localhost:3000,https://toolgate.example.com",
            "--workspace",
            path.to_str().unwrap(),
        ],
        &[],
    )
    .output();
    let output = tokio::time::timeout(PATIENCE, output)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.starts_with(
            "toolgate: refusing to serve https://toolgate.example.com without an access token: a public origin that is not a loopback address means people reach toolgate through a proxy or from other machines"
        ),
        "{stderr}"
    );
    assert!(
        stderr.contains("--token") && stderr.contains("TOOLGATE_TOKEN"),
        "{stderr}"
    );
    assert!(!path.exists(), "it refused before creating anything");

    // A loopback public origin (an SSH tunnel, a proxy on the same machine for local use) needs no token.
    let server = Server::start(&["--public-origin", "http://localhost:8080"], &[]).await;
    let health = reqwest::get(server.url("/healthz")).await.unwrap();
    assert_eq!(health.text().await.unwrap().lines().next(), Some("ok"));
    server.signal(libc::SIGTERM);
    assert!(server.exit(EXIT_WITHIN).await.0.success());
}

#[tokio::test]
async fn the_token_from_the_environment_works_and_is_never_printed() {
    let token = "tg-env-5d2c9b1e7a3f4e60b8c2d4f6a8e0c1b3";
    let server = Server::start(
        &["--addr", "0.0.0.0:0", "--log", "debug"],
        &[
            ("TOOLGATE_TOKEN", token),
            (
                "TOOLGATE_PUBLIC_ORIGIN",
                "https://a.example,https://b.example",
            ),
        ],
    )
    .await;
    assert!(
        server.log.contains("security=auth: access token (log in at /login); origins: https://a.example, https://b.example"),
        "{}",
        server.log
    );
    let client = reqwest::Client::new();
    let without = client
        .get(server.url("/api/agent/approvals"))
        .send()
        .await
        .unwrap();
    assert_eq!(without.status(), 401);
    let with = client
        .get(server.url("/api/agent/approvals"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    assert_eq!(with.status(), 200);
    let wrong_login = client
        .post(server.url("/login"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!("token={token}x"))
        .send()
        .await
        .unwrap();
    assert_eq!(wrong_login.status(), 401);

    server.signal(libc::SIGTERM);
    let (status, log) = server.exit(EXIT_WITHIN).await;
    assert!(status.success());
    assert!(log.contains("a login attempt with a wrong token"), "{log}");
    assert!(!log.contains(token), "the token appears in the log:\n{log}");

    let help = toolgate(&["--help"], &[("TOOLGATE_TOKEN", token)])
        .output()
        .await
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(help.contains("TOOLGATE_TOKEN"), "{help}");
    assert!(!help.contains(token), "--help shows the token:\n{help}");
}

#[tokio::test]
async fn run_command_never_sees_the_model_key_in_the_servers_environment() {
    let key = "sk-test-3b7e1d9c5a2f4e8b";
    let server = Server::start(
        &["--policy", "trusted"],
        &[("OPENAI_API_KEY", key), ("TOOLGATE_INNOCENT", "x")],
    )
    .await;
    let response = reqwest::Client::new()
        .post(server.url("/api/agent"))
        .json(&json!({"message": "run env"}))
        .send()
        .await
        .unwrap();
    let body: Value = response.json().await.unwrap();
    let output = &body["steps"][0]["toolCalls"][0]["output"];
    assert_eq!(output["status"], "ok", "{body}");
    let env = output["content"]["stdout"].as_str().unwrap();
    assert!(env.contains("PATH="), "{env}");
    assert!(
        !env.contains(key) && !env.contains("OPENAI_API_KEY"),
        "{env}"
    );
    assert!(
        !env.contains("TOOLGATE_"),
        "none of the server's variables: {env}"
    );
    server.signal(libc::SIGTERM);
    assert!(server.exit(EXIT_WITHIN).await.0.success());
}

/// A command cannot read the server's environment through `/proc` either: neither the server's own
/// (`/proc/<pid>/environ` shows the environment a process started with, whatever it removed since) nor that of the
/// supervisor it runs under, a fork of the server that executes nothing. Both run as the command's user. Before,
/// `cat /proc/$PPID/environ` printed the model's key.
#[tokio::test]
async fn run_command_cannot_read_the_servers_environment_through_proc() {
    let key = "sk-test-9f1c2b7d4e6a8053";
    let server =
        Server::start_unprivileged(&["--policy", "trusted"], &[("OPENAI_API_KEY", key)]).await;
    for command in [
        format!("run cat /proc/{}/environ", server.pid()),
        "run sh -c 'cat /proc/$PPID/environ'".to_owned(),
    ] {
        let response = reqwest::Client::new()
            .post(server.url("/api/agent"))
            .json(&json!({ "message": command }))
            .send()
            .await
            .unwrap();
        let body: Value = response.json().await.unwrap();
        let output = &body["steps"][0]["toolCalls"][0]["output"];
        assert_eq!(output["status"], "ok", "{command}: {body}");
        assert!(!output.to_string().contains(key), "{command}: {output}");
        assert!(
            output["content"]["stderr"]
                .as_str()
                .is_some_and(|stderr| stderr.contains("Permission denied")),
            "{command}: {output}"
        );
    }
}

/// The command lines of the processes whose working directory is `dir`: the test's own workspace, so they are what
/// the server's commands started, whatever session or process group they moved to.
fn processes_in(dir: &std::path::Path) -> Vec<String> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|entry| {
            entry
                .file_name()
                .to_str()
                .is_some_and(|name| name.parse::<u32>().is_ok())
                && std::fs::read_link(entry.path().join("cwd")).is_ok_and(|cwd| cwd == dir)
        })
        .filter_map(|entry| std::fs::read(entry.path().join("cmdline")).ok())
        .map(|cmdline| String::from_utf8_lossy(&cmdline).replace('\0', " "))
        .collect()
}

#[tokio::test]
async fn sigterm_ends_runs_in_the_middle_of_tools_and_leaves_no_process_behind() {
    let server = Server::start(&["--policy", "trusted"], &[]).await;
    let workspace = server.workspace();
    let fifo = std::ffi::CString::new(workspace.join("pipe").into_os_string().into_encoded_bytes())
        .unwrap();
    // SAFETY: mkfifo reads a NUL-terminated path that outlives the call.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
    let client = reqwest::Client::new();
    let start = |message: &str| {
        client
            .post(server.url("/api/agent/stream"))
            .json(&json!({ "message": message }))
            .send()
    };
    // A read of a FIFO (once, it blocked a thread for ever, and SIGTERM no longer ended the process), and a command
    // whose children leave its process group and session.
    let mut read = SseStream::new(start("read pipe").await.unwrap());
    read.until("toolCall").await;
    let mut command = SseStream::new(
        start("run sh -c 'sleep 300 & setsid sleep 300 & wait'")
            .await
            .unwrap(),
    );
    command.until("toolCall").await;
    let started = Instant::now();
    while processes_in(&workspace)
        .iter()
        .filter(|cmdline| cmdline.starts_with("sleep 300"))
        .count()
        < 2
    {
        assert!(
            started.elapsed() < PATIENCE,
            "{:?}",
            processes_in(&workspace)
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let signalled = Instant::now();
    server.signal(libc::SIGTERM);
    let (status, log) = server.exit(EXIT_WITHIN).await;
    assert!(status.success(), "exit status {status:?}; log:\n{log}");
    assert!(
        signalled.elapsed() < EXIT_WITHIN,
        "took {:?}",
        signalled.elapsed()
    );
    assert_eq!(
        processes_in(&workspace),
        Vec::<String>::new(),
        "left running"
    );

    let read = read.rest().await;
    let result = read
        .iter()
        .find(|e| e.name == "toolResult")
        .expect("the read has a result");
    assert_eq!(
        result.data["output"]["code"], "OUTSIDE_WORKSPACE",
        "{:?}",
        result.data
    );
    let command = command.rest().await;
    let result = command
        .iter()
        .find(|e| e.name == "toolResult")
        .expect("the command has a result");
    assert_eq!(
        result.data["output"]["message"], "\"sh\" was stopped because the run was aborted.",
        "{:?}",
        result.data
    );
    assert_eq!(command.last().unwrap().data["code"], "SHUTDOWN");
}

/// A server killed outright (SIGKILL, a crash, the OOM killer) cannot end its commands itself: each command's
/// supervisor sees the server gone and ends the command's whole tree, what left its session included.
#[tokio::test]
async fn a_killed_server_leaves_no_command_running() {
    // The home outlives the server, so that what runs there is still found by its working directory.
    let home = Home::new();
    let server = Server::start_in(
        &home,
        &["--policy", "trusted", "--database-url", "memory"],
        &[],
    )
    .await;
    let workspace = server.workspace();
    let client = reqwest::Client::new();
    let mut command = SseStream::new(
        client
            .post(server.url("/api/agent/stream"))
            .json(&json!({ "message": "run sh -c 'sleep 300 & setsid sleep 300 & wait'" }))
            .send()
            .await
            .unwrap(),
    );
    command.until("toolCall").await;
    let sleepers = || {
        processes_in(&workspace)
            .iter()
            .filter(|cmdline| cmdline.starts_with("sleep 300"))
            .count()
    };
    let started = Instant::now();
    while sleepers() < 2 {
        assert!(
            started.elapsed() < PATIENCE,
            "{:?}",
            processes_in(&workspace)
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    server.kill9().await;
    let killed = Instant::now();
    while !processes_in(&workspace).is_empty() {
        assert!(
            killed.elapsed() < PATIENCE,
            "left running: {:?}",
            processes_in(&workspace)
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
