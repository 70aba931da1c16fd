-- 0026: the outbox partitioned by day, step 2 of 3 (docs/operations.md,
-- "Partitioning the outbox").  Everything 0027 needs that takes time, done
-- while producers and workers go on:
--
--  * VALIDATE the legacy bounds 0025 added (each a scan of its table under
--    SHARE UPDATE EXCLUSIVE, which conflicts with no insert, update or read),
--    and the two NOT VALID checks of webhook_deliveries (0015, 0020): a
--    partitioned table's checks are valid ones, and a partition's NOT VALID
--    check with the same name would refuse the attach.  Every row already
--    meets them (0015 rewrote the rows they were written for).
--  * the indexes the partitioned tables have and the legacy tables lack,
--    built CONCURRENTLY (no lock that stops a writer), under the names
--    0027 gives them on the *_before partitions: events' new keys carry the
--    partition key (a partitioned table's unique keys must), and a BRIN index
--    on webhook_deliveries.event_day finds the deliveries that still refer
--    to an events partition (retention of events).  A build interrupted
--    before leaves an invalid index behind: each is dropped first, then built.
--
-- migrate: each statement on its own
ALTER TABLE webhook_deliveries VALIDATE CONSTRAINT webhook_deliveries_before_bound;
ALTER TABLE webhook_deliveries VALIDATE CONSTRAINT webhook_deliveries_status_check;
ALTER TABLE webhook_deliveries VALIDATE CONSTRAINT webhook_deliveries_shadow_status;
ALTER TABLE webhook_delivery_attempts VALIDATE CONSTRAINT webhook_delivery_attempts_before_bound;
ALTER TABLE events VALIDATE CONSTRAINT events_before_bound;
DROP INDEX CONCURRENTLY IF EXISTS events_before_pkey;
CREATE UNIQUE INDEX CONCURRENTLY events_before_pkey ON events (workspace_id, id, day);
DROP INDEX CONCURRENTLY IF EXISTS events_before_workspace_id_sequence_day_key;
CREATE UNIQUE INDEX CONCURRENTLY events_before_workspace_id_sequence_day_key ON events (workspace_id, sequence, day);
DROP INDEX CONCURRENTLY IF EXISTS webhook_deliveries_before_event_day_idx;
CREATE INDEX CONCURRENTLY webhook_deliveries_before_event_day_idx ON webhook_deliveries USING brin (event_day);
