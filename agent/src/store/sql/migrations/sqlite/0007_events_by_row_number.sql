-- A run's events are rows of a table with a row number: the run's number times 2^32 plus the event's sequence
-- number, so that a run's events are still one range of the table, in order, and the newest run's are at its end.
-- Before, they were a WITHOUT ROWID table keyed by (run, seq), a b-tree of the kind an index is, and that cost
-- pages in three ways:
-- - A row of such a table keeps at most 1,002 bytes on its page (a quarter of 4 KiB) and spills the rest to an
--   overflow page; a card's event (`approvalRequired`) is near that for a one-line write, and more for a longer
--   one. A table with a row number keeps up to 4,061 bytes of a row on its page.
-- - Its interior pages hold whole rows as the keys between their children: about twenty to a page, so the tree was
--   a level deeper and its splits rewrote interior pages more often. Here a key between children is the number.
-- - A full page at the table's end was split by spreading its rows over it and its neighbours, rewriting them and
--   their parent; a table with a row number that grows at its end starts a new page beside it (only that page and
--   the parent are written).
-- In a simulation of a trip's appends at concurrency 1 (sixteen events in five commits), 13.8 pages a trip before,
-- 8.0 after. No event's row ever moves once written. A sequence number is below 2^32 (the harness ends a run past
-- 50,000 events) and a run's number below 2^31.

CREATE TABLE events_numbered (
    run_seq  INTEGER PRIMARY KEY,
    kind     TEXT NOT NULL,
    json     TEXT NOT NULL
);
INSERT INTO events_numbered (run_seq, kind, json)
    SELECT run * 4294967296 + seq, kind, json FROM events ORDER BY run, seq;
DROP TABLE events;
ALTER TABLE events_numbered RENAME TO events;
