-- 0006: per-endpoint limits held region-wide (issue 14 item 2; dispatcher/limits.py).
--
-- Concurrency: the claim counts the endpoint's leased, unfinished rows.  Only
-- rows holding a claim token are in this partial index, so the count reads a
-- handful of entries however many rows wait in backoff; a claim adds one entry
-- per row it leases (its update is non-HOT anyway) and the result write, which
-- clears the token, adds none.
CREATE INDEX webhook_deliveries_leased ON webhook_deliveries (endpoint_id) WHERE claim_token IS NOT NULL;

-- Rate: optional, per endpoint; NULL (the default) is no rate limit.
ALTER TABLE webhook_endpoints ADD COLUMN max_per_second double precision
    CHECK (max_per_second > 0 AND max_per_second < 'Infinity');

-- The token bucket of each rate-limited endpoint, written by the claim.
CREATE TABLE endpoint_rate (
    endpoint_id bigint PRIMARY KEY,
    tokens      double precision NOT NULL,
    refilled_at timestamptz NOT NULL,
    last_taken  int NOT NULL DEFAULT 0
);

-- The rule (EndpointLimits in dispatcher/limits.py; tests/test_limits_rule.py
-- holds both to one table of cases).  Pure: elapsed time is an argument.
CREATE FUNCTION dispatcher_bucket_level(max_per_second double precision, stored double precision,
                                        elapsed double precision) RETURNS double precision
    LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN max_per_second IS NULL THEN NULL
                WHEN stored IS NULL THEN greatest(1.0, max_per_second)
                ELSE least(greatest(1.0, max_per_second), stored + max_per_second * greatest(elapsed, 0.0)) END
$$;

CREATE FUNCTION dispatcher_room(concurrency int, in_flight bigint, max_per_second double precision,
                                stored double precision, elapsed double precision) RETURNS int
    LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN max_per_second IS NULL THEN greatest(0, concurrency - in_flight)
                ELSE greatest(0, least(concurrency - in_flight,
                                       floor(dispatcher_bucket_level(max_per_second, stored, elapsed))))
           END::int
$$;

CREATE FUNCTION dispatcher_bucket_after(max_per_second double precision, stored double precision,
                                        elapsed double precision, taken bigint) RETURNS double precision
    LANGUAGE sql IMMUTABLE AS $$
    -- greatest() skips NULLs: no rate must stay NULL, not become 0.
    SELECT CASE WHEN max_per_second IS NOT NULL
                THEN greatest(0.0, dispatcher_bucket_level(max_per_second, stored, elapsed) - taken) END
$$;

-- What the claim calls per endpoint, after it took the endpoint's transaction
-- lock.  VOLATILE on purpose: in READ COMMITTED each statement of a volatile
-- function takes a fresh snapshot, so this sees the leases and the bucket that
-- a claimer which held the lock a moment ago committed after our claim
-- statement began.  The statement's own snapshot would miss them, and two
-- claimers could then both fill the same free slots.  PL/pgSQL keeps its plans
-- for the session; a LANGUAGE sql function was planned again in every claim
-- (0.25 ms per endpoint visited, measured with EXPLAIN ANALYZE).
CREATE FUNCTION dispatcher_lane_room(endpoint bigint, concurrency int, max_per_second double precision)
    RETURNS int LANGUAGE plpgsql VOLATILE
    -- The dispatcher's sessions plan every statement afresh (store/engine.py,
    -- force_custom_plan); these two are single-row probes by key, so a kept
    -- plan is right, and replanning them cost 0.7 ms per endpoint visited.
    SET plan_cache_mode = auto AS $$
DECLARE
    leased bigint;
    stored double precision;
    elapsed double precision;
BEGIN
    SELECT count(*) INTO leased FROM webhook_deliveries d
     WHERE d.endpoint_id = endpoint AND d.claim_token IS NOT NULL AND d.status = 'pending'
       AND d.locked_until > now();
    IF max_per_second IS NOT NULL THEN
        SELECT r.tokens, extract(epoch FROM now() - r.refilled_at)::float8 INTO stored, elapsed
          FROM endpoint_rate r WHERE r.endpoint_id = endpoint;
    END IF;
    RETURN dispatcher_room(concurrency, leased, max_per_second, stored, elapsed);
END
$$;
