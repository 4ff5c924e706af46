-- Placeholder for migration 0004, which another branch (H7) adds: this branch's 0005
-- needs an unbroken numbering to apply. Dropped when that branch is merged.
SELECT 1;
