-- 0011: who owns an endpoint, and the breaker notices sent to them (issue 12 item 4, decisions Q3).

-- The owner's email address, per endpoint and per workspace (the endpoint's wins);
-- NULL: nobody named, the operator address (notifier.smtp_to) gets the mail.
ALTER TABLE webhook_endpoints ADD COLUMN owner_contact text;
ALTER TABLE workspaces ADD COLUMN owner_contact text;
-- Optional: where the workspace wants breaker notices as an operational webhook.
ALTER TABLE workspaces ADD COLUMN notify_webhook_url text;

-- The operational webhook travels through the outbox like any delivery, so it
-- needs an endpoint row: one per workspace at most, kept in step with
-- notify_webhook_url by the notifier.  It receives no producer event
-- (send_event sends to 'customer' endpoints only) and does not count toward
-- the ten active endpoints.
ALTER TABLE webhook_endpoints ADD COLUMN purpose text NOT NULL DEFAULT 'customer'
    CHECK (purpose IN ('customer', 'operational'));
CREATE UNIQUE INDEX webhook_endpoints_operational ON webhook_endpoints (workspace_id) WHERE purpose = 'operational';

CREATE OR REPLACE FUNCTION webhook_endpoints_limit() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    active_count int;
BEGIN
    IF NOT NEW.active OR NEW.purpose = 'operational' THEN
        RETURN NEW;
    END IF;
    PERFORM 1 FROM workspaces WHERE id = NEW.workspace_id FOR UPDATE;
    SELECT count(*) INTO active_count FROM webhook_endpoints
     WHERE workspace_id = NEW.workspace_id AND active AND purpose = 'customer' AND id <> NEW.id;
    IF active_count >= 10 THEN
        RAISE EXCEPTION 'workspace % already has 10 active endpoints', NEW.workspace_id
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END;
$$;

-- The producer's function (migration 0008) as it was, but for one filter in
-- both target lists: producer events go to customer endpoints only
-- (e.purpose = 'customer'), never to the operational one, in live, shadow
-- and legacy mode alike.
CREATE OR REPLACE FUNCTION dispatcher_send_event(
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
         WHERE e.workspace_id = p_workspace_id AND e.active AND e.purpose = 'customer'
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
     WHERE e.workspace_id = p_workspace_id AND e.active AND e.purpose = 'customer'
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

-- An open episode runs from a closed -> open transition to the next close;
-- the breaker write counts them (engine_breaker_write), so every process
-- names the same episode by the same number.  Breakers open right now count
-- as episode 1, so their owners hear of them too.
ALTER TABLE endpoint_state ADD COLUMN open_episode bigint NOT NULL DEFAULT 0;
UPDATE endpoint_state SET open_episode = 1 WHERE state <> 'closed';

-- One row per notice: 'opened' and 'recovered' once per endpoint and episode,
-- whichever process finds it first (INSERT ... ON CONFLICT DO NOTHING).  The
-- row is also the mail's retry state: claimed by moving next_attempt_at past
-- a lease, ended by sent_at (mailed) or by next_attempt_at NULL (given up).
CREATE TABLE breaker_notices (
    endpoint_id     bigint NOT NULL,
    episode         bigint NOT NULL,
    kind            text NOT NULL CHECK (kind IN ('opened', 'recovered')),
    workspace_id    text NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    attempts        int NOT NULL DEFAULT 0,
    next_attempt_at timestamptz DEFAULT now(),
    sent_at         timestamptz,
    recipient       text,
    last_error      text,
    PRIMARY KEY (endpoint_id, episode, kind)
);
CREATE INDEX breaker_notices_due ON breaker_notices (next_attempt_at) WHERE sent_at IS NULL;
