-- 0022: OpenTelemetry trace context (issue 26; docs/operations.md, "Tracing").
--
-- events.trace_context: the W3C trace context ({"traceparent": ...,
-- "tracestate": ...}) of the span that was current when send() ran, or NULL
-- (no span, or tracing off). The worker links each attempt's span to it.
--
-- webhook_deliveries.trace_context: the delivery's own trace. The first
-- attempt's span is its root and its traceparent is kept here (written by the
-- result write, engine_record, in the same statement): every later attempt of
-- the row is a child of it, so one delivery is one trace however many hours
-- its retries take. A replay row starts with the replay request's traceparent
-- (or none: its first attempt is then a new root) and "replayed_from", the
-- original row's traceparent, which its attempts link to. Neither column is
-- indexed, so the engine's updates stay HOT.
--
-- webhook_delivery_attempts.trace_id: the attempt span's trace id (hex), so an
-- event's history leads to its trace.
--
-- webhook_endpoints.trace_headers: whether POSTs to the endpoint carry
-- traceparent/tracestate (on by default; docs/api.md).
--
-- dispatcher_send_event (0015) again, with a last parameter p_trace_context
-- that defaults to NULL: a producer of the previous release (eight
-- arguments) resolves to this function and keeps working. Statement for
-- statement as 0015 otherwise: the context travels in the same round trip.
ALTER TABLE events ADD COLUMN trace_context jsonb;
ALTER TABLE webhook_deliveries ADD COLUMN trace_context jsonb;
ALTER TABLE webhook_delivery_attempts ADD COLUMN trace_id text;
ALTER TABLE webhook_endpoints ADD COLUMN trace_headers boolean NOT NULL DEFAULT true;

-- The trace id of a W3C traceparent whose sampled flag (bit 0 of the last
-- byte) is set, else NULL: an unsampled trace was never stored anywhere, so
-- the API shows no id that leads nowhere (tracing.is_sampled is its twin).
CREATE FUNCTION dispatcher_sampled_trace_id(traceparent text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN traceparent ~ '^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f][13579bdf]$'
                THEN substr(traceparent, 4, 32) END
$$;

DROP FUNCTION dispatcher_send_event(text, text, text, timestamptz, jsonb, text, boolean, float8);

CREATE FUNCTION dispatcher_send_event(
    p_workspace_id text, p_event_id text, p_type text, p_occurred_at timestamptz,
    p_payload jsonb, p_payload_hash text, p_shadow_writes boolean, p_grace float8,
    p_trace_context jsonb DEFAULT NULL)
RETURNS TABLE (mode text, sequence bigint, deliveries int, legacy_targets jsonb, legacy_payload text,
               skipped text)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    outbox boolean;
    numbered bigint;
    targets jsonb;
    written int := 0;
    shadow boolean := false;
    why text;
BEGIN
    -- A scalar subquery for the one-row settings table: joined, its
    -- unanalysed row estimate (~2000) pushed the cost past JIT's threshold.
    SELECT webhook_outbox_on(w.flags -> 'webhook_outbox', r.list,
                             (SELECT s.percent FROM rollout_settings s), rollout_bucket(w.id))
      INTO outbox
      FROM workspaces w
      LEFT JOIN rollout_workspaces r ON r.workspace_id = w.id
     WHERE w.id = p_workspace_id;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF outbox THEN
        numbered := nextval('event_sequence');
        INSERT INTO events (id, workspace_id, type, sequence, occurred_at, payload, trace_context)
        VALUES (p_event_id, p_workspace_id, p_type, numbered, coalesce(p_occurred_at, now()), p_payload,
                p_trace_context)
        ON CONFLICT (workspace_id, id) DO NOTHING;
        IF NOT FOUND THEN
            RETURN QUERY SELECT 'duplicate'::text, NULL::bigint, 0, NULL::jsonb, NULL::text, NULL::text;
            RETURN;
        END IF;
        -- The hot path: one INSERT ... SELECT, nothing returned but the count.
        -- A paused endpoint's row is written held (0020); this body supersedes 0020's.
        INSERT INTO webhook_deliveries (workspace_id, endpoint_id, event_id, payload_hash, mode, status)
        SELECT p_workspace_id, e.id, p_event_id, p_payload_hash, 'live',
               CASE WHEN e.paused_at IS NULL THEN 'pending' ELSE 'held' END
          FROM webhook_endpoints e
         WHERE e.workspace_id = p_workspace_id AND e.active AND e.purpose = 'customer'
           AND (e.event_types = '{}' OR p_type = ANY (e.event_types));
        GET DIAGNOSTICS written = ROW_COUNT;
        RETURN QUERY SELECT 'live'::text, numbered, written, NULL::jsonb, NULL::text, NULL::text;
        RETURN;
    END IF;
    -- Outbox off: whatever happens below, the caller gets its targets and POSTs.
    IF current_setting('transaction_read_only') = 'on' THEN
        why := 'read_only';
    ELSE
        numbered := nextval('event_sequence');
        IF p_shadow_writes THEN
            INSERT INTO events (id, workspace_id, type, sequence, occurred_at, payload, trace_context)
            VALUES (p_event_id, p_workspace_id, p_type, numbered, coalesce(p_occurred_at, now()), p_payload,
                    p_trace_context)
            ON CONFLICT (workspace_id, id) DO NOTHING;
            shadow := FOUND;
            IF NOT shadow THEN
                why := 'duplicate_id';
            END IF;
        END IF;
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
    IF shadow THEN
        INSERT INTO webhook_deliveries (workspace_id, endpoint_id, event_id, payload_hash, mode)
        SELECT p_workspace_id, (t ->> 'id')::bigint, p_event_id, p_payload_hash, 'shadow'
          FROM jsonb_array_elements(targets) AS t;
        GET DIAGNOSTICS written = ROW_COUNT;
    END IF;
    -- jsonb's own text form, so the synchronous body is byte-identical to
    -- what the dispatcher sends for the same event (it reads payload::text).
    RETURN QUERY SELECT CASE WHEN shadow THEN 'shadow' END, numbered, written, targets, p_payload::text, why;
END;
$$;
