-- Free hand-backs (DESIGN.md §4): a lease a draining worker hands back spends no attempt
-- of its task. `attempts` still counts every attempt made (the last one's number, so
-- attempt numbers keep increasing); `hand_backs` counts those handed back free of charge,
-- and the retry rule charges the difference against max_attempts.
--
-- The charged attempts, not all of them, are what max_attempts bounds. Every existing row
-- has hand_backs = 0 and met the old check, so the checks need no scan of the table
-- (which would hold its lock while a rolling deploy's old servers run): NOT VALID still
-- holds every row written from now on.
ALTER TABLE tasks
    DROP CONSTRAINT tasks_check1,
    ADD COLUMN hand_backs integer NOT NULL DEFAULT 0,
    ADD CONSTRAINT tasks_hand_backs_check CHECK (hand_backs >= 0) NOT VALID,
    ADD CONSTRAINT tasks_charged_attempts CHECK (attempts - hand_backs <= max_attempts) NOT VALID,
    ADD CONSTRAINT tasks_hand_backs_made CHECK (hand_backs <= attempts) NOT VALID;

COMMENT ON COLUMN tasks.attempts IS
    'Attempts made, free hand-backs included: the number of the latest attempt.';
COMMENT ON COLUMN tasks.hand_backs IS
    'Attempts handed back by draining workers free of charge (at most MAX_FREE_HAND_BACKS); attempts - hand_backs <= max_attempts.';
