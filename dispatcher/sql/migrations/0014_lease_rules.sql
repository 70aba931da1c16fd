-- 0014: the lease rule gets one definition (issue 20, "One home per rule").
-- A new function; no table changes, so a dispatcher older than 0014
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
