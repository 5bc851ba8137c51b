//! SQLite's WAL under a steady load, alone in its test binary: how long the WAL grows depends on the store's
//! checkpointer getting its turn, which the other tests of a binary, run at once on the same cores, would take.

use std::time::Duration;

use agent::store::sql::{DatabaseUrl, SqlStore};
use agent::store::{AuditEntry, AuditKind, Store};

/// Under a steady stream of commits the WAL starts over long before SQLite's automatic threshold of 10,000
/// pages: the checkpointer copies it whole (its last pass holds the writer), so no commit runs a checkpoint
/// of its own. Before, a passive checkpoint beside the commits never copied the WAL whole, it grew to the
/// threshold, and from there every commit checkpointed inline, with its fsyncs, on the task that committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_a_steady_load_the_wal_starts_over_before_the_automatic_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("toolgate.db");
    let store = SqlStore::open(&DatabaseUrl::Sqlite(path.clone()))
        .await
        .unwrap();
    // About nine pages a commit, a commit a millisecond or so: some 12,000 pages of WAL in all, written at
    // about the pace of a busy server.
    let reason = "x".repeat(32 * 1024);
    for _ in 0..1_300 {
        tokio::time::sleep(Duration::from_millis(1)).await;
        store
            .audit(AuditEntry {
                reason: Some(reason.clone()),
                ..AuditEntry::new(AuditKind::RuleChanged, "added")
            })
            .await
            .unwrap();
    }
    // The WAL file keeps the size of the longest WAL it held (it is cut back only past 64 MiB).
    let wal = std::fs::metadata(format!("{}-wal", path.display()))
        .unwrap()
        .len();
    let pages = wal / 4_120;
    assert!(
        pages < 9_000,
        "the WAL held {pages} pages at its longest, near the automatic threshold of 10,000"
    );
}
