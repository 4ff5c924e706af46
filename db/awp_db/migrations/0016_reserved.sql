-- Reserved: another branch of this phase adds migration 0016 (the otel branch numbers its
-- own 0019). This placeholder only keeps the numbering without gaps until they merge;
-- the merge takes the other branch's file in its place.
SELECT 1;
