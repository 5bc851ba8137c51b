-- Each instance says how long the others should wait for its heartbeat before they take its work over: its own
-- `--lease-secs`, which need not be theirs. An instance of an older version leaves it empty, and is judged by the
-- judge's own lease, as before.
ALTER TABLE instances ADD COLUMN lease_ms BIGINT;
