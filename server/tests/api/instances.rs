//! Several toolgate processes on one PostgreSQL serve as one: any request may land on any instance. The database
//! is a real PostgreSQL the tests start from the machine's own packages; the instances are the real binary, each in
//! a home of its own, sharing one workspace (as instances behind a load balancer share what their tools work on).

use std::collections::HashSet;
use std::time::Duration;

use serde_json::json;

use crate::helpers::{SseEvent, SseStream, eventually};
use crate::postgres;
use crate::process::{EXIT_WITHIN, Home, Server};

/// A lease short enough that a dead instance's work is taken over within the tests' patience.
const LEASE_SECS: &str = "2";

struct Cluster {
    url: String,
    workspace: tempfile::TempDir,
    homes: Vec<Home>,
}

impl Cluster {
    fn new() -> Self {
        Self {
            url: postgres::database(),
            workspace: tempfile::tempdir().unwrap(),
            homes: Vec::new(),
        }
    }

    async fn start(&mut self, extra: &[&str]) -> Server {
        let home = Home::new();
        let workspace = self.workspace.path().to_str().unwrap().to_owned();
        let mut args = vec![
            "--database-url",
            self.url.as_str(),
            "--lease-secs",
            LEASE_SECS,
            "--workspace",
            workspace.as_str(),
        ];
        args.extend_from_slice(extra);
        let server = Server::start_in(&home, &args, &[]).await;
        self.homes.push(home);
        server
    }

    fn file(&self, name: &str) -> std::path::PathBuf {
        self.workspace.path().join(name)
    }
}

fn client() -> reqwest::Client {
    reqwest::Client::new()
}

async fn decide(server: &Server, run_id: &str, call_id: &str, decision: &str) -> reqwest::Response {
    client()
        .post(server.url(&format!("/api/agent/approvals/{run_id}/{call_id}")))
        .json(&json!({ "decision": decision }))
        .send()
        .await
        .unwrap()
}

fn ids(events: &[SseEvent]) -> Vec<u64> {
    events.iter().map(|e| e.id).collect()
}

#[tokio::test]
async fn a_run_started_on_one_instance_is_followed_listed_and_decided_on_others() {
    let mut cluster = Cluster::new();
    let a = cluster.start(&[]).await;
    let b = cluster.start(&[]).await;
    let c = cluster.start(&[]).await;
    let health = |server: &Server| {
        let url = server.url("/healthz");
        async move { reqwest::get(url).await.unwrap().text().await.unwrap() }
    };
    let (ha, hb) = (health(&a).await, health(&b).await);
    assert!(
        ha.contains("store: postgres") && hb.contains("store: postgres"),
        "{ha}"
    );
    assert_ne!(
        ha.lines().nth(1),
        hb.lines().nth(1),
        "each instance has its own id"
    );

    let run_id = a
        .create_run(json!({"message": "write shared.txt: one"}))
        .await;
    let mut on_a = a.events(&run_id, None).await;
    let mut on_b = b.events(&run_id, None).await;
    on_b.until("approvalRequired").await;
    let listed = c.pending().await;
    assert_eq!(
        listed.len(),
        1,
        "every instance lists every pending approval"
    );
    let call_id = listed[0]["toolCallId"].as_str().unwrap().to_owned();
    assert_eq!(decide(&c, &run_id, &call_id, "approve").await.status(), 200);

    let rest_a = on_a.rest().await;
    let rest_b = on_b.rest().await;
    assert_eq!(rest_a.last().unwrap().name, "done");
    // Every subscriber sees the same ids, with no gap and no duplicate.
    let all = ids(&rest_a);
    assert_eq!(all, (1..=all.len() as u64).collect::<Vec<_>>());
    let from_b: Vec<u64> = ids(&rest_b);
    assert_eq!(from_b, all[all.len() - from_b.len()..].to_vec());
    let on_c = c.events(&run_id, None).await.rest().await;
    assert_eq!(ids(&on_c), all);
    assert_eq!(
        on_c.iter().map(|e| e.data.to_string()).collect::<Vec<_>>(),
        rest_a
            .iter()
            .map(|e| e.data.to_string())
            .collect::<Vec<_>>(),
        "the same events on every instance"
    );
    let results = rest_a.iter().filter(|e| e.name == "toolResult").count();
    assert_eq!(results, 1, "the tool ran once");
    assert_eq!(
        std::fs::read_to_string(cluster.file("shared.txt")).unwrap(),
        "one"
    );
    let late = decide(&a, &run_id, &call_id, "approve").await;
    assert_eq!(late.status(), 404);
    let text = late.text().await.unwrap();
    assert!(
        text.contains(&format!(
            "No pending approval found for run {run_id} and tool call {call_id}. It may have already been resolved or timed out."
        )),
        "{text}"
    );
    for server in [a, b, c] {
        server.signal(libc::SIGTERM);
        server.exit(EXIT_WITHIN).await;
    }
}

