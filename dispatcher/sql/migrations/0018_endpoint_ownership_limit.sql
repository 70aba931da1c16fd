-- 0018: a workspace owns at most 100 customer endpoints, active or not.
--
-- The 10-active limit alone let a workspace create any number of inactive
-- endpoints, and every one of them is listed, counted in the stats and kept
-- with its history: 5,000 of them made one stats answer 56 MB.  A new
-- endpoint (or one moved to another workspace) is refused past 100; a
-- workspace that already owns more keeps them, and may delete some.  The
-- operational endpoint (0011) counts toward neither limit.

CREATE OR REPLACE FUNCTION webhook_endpoints_limit() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    owned int;
BEGIN
    IF NEW.purpose = 'operational' THEN
        RETURN NEW;
    END IF;
    IF TG_OP = 'INSERT' OR NEW.workspace_id IS DISTINCT FROM OLD.workspace_id THEN
        PERFORM 1 FROM workspaces WHERE id = NEW.workspace_id FOR UPDATE;
        SELECT count(*) INTO owned FROM webhook_endpoints
         WHERE workspace_id = NEW.workspace_id AND purpose = 'customer' AND id <> NEW.id;
        IF owned >= 100 THEN
            RAISE EXCEPTION 'workspace % already has 100 endpoints, active or not', NEW.workspace_id
                USING ERRCODE = 'check_violation';
        END IF;
    END IF;
    IF NOT NEW.active THEN
        RETURN NEW;
    END IF;
    PERFORM 1 FROM workspaces WHERE id = NEW.workspace_id FOR UPDATE;
    SELECT count(*) INTO owned FROM webhook_endpoints
     WHERE workspace_id = NEW.workspace_id AND active AND purpose = 'customer' AND id <> NEW.id;
    IF owned >= 10 THEN
        RAISE EXCEPTION 'workspace % already has 10 active endpoints', NEW.workspace_id
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END;
$$;
