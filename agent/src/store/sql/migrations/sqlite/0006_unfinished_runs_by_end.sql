-- The index of unfinished runs holds the runs without an end, by session, instead of the runs running or waiting,
-- by state. Keyed and conditioned on the state, it moved a run's entry at each wait for a person and at each
-- resumption after it (a page written in each of those commits); neither changes a run's session or its end, so
-- now only a run's start and its end write the index. A run has no end exactly while it is running or waiting:
-- its end is the one change that records a final state, and it records when the run ended with it.
DROP INDEX runs_unfinished;
CREATE INDEX runs_unfinished ON runs (session_id) WHERE finished_at IS NULL;
