-- 0013: the lease lives in unindexed columns, and region-wide lanes are
-- counted in a ledger (issue 14 item 5, docs/claim.md).
--
-- Until now the claim stamped a lease by moving next_attempt_at to the lease's
-- end and setting claim_token.  next_attempt_at is in two indexes and
-- claim_token is the predicate of webhook_deliveries_leased, so every claimed
-- row was a non-HOT update: a new heap tuple plus one entry in every index of
-- webhook_deliveries (about ten WAL records per row, most of the database's
-- time per delivery).  From here on the claim writes only locked_until,
-- locked_by and claim_token, which no index names, so Postgres can update the
-- row in place (HOT) when its page has room.  Consequences, held in
-- dispatcher/sql/engine.sql and operations.sql:
--  * a leased row keeps its due time; the due scans skip rows whose
--    locked_until is still ahead (a crashed owner's rows come due again when
--    it lapses, as before);
--  * an endpoint's leased rows can no longer be counted through an index of
--    webhook_deliveries, so each claim records what it leased per endpoint in
--    endpoint_leases, and each result write or release takes its rows back.
DROP INDEX webhook_deliveries_leased;

-- Room on each page for the lease's new row version, which a HOT update must
-- place on the same page.  An event's deliveries are inserted side by side and
-- a claim takes many of them at once: at 80 % about 40 % of the claimed rows
-- found room, at 50 % about 90 % (docs/benchmarks.md).  Applies to pages
-- written from now on (no rewrite).  The DROP INDEX above holds an ACCESS
-- EXCLUSIVE lock on the table until the migration commits, a moment later.
ALTER TABLE webhook_deliveries SET (fillfactor = 50);

-- One row per (endpoint, claim): how many of the endpoint's rows that claim
-- still leases, and until when.  An entry whose lease lapsed counts for
-- nothing (its owner died or stalled; the rows come due again) and the
-- upkeep leader deletes it; the supervisor deletes a dead worker's at once.
CREATE TABLE endpoint_leases (
    endpoint_id bigint NOT NULL,
    claim_token bigint NOT NULL,
    owner       text NOT NULL,
    leased      int NOT NULL CHECK (leased >= 0),
    until       timestamptz NOT NULL,
    PRIMARY KEY (endpoint_id, claim_token)
) WITH (fillfactor = 70);

-- The claim's per-endpoint room, after it took the endpoint's transaction
-- lock: the rule is 0006's dispatcher_room; only where the leases are counted
-- changed.  VOLATILE for a fresh snapshot (see 0006's dispatcher_lane_room:
-- it must see what the previous holder of the lock committed).
-- Its two reads are probes by key, planned once per session (plan_cache_mode
-- auto, as 0006's).  The ledger is small and churns: planned from its
-- statistics it was read by a sequential scan over its dead entries, a
-- quarter of the database's time per delivery (perf, docs/benchmarks.md);
-- enable_seqscan off holds both reads to their primary keys.
CREATE FUNCTION dispatcher_lane_free(endpoint bigint, concurrency int, max_per_second double precision)
    RETURNS int LANGUAGE plpgsql VOLATILE
    SET plan_cache_mode = auto SET enable_seqscan = off AS $$
DECLARE
    leased bigint;
    stored double precision;
    elapsed double precision;
BEGIN
    SELECT coalesce(sum(l.leased), 0) INTO leased FROM endpoint_leases l
     WHERE l.endpoint_id = endpoint AND l.until > now();
    IF max_per_second IS NOT NULL THEN
        SELECT r.tokens, extract(epoch FROM now() - r.refilled_at)::float8 INTO stored, elapsed
          FROM endpoint_rate r WHERE r.endpoint_id = endpoint;
    END IF;
    RETURN dispatcher_room(concurrency, leased, max_per_second, stored, elapsed);
END
$$;

-- A dispatcher older than 0013 still running during an upgrade would read a
-- row leased the new way (due time unchanged) as due and send it a second
-- time, outside the region-wide limit.  Its claim asks this function for
-- room, so it now gets none: an old dispatcher claims nothing (breaker probes
-- aside) until it is stopped, while new ones do the work (docs/operations.md).
CREATE OR REPLACE FUNCTION dispatcher_lane_room(endpoint bigint, concurrency int, max_per_second double precision)
    RETURNS int LANGUAGE sql IMMUTABLE AS $$
    SELECT 0
$$;
