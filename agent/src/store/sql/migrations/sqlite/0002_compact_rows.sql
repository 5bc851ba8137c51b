-- Fewer pages written per commit. A run's events and a batch's calls are found by their primary key: stored in
-- that key's own b-tree (WITHOUT ROWID) instead of a table beside an index, each insert or change writes one
-- b-tree, not two. The audit log needs no AUTOINCREMENT: nothing is ever deleted from it (its triggers refuse),
-- so a new entry's id is always above every earlier one, without the bookkeeping row every insert updated.

CREATE TABLE events_by_key (
    run_id  TEXT NOT NULL,
    seq     INTEGER NOT NULL,
    kind    TEXT NOT NULL,
    json    TEXT NOT NULL,
    PRIMARY KEY (run_id, seq)
) WITHOUT ROWID;
INSERT INTO events_by_key (run_id, seq, kind, json) SELECT run_id, seq, kind, json FROM events;
DROP TABLE events;
ALTER TABLE events_by_key RENAME TO events;

CREATE TABLE calls_by_key (
    run_id        TEXT NOT NULL,
    call_id       TEXT NOT NULL,
    idx           INTEGER NOT NULL,
    status        TEXT NOT NULL,
    record        TEXT NOT NULL,
    requested_at  INTEGER,
    expires_at    INTEGER,
    executing_on  TEXT,
    PRIMARY KEY (run_id, call_id)
) WITHOUT ROWID;
INSERT INTO calls_by_key (run_id, call_id, idx, status, record, requested_at, expires_at, executing_on)
    SELECT run_id, call_id, idx, status, record, requested_at, expires_at, executing_on FROM calls;
DROP TABLE calls;
ALTER TABLE calls_by_key RENAME TO calls;
CREATE INDEX calls_by_status ON calls (status, expires_at);

CREATE TABLE audit_log (
    id                INTEGER PRIMARY KEY,
    at                INTEGER NOT NULL,
    kind              TEXT NOT NULL,
    session_id        TEXT,
    run_id            TEXT,
    tool_call_id      TEXT,
    tool              TEXT,
    arguments_digest  TEXT,
    edited_digest     TEXT,
    outcome           TEXT NOT NULL,
    source            TEXT,
    scope             TEXT,
    reason            TEXT,
    actor             TEXT
);
INSERT INTO audit_log SELECT * FROM audit;
DROP TABLE audit;
ALTER TABLE audit_log RENAME TO audit;
CREATE INDEX audit_by_time ON audit (at);
CREATE INDEX audit_by_session ON audit (session_id, id);
CREATE INDEX audit_by_run ON audit (run_id, id);

-- The audit log is append-only.
CREATE TRIGGER audit_no_update BEFORE UPDATE ON audit
BEGIN
    SELECT RAISE(ABORT, 'the audit log is append-only');
END;
CREATE TRIGGER audit_no_delete BEFORE DELETE ON audit
BEGIN
    SELECT RAISE(ABORT, 'the audit log is append-only');
END;