#[tokio::test]
async fn fifty_concurrent_decisions_over_three_instances_have_one_winner() {
    let mut cluster = Cluster::new();
    let servers = vec![
        cluster.start(&[]).await,
        cluster.start(&[]).await,
        cluster.start(&[]).await,
    ];
    std::fs::write(cluster.file("once.txt"), "").unwrap();
    let run_id = servers[0]
        .create_run(json!({"message": "run sh -c 'echo ran >> once.txt'"}))
        .await;
    servers[1]
        .events(&run_id, None)
        .await
        .until("approvalRequired")
        .await;
    let call_id = servers[2].pending().await[0]["toolCallId"]
        .as_str()
        .unwrap()
        .to_owned();
    let decisions = (0..50).map(|i| {
        let url = servers[i % 3].url(&format!("/api/agent/approvals/{run_id}/{call_id}"));
        tokio::spawn(async move {
            client()
                .post(url)
                .json(&json!({"decision": "approve"}))
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        })
    });
    let statuses: Vec<u16> = futures::future::join_all(decisions)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    assert_eq!(
        statuses.iter().filter(|s| **s == 200).count(),
        1,
        "{statuses:?}"
    );
    assert_eq!(
        statuses.iter().filter(|s| **s == 404).count(),
        49,
        "{statuses:?}"
    );
    let rest = servers[0].events(&run_id, None).await.rest().await;
    assert_eq!(rest.last().unwrap().name, "done");
    assert_eq!(
        std::fs::read_to_string(cluster.file("once.txt")).unwrap(),
        "ran\n",
        "the tool ran once"
    );
    for server in servers {
        server.signal(libc::SIGTERM);
        server.exit(EXIT_WITHIN).await;
    }
}

