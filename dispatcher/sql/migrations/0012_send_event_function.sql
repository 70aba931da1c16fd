-- 0012: the producer's statement as a PL/pgSQL function (issue 10, G2).
--
-- send_event was one five-CTE statement that Postgres parsed and planned on
-- every call: about half of each send() (docs/benchmarks.md; EXPLAIN:
-- planning 0.485 ms against 0.71 ms execution). PL/pgSQL keeps each inner
-- statement's plan for the life of the session, so a producer's connection
-- plans them once, and the outer `SELECT ... FROM dispatcher_send_event(...)`
-- is trivial to plan. Unlike PREPARE this holds behind a transaction pooler
-- (PgBouncer pool_mode = transaction): the plan cache belongs to whichever
-- server backend runs the call, and nothing is named per client session.
--
-- One call, in the caller's transaction:
--  * the rollout rule (webhook_outbox_on, 0004) picks the mode: 'live',
--    'shadow' (shadow writes on) or NULL (outbox off, nothing written);
--  * a SEQUENCE numbers the event (no row lock: producers of one workspace
--    never wait for each other);
--  * the event is inserted unless the workspace already has one with this id
--    (0009: ids are unique per workspace). Then nothing is written and the
--    mode is 'duplicate', so send() raises a ProducerError and the caller's
--    transaction stays usable, where a unique violation would abort it;
--  * one delivery per active subscribed customer endpoint (0011: never the
--    workspace's operational endpoint);
--  * off or shadow: what the legacy synchronous path POSTs, per target
--    endpoint in id order: id, url and signing secrets by the claim's rule
--    (dispatcher_signing_secrets, 0010; p_grace = secrets.rotation_grace).
-- No row at all: unknown workspace.
CREATE FUNCTION dispatcher_send_event(
    p_workspace_id text, p_event_id text, p_type text, p_occurred_at timestamptz,
    p_payload jsonb, p_payload_hash text, p_shadow_writes boolean, p_grace float8)
RETURNS TABLE (mode text, sequence bigint, deliveries int, legacy_targets jsonb, legacy_payload text)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    chosen text;
    numbered bigint;
    targets jsonb;
    written int := 0;
BEGIN
    -- A scalar subquery for the one-row settings table: joined, its
    -- unanalysed row estimate (~2000) pushed the cost past JIT's threshold.
    SELECT CASE WHEN webhook_outbox_on(w.flags -> 'webhook_outbox', r.list,
                                       (SELECT s.percent FROM rollout_settings s), rollout_bucket(w.id))
                THEN 'live'
                WHEN p_shadow_writes THEN 'shadow' END
      INTO chosen
      FROM workspaces w
      LEFT JOIN rollout_workspaces r ON r.workspace_id = w.id
     WHERE w.id = p_workspace_id;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF chosen IS NOT NULL THEN
        numbered := nextval('event_sequence');
        INSERT INTO events (id, workspace_id, type, sequence, occurred_at, payload)
        VALUES (p_event_id, p_workspace_id, p_type, numbered, coalesce(p_occurred_at, now()), p_payload)
        ON CONFLICT (workspace_id, id) DO NOTHING;
        IF NOT FOUND THEN
            RETURN QUERY SELECT 'duplicate'::text, NULL::bigint, 0, NULL::jsonb, NULL::text;
            RETURN;
        END IF;
    END IF;
    IF chosen = 'live' THEN
        -- The hot path: one INSERT ... SELECT, nothing returned but the count.
        INSERT INTO webhook_deliveries (workspace_id, endpoint_id, event_id, payload_hash, mode)
        SELECT p_workspace_id, e.id, p_event_id, p_payload_hash, 'live'
          FROM webhook_endpoints e
         WHERE e.workspace_id = p_workspace_id AND e.active AND e.purpose = 'customer'
           AND (e.event_types = '{}' OR p_type = ANY (e.event_types));
        GET DIAGNOSTICS written = ROW_COUNT;
        RETURN QUERY SELECT chosen, numbered, written, NULL::jsonb, NULL::text;
        RETURN;
    END IF;
    SELECT coalesce(jsonb_agg(jsonb_build_object(
               'id', e.id, 'url', e.url,
               'secrets', dispatcher_signing_secrets(e.secret, e.previous_secret, e.secret_rotated_at,
                                                     w.secret, w.previous_secret, w.secret_rotated_at, p_grace))
               ORDER BY e.id), '[]')
      INTO targets
      FROM webhook_endpoints e JOIN workspaces w ON w.id = e.workspace_id
     WHERE e.workspace_id = p_workspace_id AND e.active AND e.purpose = 'customer'
       AND (e.event_types = '{}' OR p_type = ANY (e.event_types));
    IF chosen = 'shadow' THEN
        INSERT INTO webhook_deliveries (workspace_id, endpoint_id, event_id, payload_hash, mode)
        SELECT p_workspace_id, (t ->> 'id')::bigint, p_event_id, p_payload_hash, 'shadow'
          FROM jsonb_array_elements(targets) AS t;
        GET DIAGNOSTICS written = ROW_COUNT;
    END IF;
    -- jsonb's own text form, so the synchronous body is byte-identical to
    -- what the dispatcher sends for the same event (it reads payload::text).
    RETURN QUERY SELECT chosen, numbered, written, targets, p_payload::text;
END;
$$;
