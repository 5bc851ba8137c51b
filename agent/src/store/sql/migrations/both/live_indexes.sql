-- Indexes that hold only what their queries look for, so that fewer commits touch them. The runs by state: only
-- the unfinished ones (the queries ask for running or waiting runs; a finished run leaves the index once instead of
-- moving within it). The finished runs: only the finished ones (a starting run no longer enters the index with a
-- null). The calls by status: only the pending ones, by expiry (the only status looked up across runs while
-- serving; a call that executes at once never enters the index).
DROP INDEX runs_by_state;
CREATE INDEX runs_unfinished ON runs (state) WHERE state IN ('running', 'waiting');
DROP INDEX runs_finished;
CREATE INDEX runs_finished ON runs (finished_at, id) WHERE finished_at IS NOT NULL;
DROP INDEX calls_by_status;
CREATE INDEX calls_pending ON calls (expires_at) WHERE status = 'pending';
