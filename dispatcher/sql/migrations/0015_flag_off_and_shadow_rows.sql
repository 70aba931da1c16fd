-- 0015: the flag-off path numbers every event, and never refuses one; a
-- shadow row is never a delivery.
--
-- dispatcher_send_event (0012) again, with one more output column, so DROP
-- and CREATE (a function's result type cannot change in place). Callers name
-- the columns they read, so a producer of the previous release keeps working
-- against this one.
--
-- Outbox on: unchanged, statement for statement.
--
-- Outbox off (today's synchronous POST, made by send() itself):
--  * the event is numbered from event_sequence, with or without shadow
--    writes, so the body the legacy path POSTs carries a sequence like the
--    dispatcher's. nextval takes no row lock and is not rolled back: producers
--    of one workspace never wait for each other's transactions, on this path
--    as on the outbox path (docs/producer.md, "Sequences").
--  * shadow writes (rollout phase 0) are skipped, never refused, when they
--    cannot be written: the id is already taken in the workspace
--    (skipped = 'duplicate_id'; the insert is ON CONFLICT DO NOTHING, so the
--    caller's transaction stays usable), or the transaction is read-only.
--  * in a read-only transaction (a hot standby included) Postgres refuses
--    nextval and every insert: nothing is numbered or written
--    (skipped = 'read_only') and the POST goes out without a sequence, as it
--    did before this migration; send() logs it.
-- No row at all: unknown workspace.
DROP FUNCTION dispatcher_send_event(text, text, text, timestamptz, jsonb, text, boolean, float8);

CREATE FUNCTION dispatcher_send_event(
    p_workspace_id text, p_event_id text, p_type text, p_occurred_at timestamptz,
    p_payload jsonb, p_payload_hash text, p_shadow_writes boolean, p_grace float8)
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
        INSERT INTO events (id, workspace_id, type, sequence, occurred_at, payload)
        VALUES (p_event_id, p_workspace_id, p_type, numbered, coalesce(p_occurred_at, now()), p_payload)
        ON CONFLICT (workspace_id, id) DO NOTHING;
        IF NOT FOUND THEN
            RETURN QUERY SELECT 'duplicate'::text, NULL::bigint, 0, NULL::jsonb, NULL::text, NULL::text;
            RETURN;
        END IF;
        -- The hot path: one INSERT ... SELECT, nothing returned but the count.
        INSERT INTO webhook_deliveries (workspace_id, endpoint_id, event_id, payload_hash, mode)
        SELECT p_workspace_id, e.id, p_event_id, p_payload_hash, 'live'
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
            INSERT INTO events (id, workspace_id, type, sequence, occurred_at, payload)
            VALUES (p_event_id, p_workspace_id, p_type, numbered, coalesce(p_occurred_at, now()), p_payload)
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

-- A shadow row is never a delivery (docs/decisions.md, Shadow rows). The
-- dispatcher marks it `shadow`, a status of its own, and its attempt-history
-- entry's result is `shadow`, so nothing that counts deliveries (the API's
-- history and filters, `dispatcher status`, delivered_at, the gates) can
-- count one. The second constraint holds the pairing both ways: a live row
-- is never `shadow`, a shadow row never `delivered`. Both are NOT VALID: the
-- rows they would check are the ones rewritten here, so no scan re-checks
-- them under the table lock.
--
-- Rows a dispatcher marked before this migration (status and result
-- `delivered`, without a POST) become what they are. The one scan of the
-- outbox (no index has `mode`) collects their ids first, under ACCESS SHARE
-- (producers and claims go on); with them the ids of shadow rows still
-- pending, which an older dispatcher may mark before the lock below is
-- granted (a shadow row committed after the scan and marked in the instant
-- before the lock would keep `delivered`). Only then is the old check dropped (ACCESS EXCLUSIVE on
-- webhook_deliveries, held to the commit), and the collected rows and their
-- history are rewritten by key: the lock lasts as long as there are shadow
-- rows to rewrite, not as long as the table is. A dispatcher older than this
-- migration can no longer record a shadow row's mark (the database refuses
-- it, and the row is claimed again once its lease lapses): start the new
-- version, then stop the old one (docs/operations.md, "Upgrading").
CREATE TEMPORARY TABLE shadow_marked ON COMMIT DROP AS
SELECT id FROM webhook_deliveries WHERE mode = 'shadow' AND status IN ('delivered', 'pending');

ALTER TABLE webhook_deliveries DROP CONSTRAINT webhook_deliveries_status_check;

-- `= ANY (array)` from an InitPlan, not a join: the planner cannot size the
-- array, so it reads both tables by key (webhook_delivery_attempts_delivery,
-- the primary key), where a join costed at 1 % of the rows chose to scan them.
UPDATE webhook_delivery_attempts
   SET result = 'shadow'
 WHERE delivery_id = ANY ((SELECT array_agg(id) FROM shadow_marked)::bigint[]) AND result = 'delivered';

UPDATE webhook_deliveries
   SET status = 'shadow', delivered_at = NULL
 WHERE id = ANY ((SELECT array_agg(id) FROM shadow_marked)::bigint[]) AND status = 'delivered';

ALTER TABLE webhook_deliveries
    ADD CONSTRAINT webhook_deliveries_status_check
        CHECK (status IN ('pending', 'delivered', 'failed', 'dead', 'shadow')) NOT VALID,
    ADD CONSTRAINT webhook_deliveries_shadow_status
        CHECK (status NOT IN ('delivered', 'shadow') OR (status = 'shadow') = (mode = 'shadow')) NOT VALID;
