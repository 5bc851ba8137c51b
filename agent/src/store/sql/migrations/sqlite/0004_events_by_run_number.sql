-- A run's events are found by the run's number instead of its id. Run ids come from clients (an AG-UI client names
-- its own runs) and are random: keyed by them, each run's events sat on a page of their own anywhere in the table,
-- and every commit that appended to a run wrote that run's page, one page per run. A run's number is the next one
-- at its start: the events of the runs going at any moment sit together at the table's end, one commit that
-- appends to many of them writes a few pages for all, and no event row repeats its run's id.
--
-- The number is the runs table's own row number (INTEGER PRIMARY KEY): stable, unlike an implicit rowid, which
-- VACUUM may renumber. A number is given again only after the newest run was deleted, and a run's events are deleted
-- with it.

CREATE TABLE runs_numbered (
    number          INTEGER PRIMARY KEY,
    id              TEXT NOT NULL UNIQUE,
    session_id      TEXT NOT NULL,
    ordinal         INTEGER NOT NULL,
    parent_run_id   TEXT,
    mode            TEXT NOT NULL,
    state           TEXT NOT NULL,
    owner           TEXT,
    epoch           INTEGER NOT NULL DEFAULT 1,
    last_seq        INTEGER NOT NULL DEFAULT 0,
    event_bytes     INTEGER NOT NULL DEFAULT 0,
    abort           TEXT,
    message         TEXT NOT NULL DEFAULT '',
    created_at      INTEGER NOT NULL,
    finished_at     INTEGER,
    batch           TEXT,
    suspension      TEXT,
    suspension_expires_at INTEGER,
    resumed_by      TEXT,
    conversation    TEXT
);
INSERT INTO runs_numbered (number, id, session_id, ordinal, parent_run_id, mode, state, owner, epoch, last_seq,
        event_bytes, abort, message, created_at, finished_at, batch, suspension, suspension_expires_at, resumed_by,
        conversation)
    SELECT rowid, id, session_id, ordinal, parent_run_id, mode, state, owner, epoch, last_seq, event_bytes, abort,
        message, created_at, finished_at, batch, suspension, suspension_expires_at, resumed_by, conversation
    FROM runs ORDER BY rowid;

CREATE TABLE events_numbered (
    run     INTEGER NOT NULL,
    seq     INTEGER NOT NULL,
    kind    TEXT NOT NULL,
    json    TEXT NOT NULL,
    PRIMARY KEY (run, seq)
) WITHOUT ROWID;
INSERT INTO events_numbered (run, seq, kind, json)
    SELECT runs_numbered.number, events.seq, events.kind, events.json
    FROM events JOIN runs_numbered ON runs_numbered.id = events.run_id
    ORDER BY runs_numbered.number, events.seq;

DROP TABLE events;
ALTER TABLE events_numbered RENAME TO events;
DROP TABLE runs;
ALTER TABLE runs_numbered RENAME TO runs;
CREATE INDEX runs_by_session ON runs (session_id, ordinal);
CREATE INDEX runs_unfinished ON runs (state) WHERE state IN ('running', 'waiting');
CREATE INDEX runs_finished ON runs (finished_at, id) WHERE finished_at IS NOT NULL;
