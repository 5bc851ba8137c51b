-- toolgate's durable state. Times are milliseconds since the Unix epoch; JSON is text.

CREATE TABLE sessions (
    id          TEXT PRIMARY KEY,
    title       TEXT NOT NULL DEFAULT '',
    created_at  BIGINT NOT NULL,
    updated_at  BIGINT NOT NULL,
    -- The run going in the session: one at a time.
    active_run  TEXT,
    run_count   BIGINT NOT NULL DEFAULT 0
);

-- A session's conversation, message by message.
CREATE TABLE session_messages (
    session_id  TEXT NOT NULL,
    idx         BIGINT NOT NULL,
    message     TEXT NOT NULL,
    PRIMARY KEY (session_id, idx)
);

CREATE TABLE runs (
    id              TEXT PRIMARY KEY,
    session_id      TEXT NOT NULL,
    -- Its place among the session's runs.
    ordinal         BIGINT NOT NULL,
    parent_run_id   TEXT,
    mode            TEXT NOT NULL,
    state           TEXT NOT NULL,
    -- The instance sampling it, and its claim, while it is running.
    owner           TEXT,
    epoch           BIGINT NOT NULL DEFAULT 1,
    last_seq        BIGINT NOT NULL DEFAULT 0,
    event_bytes     BIGINT NOT NULL DEFAULT 0,
    abort           TEXT,
    message         TEXT NOT NULL DEFAULT '',
    created_at      BIGINT NOT NULL,
    finished_at     BIGINT,
    -- What a waiting run goes on from.
    batch           TEXT,
    -- An interrupted (AG-UI) run's suspension, its expiry, and the run that resumed it.
    suspension      TEXT,
    suspension_expires_at BIGINT,
    resumed_by      TEXT,
    -- The whole conversation of a run whose client owns it.
    conversation    TEXT
);
CREATE INDEX runs_by_session ON runs (session_id, ordinal);
CREATE INDEX runs_by_state ON runs (state);
CREATE INDEX runs_finished ON runs (finished_at);

CREATE TABLE events (
    run_id  TEXT NOT NULL,
    seq     BIGINT NOT NULL,
    kind    TEXT NOT NULL,
    json    TEXT NOT NULL,
    PRIMARY KEY (run_id, seq)
);

-- The tool calls of a run's current batch, with their approvals.
CREATE TABLE calls (
    run_id        TEXT NOT NULL,
    call_id       TEXT NOT NULL,
    idx           BIGINT NOT NULL,
    status        TEXT NOT NULL,
    record        TEXT NOT NULL,
    requested_at  BIGINT,
    expires_at    BIGINT,
    executing_on  TEXT,
    PRIMARY KEY (run_id, call_id)
);
CREATE INDEX calls_by_status ON calls (status, expires_at);

CREATE TABLE grants (
    session_id  TEXT NOT NULL,
    id          TEXT NOT NULL,
    grant_json  TEXT NOT NULL,
    created_at  BIGINT NOT NULL,
    PRIMARY KEY (session_id, id)
);

CREATE TABLE rules (
    id          TEXT PRIMARY KEY,
    rule        TEXT NOT NULL,
    created_at  BIGINT NOT NULL,
    created_by  TEXT
);

CREATE TABLE audit (
    id                BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at                BIGINT NOT NULL,
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
CREATE INDEX audit_by_time ON audit (at);
CREATE INDEX audit_by_session ON audit (session_id, id);
CREATE INDEX audit_by_run ON audit (run_id, id);

-- The audit log is append-only: no UPDATE, no DELETE, whoever asks.
CREATE FUNCTION toolgate_audit_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'the audit log is append-only';
END;
$$;
CREATE TRIGGER audit_no_update BEFORE UPDATE OR DELETE ON audit
    FOR EACH ROW EXECUTE FUNCTION toolgate_audit_append_only();
CREATE TRIGGER audit_no_truncate BEFORE TRUNCATE ON audit
    FOR EACH STATEMENT EXECUTE FUNCTION toolgate_audit_append_only();

-- The processes serving on this database, and when each last said it was alive.
CREATE TABLE instances (
    id            TEXT PRIMARY KEY,
    started_at    BIGINT NOT NULL,
    heartbeat_at  BIGINT NOT NULL
);
