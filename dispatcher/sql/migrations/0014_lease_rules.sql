-- 0014: the lease rules each get one definition (issue 20, "One home per rule").
-- Both are new functions; no table changes, so a dispatcher older than 0014
-- keeps working during an upgrade.

-- Is a delivery free of a lease?  Every query that passes over leased rows
-- (the claim, the breaker probe, the backlog figures, status, the expiry
-- sweep, the API's endpoint changes) asks this, with the row's locked_until.
--
-- The boundary: a lease stamped until T is over AT T, so the row is free when
-- locked_until <= now().  The claim stamps now() + lease, so a lease of N
-- seconds holds for exactly N seconds ([claim, T)); the lane ledger counts
-- the same claim while until > now() (dispatcher_lane_free, 0013), so at T
-- the row comes free and its lane slot comes back in the same instant, never
-- one without the other.  Freeing the row at T rather than just after it is
-- safe: a late result of the old owner is fenced by claim_token, not by time.
-- (The expiry sweep used locked_until < now() until now; it differed from
-- this only at the single microsecond T.)
--
-- LANGUAGE sql STABLE with one expression and no STRICT, SET or SECURITY
-- DEFINER: the planner inlines it, so a query calling it is planned exactly
-- as if it spelled the expression (the claim's plan is unchanged: EXPLAIN,
-- tests/test_lease_rules.py).  now() is stable, so STABLE is the narrowest
-- class that still inlines; IMMUTABLE would stop the inlining.
CREATE FUNCTION dispatcher_unleased(locked_until timestamptz) RETURNS boolean
    LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT locked_until IS NULL OR locked_until <= now()
$$;

-- The lane slots of finished or released rows go back to the ledger
-- (endpoint_leases, 0013): one entry (endpoint, claim) per row given back,
-- in two parallel arrays.  An entry whose count reaches zero is deleted.
-- Called by engine_record (results written) and engine_release (rows handed
-- back unsent) with exactly the rows each statement wrote, so the same rows
-- never give a slot back twice.  One statement, so the DELETE and the UPDATE
-- see one snapshot and each entry takes exactly one of them.  PL/pgSQL keeps
-- the statement's plan for the session, as engine_record (a prepared
-- statement, store/engine.py KEPT_PLANS) kept it when the statement was
-- written inline; a LANGUAGE sql function would be planned on every flush.
CREATE FUNCTION dispatcher_lanes_give_back(endpoint_ids bigint[], claim_tokens bigint[]) RETURNS void
    LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    WITH lanes AS (
        SELECT r.endpoint_id, r.token, count(*) AS done
          FROM unnest(endpoint_ids, claim_tokens) AS r(endpoint_id, token)
         GROUP BY r.endpoint_id, r.token
    ), emptied AS (
        DELETE FROM endpoint_leases l USING lanes x
         WHERE l.endpoint_id = x.endpoint_id AND l.claim_token = x.token AND l.leased <= x.done
    )
    UPDATE endpoint_leases l SET leased = l.leased - x.done FROM lanes x
     WHERE l.endpoint_id = x.endpoint_id AND l.claim_token = x.token AND l.leased > x.done;
END
$$;
