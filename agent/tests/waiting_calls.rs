//! Calls of a batch that waits, on the durable default, run under the rules in force when they run: a call that
//! was allowed when its batch opened but had not run yet (its process stopped in between) meets a `deny` rule added
//! since, as an approved call does.

mod support;

use std::time::Duration;

use agent::harness::Actor;
use agent::policy::Rule;
use agent::wire::{Decision, StreamEvent, ToolErrorCode, ToolOutput};
use support::{Events, all_events, sqlite_harness, start_in};

#[tokio::test]
async fn an_allowed_call_that_waited_meets_a_deny_rule_added_meanwhile() {
    let dir = tempfile::tempdir().unwrap();
    let harness = sqlite_harness(dir.path(), Duration::from_secs(60)).await;
    std::fs::write(dir.path().join("ws/old.txt"), "old\n").unwrap();
    let run = harness
        .start(start_in("s", "list files and delete old.txt"))
        .await
        .unwrap();
    let mut events = Events::of(&run);
    let request = events.next_approval().await;
    let database = rusqlite::Connection::open(dir.path().join("toolgate.db")).unwrap();
    // The listing runs beside the card, and its result is written a moment after: once it is, nothing of this
    // process writes the call again.
    let settled = || {
        database
            .query_row(
                "SELECT COUNT(*) FROM calls WHERE run_id = ?1 AND status = 'settled'",
                [run.run_id().as_str()],
                |row| row.get::<_, i64>(0),
            )
            .unwrap()
    };
    tokio::time::timeout(Duration::from_secs(10), async {
        while settled() == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the listing's result is written");
    // As if the process had stopped before it ran the allowed call: the listing is allowed and not run yet.
    database
        .execute(
            "UPDATE calls SET status = 'allowed', executing_on = NULL, \
             record = json_set(record, '$.status', 'allowed', '$.output', json('null')) \
             WHERE run_id = ?1 AND status <> 'pending'",
            [run.run_id().as_str()],
        )
        .unwrap();
    harness
        .add_rule(
            Rule::parse("list_files=deny:Not any more.").unwrap(),
            &Actor::local(),
        )
        .await
        .unwrap();
    harness
        .decide(
            &request.run_id,
            &request.tool_call_id,
            Decision::approve(),
            &Actor::local(),
        )
        .await
        .unwrap();
    events.end().await;
    let listings: Vec<ToolOutput> = all_events(&run)
        .await
        .into_iter()
        .filter_map(|event| match event {
            StreamEvent::ToolResult {
                tool_name, output, ..
            } if tool_name == "list_files" => Some(output),
            _ => None,
        })
        .collect();
    assert!(
        matches!(
            listings.last(),
            Some(ToolOutput::Error { code: ToolErrorCode::PermissionDenied, message }) if message.contains("Not any more.")
        ),
        "{listings:?}"
    );
}
