-- Reserved: this number belongs to another branch of this phase (durable execution).
-- Flow control took 0018 so the two never collide; this placeholder keeps 1..n
-- contiguous on the flow branch alone and is dropped when that branch is merged.
SELECT 1;
