-- A call's record stays on its table's page. In a WITHOUT ROWID table (a b-tree keyed by its primary key) a row
-- keeps at most about a quarter of a page (1,002 bytes of 4 KiB) on its page and spills the rest to overflow pages,
-- and a call's record is more than that even for a small call (its arguments, its approval card with the
-- preview). Each of a call's changes (pending, decided, executing, settled) rewrites its record, so each freed the
-- record's overflow page and took a new one: three pages written more per change (the new overflow page, the free
-- list's page, the database header). A table with a row number keeps up to 4,061 bytes of a row on its page (a call
-- whose arguments are larger still spills, as any row that large), and a change writes that page alone; finding a
-- call by its key takes the index beside it, which only a call's insertion and deletion change.

CREATE TABLE calls_inline (
    run_id        TEXT NOT NULL,
    call_id       TEXT NOT NULL,
    idx           INTEGER NOT NULL,
    status        TEXT NOT NULL,
    record        TEXT NOT NULL,
    requested_at  INTEGER,
    expires_at    INTEGER,
    executing_on  TEXT,
    PRIMARY KEY (run_id, call_id)
);
INSERT INTO calls_inline (run_id, call_id, idx, status, record, requested_at, expires_at, executing_on)
    SELECT run_id, call_id, idx, status, record, requested_at, expires_at, executing_on FROM calls;
DROP TABLE calls;
ALTER TABLE calls_inline RENAME TO calls;
CREATE INDEX calls_pending ON calls (expires_at) WHERE status = 'pending';
