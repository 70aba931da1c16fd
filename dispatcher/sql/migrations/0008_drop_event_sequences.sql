-- 0008: the per-workspace counter table that event_sequence replaced (0004 read
-- it one last time to continue above its numbers); nothing reads or writes it.
DROP TABLE event_sequences;
