-- Output streams (docs/design.md §15): the chunks an attempt writes while it runs, fenced
-- by its lease like its result (awp_db.streams). Append-only: a stored chunk never
-- changes; retention deletes them with their run.
CREATE TABLE stream_chunks (
    -- The attempt's lease: the writer's fencing is checked against this dispatch, and
    -- its chunks are numbered from 0 per dispatch (one dispatch is one attempt).
    dispatch_id bigint NOT NULL REFERENCES dispatches (id) ON DELETE CASCADE,
    chunk_offset bigint NOT NULL CHECK (chunk_offset >= 0),
    run_id uuid NOT NULL,
    task_id bigint NOT NULL,
    attempt integer NOT NULL CHECK (attempt >= 1),
    -- The reader's cursor: contiguous across the task's attempts in attempt order.
    position bigint NOT NULL CHECK (position >= 0),
    data text NOT NULL,
    is_json boolean NOT NULL,
    -- UTF-8 bytes of the attempt's chunks up to and including this one (the per-attempt
    -- bound is checked against the last chunk alone).
    total_bytes bigint NOT NULL,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (dispatch_id, chunk_offset)
);

CREATE UNIQUE INDEX stream_chunks_position ON stream_chunks (task_id, position);

COMMENT ON TABLE stream_chunks IS
    'Chunks of output an attempt streamed while it ran, fenced by its lease; read by WatchStream in position order.';
COMMENT ON COLUMN stream_chunks.chunk_offset IS
    'The chunk''s number within its attempt, from 0, contiguous (the writer''s offset).';
COMMENT ON COLUMN stream_chunks.position IS
    'The chunk''s place in the task''s stream, contiguous across attempts (the reader''s offset).';
COMMENT ON INDEX stream_chunks_position IS
    'WatchStream reads a task''s chunks from a position here; an append finds where its attempt starts.';
