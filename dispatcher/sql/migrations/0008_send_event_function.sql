-- 0008: the producer's statement as a PL/pgSQL function (issue 10, G2).
--
-- send_event was one five-CTE statement that Postgres parsed and planned on
-- every call: about 0.3-0.5 ms of each send() (docs/benchmarks.md, EXPLAIN:
-- planning 0.485 ms against 0.71 ms execution). PL/pgSQL keeps each inner
-- statement's plan for the life of the session, so a producer's connection
-- plans them once; the outer `SELECT * FROM dispatcher_send_event(...)` is
-- trivial to plan. Unlike PREPARE this holds behind a transaction pooler
-- (PgBouncer pool_mode = transaction): the plan cache belongs to whichever
-- server backend runs the call, and nothing is named per client session.
--
-- The behaviour is the statement's, unchanged: the rollout rule
-- (webhook_outbox_on, migration 0004) picks the mode; a SEQUENCE numbers the
-- event (no row lock, so producers of one workspace never wait for each
-- other); the event and one delivery per active subscribed endpoint are
-- inserted; and when the outbox is off (mode NULL) or in shadow, what the
-- legacy synchronous path needs is returned. No row at all: unknown workspace.
CREATE FUNCTION dispatcher_send_event(
    p_workspace_id text, p_event_id text, p_type text, p_occurred_at timestamptz,
    p_payload jsonb, p_payload_hash text, p_shadow_writes boolean)
RETURNS TABLE (mode text, sequence bigint, deliveries int, secret text, previous_secret text,
               in_grace boolean, legacy_urls text[], legacy_payload text, legacy_endpoint_ids bigint[])
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    ws_secret text;
    ws_previous_secret text;
    ws_in_grace boolean;
    chosen text;
    target_ids bigint[];
    target_urls text[];
    numbered bigint;
    written int := 0;
BEGIN
    -- A scalar subquery for the one-row settings table: joined, its
    -- unanalysed row estimate (~2000) pushed the cost past JIT's threshold.
    SELECT w.secret, w.previous_secret, w.secret_rotated_at > now() - interval '24 hours',
           CASE WHEN webhook_outbox_on(w.flags -> 'webhook_outbox', r.list,
                                       (SELECT s.percent FROM rollout_settings s), rollout_bucket(w.id))
                THEN 'live'
                WHEN p_shadow_writes THEN 'shadow' END
      INTO ws_secret, ws_previous_secret, ws_in_grace, chosen
      FROM workspaces w
      LEFT JOIN rollout_workspaces r ON r.workspace_id = w.id
     WHERE w.id = p_workspace_id;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF chosen IS NOT NULL THEN
        numbered := nextval('event_sequence');
        INSERT INTO events (id, workspace_id, type, sequence, occurred_at, payload)
        VALUES (p_event_id, p_workspace_id, p_type, numbered, coalesce(p_occurred_at, now()), p_payload);
    END IF;
    IF chosen = 'live' THEN
        -- The hot path: one INSERT ... SELECT, nothing returned but the count.
        INSERT INTO webhook_deliveries (workspace_id, endpoint_id, event_id, payload_hash, mode)
        SELECT p_workspace_id, e.id, p_event_id, p_payload_hash, 'live'
          FROM webhook_endpoints e
         WHERE e.workspace_id = p_workspace_id AND e.active
           AND (e.event_types = '{}' OR p_type = ANY (e.event_types));
        GET DIAGNOSTICS written = ROW_COUNT;
        RETURN QUERY SELECT chosen, numbered, written, NULL::text, NULL::text, NULL::boolean,
                            NULL::text[], NULL::text, NULL::bigint[];
        RETURN;
    END IF;
    -- Off or shadow: the legacy path POSTs to these, in endpoint id order.
    SELECT coalesce(array_agg(e.id ORDER BY e.id), '{}'), coalesce(array_agg(e.url ORDER BY e.id), '{}')
      INTO target_ids, target_urls
      FROM webhook_endpoints e
     WHERE e.workspace_id = p_workspace_id AND e.active
       AND (e.event_types = '{}' OR p_type = ANY (e.event_types));
    IF chosen = 'shadow' THEN
        INSERT INTO webhook_deliveries (workspace_id, endpoint_id, event_id, payload_hash, mode)
        SELECT p_workspace_id, t.id, p_event_id, p_payload_hash, 'shadow' FROM unnest(target_ids) AS t(id);
        GET DIAGNOSTICS written = ROW_COUNT;
    END IF;
    -- jsonb's own text form, so the synchronous body is byte-identical to
    -- what the dispatcher sends for the same event (it reads payload::text).
    RETURN QUERY SELECT chosen, numbered, written, ws_secret, ws_previous_secret, ws_in_grace,
                        target_urls, p_payload::text, target_ids;
END;
$$;

-- The per-workspace counter table that event_sequence replaced (0004 read it
-- one last time to continue above its numbers); nothing reads or writes it.
DROP TABLE event_sequences;
