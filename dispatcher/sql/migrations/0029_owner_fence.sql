-- 0029: a dead owner's last claim takes nothing (docs/claim.md, "A dead
-- owner's last claim").
--
-- A worker that exits (INT, QUIT, a crash) while its claim statement is on the
-- wire or running does not stop the statement: the server runs it to the end
-- and commits it before it finds the client gone.  The supervisor releases the
-- owner's rows as soon as it reaps the worker, so a claim that commits after
-- that release left its rows leased, and its lane slots held region-wide,
-- until the lease lapsed.
--
-- The fence: every claim calls dispatcher_owner_live(owner) before it leases a
-- row, which takes a shared lock on the owner for the rest of the claim's
-- transaction and, with a snapshot of its own (a volatile function's statement
-- sees what committed before it), looks for the owner among retired_owners.
-- dispatcher_release_owner(owner) takes the same lock exclusively: it waits
-- for a claim of the owner in flight to commit, retires the owner, and only
-- then releases, in statements whose snapshots see that claim's rows.  A claim
-- that comes later finds the owner retired and leases nothing.
--
-- Owner names are never reused (the supervisor's name carries a random part),
-- so a retired name fences no live worker; the upkeep leader deletes names
-- retired more than a day ago (engine_prune_leases).
CREATE TABLE retired_owners (
    owner      text PRIMARY KEY,
    retired_at timestamptz NOT NULL DEFAULT now()
);

-- Keys (0x0E15, hash of the owner): the lane locks use 0x0E14 (engine_claim).
CREATE FUNCTION dispatcher_owner_live(owner text) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM pg_advisory_xact_lock_shared(3605, hashtext(owner));
    RETURN NOT EXISTS (SELECT 1 FROM retired_owners r WHERE r.owner = dispatcher_owner_live.owner);
END;
$$;

CREATE FUNCTION dispatcher_release_owner(owner text) RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    released bigint;
BEGIN
    PERFORM pg_advisory_xact_lock(3605, hashtext(owner));
    INSERT INTO retired_owners AS r (owner) VALUES (dispatcher_release_owner.owner)
    ON CONFLICT ON CONSTRAINT retired_owners_pkey DO UPDATE SET retired_at = now();
    DELETE FROM region_leader l WHERE l.owner = dispatcher_release_owner.owner;
    DELETE FROM endpoint_leases l WHERE l.owner = dispatcher_release_owner.owner;
    UPDATE webhook_deliveries
       SET locked_by = NULL, locked_until = NULL, claim_token = NULL
     WHERE status = 'pending' AND locked_by = dispatcher_release_owner.owner;
    GET DIAGNOSTICS released = ROW_COUNT;
    RETURN released;
END;
$$;