#[tokio::test]
async fn a_decision_reaches_a_follower_whose_notification_connection_was_killed() {
    let mut cluster = Cluster::new();
    let a = cluster.start(&[]).await;
    let b = cluster.start(&[]).await;
    let run_id = a
        .create_run(json!({"message": "write lost.txt: found"}))
        .await;
    let mut on_b = b.events(&run_id, None).await;
    on_b.until("approvalRequired").await;
    // Every instance's LISTEN connection goes: notifications sent meanwhile are lost.
    let killed = postgres::psql(
        &cluster.url,
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE query ILIKE 'LISTEN%'",
    );
    assert_ne!(killed, "0", "the listeners were found and killed");
    let call_id = a.pending().await[0]["toolCallId"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(decide(&a, &run_id, &call_id, "approve").await.status(), 200);
    let rest = on_b.rest().await;
    assert_eq!(
        rest.iter()
            .map(|e| e.name.as_str())
            .filter(|n| ["approvalResolved", "toolResult", "done"].contains(n))
            .collect::<Vec<_>>(),
        ["approvalResolved", "toolResult", "done"],
        "delivered all the same"
    );
    for server in [a, b] {
        server.signal(libc::SIGTERM);
        server.exit(EXIT_WITHIN).await;
    }
}

#[tokio::test]
async fn a_waiting_run_of_a_killed_instance_is_decided_and_finished_on_another() {
    let mut cluster = Cluster::new();
    let a = cluster.start(&[]).await;
    let b = cluster.start(&[]).await;
    let run_id = a
        .create_run(json!({"message": "write after.txt: survived"}))
        .await;
    a.events(&run_id, None)
        .await
        .until("approvalRequired")
        .await;
    a.kill9().await;

    let call_id = b.pending().await[0]["toolCallId"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(decide(&b, &run_id, &call_id, "approve").await.status(), 200);
    let rest = b.events(&run_id, None).await.rest().await;
    assert_eq!(rest.last().unwrap().name, "done");
    assert_eq!(rest.iter().filter(|e| e.name == "toolResult").count(), 1);
    assert_eq!(
        std::fs::read_to_string(cluster.file("after.txt")).unwrap(),
        "survived"
    );
    b.signal(libc::SIGTERM);
    b.exit(EXIT_WITHIN).await;
}

#[tokio::test]
async fn a_call_running_on_a_killed_instance_is_interrupted_by_another_and_never_run_again() {
    let mut cluster = Cluster::new();
    let a = cluster.start(&["--policy", "trusted"]).await;
    let b = cluster.start(&["--policy", "trusted"]).await;
    let run_id = a
        .create_run(json!({"message": "run sh -c 'echo ran >> killed.txt; sleep 38'"}))
        .await;
    let file = cluster.file("killed.txt");
    eventually("the command to start", async || {
        std::fs::read_to_string(&file).ok()
    })
    .await;
    a.kill9().await;
    let _ = std::process::Command::new("pkill")
        .args(["-fx", "sleep 38"])
        .status();

    // Within about a lease, the other instance notices and takes over.
    let ended = eventually("the take-over", async || {
        let rest = b.events(&run_id, None).await.rest().await;
        (rest.last()?.name == "error").then_some(rest)
    })
    .await;
    assert_eq!(ended.last().unwrap().data["code"], "RESTARTED");
    let result = ended
        .iter()
        .find(|e| e.name == "toolResult")
        .expect("the interrupted call has a result");
    assert!(
        result.data["output"]["message"]
            .as_str()
            .unwrap()
            .contains("its effect is unknown")
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        std::fs::read_to_string(cluster.file("killed.txt")).unwrap(),
        "ran\n",
        "never run again"
    );
    b.signal(libc::SIGTERM);
    b.exit(EXIT_WITHIN).await;
}

#[tokio::test]
async fn a_graceful_shutdown_hands_waiting_runs_over_instead_of_denying_them() {
    let mut cluster = Cluster::new();
    let a = cluster.start(&[]).await;
    let b = cluster.start(&[]).await;
    let runs: HashSet<String> = [
        a.create_run(json!({"message": "write x1.txt: a"})).await,
        a.create_run(json!({"message": "write x2.txt: b"})).await,
    ]
    .into();
    for run in &runs {
        a.events(run, None).await.until("approvalRequired").await;
    }
    a.signal(libc::SIGTERM);
    let (status, _) = a.exit(EXIT_WITHIN).await;
    assert!(status.success());
    let waiting = b.pending().await;
    assert_eq!(waiting.len(), 2, "nothing was denied");
    for approval in &waiting {
        let run = approval["runId"].as_str().unwrap();
        let call = approval["toolCallId"].as_str().unwrap();
        assert_eq!(decide(&b, run, call, "approve").await.status(), 200);
        assert_eq!(
            b.events(run, None).await.rest().await.last().unwrap().name,
            "done"
        );
    }
    assert!(cluster.file("x1.txt").exists() && cluster.file("x2.txt").exists());
    b.signal(libc::SIGTERM);
    b.exit(EXIT_WITHIN).await;
}

/// A hundred round trips of the approval API in a row on one instance, then as many eight at a time: every one
/// ends `done` with its tool run once. (A decision locked the call's row and then its run's, while the run's own
/// task, woken by events written meanwhile, locked the run's row and then its calls': PostgreSQL found the
/// deadlock and failed one of them, and the decision answered 503, a few trips in a hundred.)
#[tokio::test]
async fn round_trips_never_fail_on_locks() {
    let mut cluster = Cluster::new();
    let server = cluster.start(&[]).await;
    let trip = |i: usize| {
        let (server, cluster) = (&server, &cluster);
        async move {
            let name = format!("trip-{i}.txt");
            // A streamed run in a session of its own, as a client of the approval API starts one.
            let response = client()
                .post(server.url("/api/agent/stream"))
                .json(&json!({"message": format!("write {name}: {i}"), "sessionId": format!("trip-{i}")}))
                .send()
                .await
                .unwrap();
            let mut stream = SseStream::new(response);
            let asked = stream.until("approvalRequired").await;
            let run_id = asked.data["request"]["runId"].as_str().unwrap().to_owned();
            let call_id = asked.data["request"]["toolCallId"]
                .as_str()
                .unwrap()
                .to_owned();
            let decided = decide(server, &run_id, &call_id, "approve").await;
            assert_eq!(
                decided.status(),
                200,
                "trip {i}: {:?}",
                decided.text().await
            );
            let rest = stream.rest().await;
            let names: Vec<&str> = rest.iter().map(|e| e.name.as_str()).collect();
            assert_eq!(names.last(), Some(&"done"), "trip {i}: {names:?}");
            assert_eq!(
                rest.iter().filter(|e| e.name == "toolResult").count(),
                1,
                "trip {i}: {names:?}"
            );
            assert!(cluster.file(&name).exists(), "{name} was written");
        }
    };
    for i in 0..100 {
        trip(i).await;
    }
    for round in 0..12 {
        futures::future::join_all((0..8).map(|i| trip(100 + round * 8 + i))).await;
    }
    server.signal(libc::SIGTERM);
    server.exit(EXIT_WITHIN).await;
}

/// A logout on one instance ends the login on every instance: a copy of its cookie is refused by the others, an
/// event stream it opened on another instance ends within that instance's check (10 s), and another browser's
/// login goes on working everywhere.
#[tokio::test]
async fn a_logout_on_one_instance_holds_on_every_instance() {
    const TOKEN: &str = "a-token-the-cluster-shares";
    let mut cluster = Cluster::new();
    let a = cluster.start(&["--token", TOKEN]).await;
    let b = cluster.start(&["--token", TOKEN]).await;
    let browser = crate::security::no_redirects();
    let log_in = async |server: &Server| crate::security::log_in_at(&server.url(""), TOKEN).await;
    let page = async |server: &Server, cookie: &str| {
        browser
            .get(server.url("/"))
            .header("cookie", cookie)
            .send()
            .await
            .unwrap()
            .status()
            .as_u16()
    };
    let kept = log_in(&a).await;
    let other = log_in(&b).await;
    assert_eq!(page(&b, &kept).await, 200, "any instance honours a login");
    let created = client()
        .post(a.url("/api/agent/runs"))
        .header("authorization", format!("Bearer {TOKEN}"))
        .json(&json!({"message": "write secret.txt: top secret"}))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201);
    let run_id = created.json::<serde_json::Value>().await.unwrap()["runId"]
        .as_str()
        .unwrap()
        .to_owned();
    let on_b = client()
        .get(b.url(&format!("/api/agent/runs/{run_id}/events")))
        .header("cookie", &kept)
        .send()
        .await
        .unwrap();
    assert_eq!(on_b.status(), 200);
    let mut on_b = SseStream::new(on_b);
    on_b.until("approvalRequired").await;

    let out = browser
        .post(a.url("/logout"))
        .header("cookie", &kept)
        .header("origin", a.url(""))
        .send()
        .await
        .unwrap();
    assert_eq!(out.status(), 303);
    assert_eq!(
        page(&b, &kept).await,
        303,
        "the other instance sends it to the login form"
    );
    // Within the stream's patience (15 s): the other instance looks every 10 s.
    assert!(
        on_b.next().await.is_none(),
        "the stream the login opened on the other instance ends"
    );
    assert_eq!(page(&a, &kept).await, 303);
    assert_eq!(page(&a, &other).await, 200);
    assert_eq!(page(&b, &other).await, 200);
}
