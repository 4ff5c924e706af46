-- The coordinator leader's lease (DESIGN.md §7, docs/leadership.md): one row per
-- database, on the database clock. It replaces a session advisory lock, which a stuck or
-- partitioned leader kept for as long as its connection lived and which a transaction
-- pooler (pgbouncer) cannot hold at all.
--
-- epoch is in a unique index on purpose: that makes it a key column, so a takeover (which
-- changes it) needs a lock that conflicts with the FOR KEY SHARE every leader transaction
-- takes on this row (locks.sql: leader_term), while a renewal (expires_at only) does not.
-- A takeover therefore waits for the old leader's open transactions, and those
-- transactions, once it has committed, find their term gone and roll back.
CREATE TABLE coordinator_leader (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    holder text NOT NULL,
    epoch bigint NOT NULL UNIQUE CHECK (epoch >= 0),
    acquired_at timestamptz NOT NULL,
    expires_at timestamptz NOT NULL
);

-- Nobody leads yet: epoch 0, already expired, so the first acquire takes epoch 1 with
-- the same single UPDATE as every later takeover.
INSERT INTO coordinator_leader (holder, epoch, acquired_at, expires_at)
VALUES ('', 0, now(), now());

COMMENT ON TABLE coordinator_leader IS
    'The coordinator leader''s lease: one row; a standby takes it once expires_at has passed, with the next epoch.';
COMMENT ON COLUMN coordinator_leader.singleton IS
    'Always true: the key that keeps this table to one row.';
COMMENT ON COLUMN coordinator_leader.holder IS
    'The leading coordinator''s --instance name ('''' before anyone led).';
COMMENT ON COLUMN coordinator_leader.epoch IS
    'Incremented by every acquisition; each leader transaction checks it (FOR KEY SHARE), so a superseded leader writes nothing.';
COMMENT ON COLUMN coordinator_leader.acquired_at IS
    'When the current epoch began (database clock).';
COMMENT ON COLUMN coordinator_leader.expires_at IS
    'The lease ends here unless renewed (database clock); a clean stop sets it to now.';
