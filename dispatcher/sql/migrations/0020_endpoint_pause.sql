-- 0020: lossless pause and resume of an endpoint, and its lifecycle notices
-- (issue 24, sections 1 and 2; docs/operations.md, "Pausing an endpoint").
--
-- A paused endpoint's rows are `held`: written (the producer), kept in order,
-- never claimed, no attempt consumed.  `held` is a status of its own, so every
-- index and query that reads `pending` (the claim's walk, probes, the backlog
-- figures, the expiry sweep) passes them over without a new filter: pausing
-- costs the claim nothing.  Resume makes them `pending` again in one UPDATE.
ALTER TABLE webhook_endpoints
    ADD COLUMN paused_at timestamptz,
    ADD COLUMN pause_cause text CHECK (pause_cause IN ('customer', 'operator', 'lifecycle')),
    ADD CONSTRAINT webhook_endpoints_pause_check CHECK ((paused_at IS NULL) = (pause_cause IS NULL));
CREATE INDEX webhook_endpoints_paused ON webhook_endpoints (id) WHERE paused_at IS NOT NULL;

-- The seconds a row spent held: they do not count toward its retry ceiling
-- (its age is now() - created_at - held_seconds: engine_claim, engine_sweep_expired).
-- A constant default: no table rewrite.
ALTER TABLE webhook_deliveries ADD COLUMN held_seconds float8 NOT NULL DEFAULT 0;

-- NOT VALID like 0015's: the old rows cannot break the new list, so no scan under the lock.
ALTER TABLE webhook_deliveries DROP CONSTRAINT webhook_deliveries_status_check;
ALTER TABLE webhook_deliveries
    ADD CONSTRAINT webhook_deliveries_status_check
        CHECK (status IN ('pending', 'held', 'delivered', 'failed', 'dead', 'shadow')) NOT VALID;

-- Held rows of one endpoint, oldest first: resume, the hold's expiry, delete's count.
CREATE INDEX webhook_deliveries_held ON webhook_deliveries (endpoint_id, created_at) WHERE status = 'held';

-- Pause and resume are audited like every endpoint change.
ALTER TABLE api_audit DROP CONSTRAINT api_audit_action_check;
ALTER TABLE api_audit ADD CONSTRAINT api_audit_action_check CHECK (action IN (
    'delivery.replay', 'endpoint.recover', 'endpoint.create', 'endpoint.update', 'endpoint.delete',
    'endpoint.breaker_close', 'endpoint.secret_rotate', 'workspace.update', 'endpoint.pause', 'endpoint.resume'));

-- The lifecycle (dispatcher/rules/lifecycle.py decides, dispatcher/engine/notifier.py
-- applies): one row per endpoint that ever had an episode.  An episode runs
-- from the breaker opening (or a pause) until the breaker has stayed closed
-- for endpoints.flap_window (closed_at: since when), or the resume; a
-- reopen within that window continues it, so a flapping endpoint is one
-- episode's notices, not a storm, and still reaches endpoints.disable_after
-- from failing_since.  stage and next_step_at are what the console shows.
CREATE TABLE endpoint_lifecycle (
    endpoint_id   bigint PRIMARY KEY,
    episode       bigint NOT NULL,
    failing_since timestamptz,
    closed_at     timestamptz,
    ended_at      timestamptz,
    stage         text NOT NULL DEFAULT 'healthy'
                  CHECK (stage IN ('healthy', 'failing', 'will_pause', 'paused')),
    next_step     text,
    next_step_at  timestamptz,
    updated_at    timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX endpoint_lifecycle_running ON endpoint_lifecycle (endpoint_id) WHERE ended_at IS NULL;

-- Episodes announced as opened and not yet recovered keep running under the
-- new numbering (the notices' episode is now the lifecycle's).
INSERT INTO endpoint_lifecycle (endpoint_id, episode, failing_since, stage)
SELECT n.endpoint_id, max(n.episode), min(n.created_at), 'failing'
  FROM breaker_notices n
 WHERE n.kind = 'opened'
   AND NOT EXISTS (SELECT 1 FROM breaker_notices r
                    WHERE r.endpoint_id = n.endpoint_id AND r.episode = n.episode AND r.kind = 'recovered')
 GROUP BY n.endpoint_id;

-- The lifecycle's stages as notice kinds: 'opened' is the failing notice
-- (kept: its event type is public), 'will_pause' a day before the automatic
-- pause, 'paused', 'expiring' before held rows reach endpoints.hold_for, and
-- 'recovered'.  detail keeps the dates the mail states, as they were decided.
ALTER TABLE breaker_notices DROP CONSTRAINT breaker_notices_kind_check;
ALTER TABLE breaker_notices
    ADD CONSTRAINT breaker_notices_kind_check
        CHECK (kind IN ('opened', 'will_pause', 'paused', 'expiring', 'recovered')),
    ADD COLUMN detail jsonb NOT NULL DEFAULT '{}';

-- The producer's function again (0015), one change: a delivery to a paused
-- endpoint is written `held`.  The endpoint row is the one the INSERT ...
-- SELECT already reads, so the cost per send is unchanged; the signature and
-- result are 0015's, so callers of either release keep working.
CREATE OR REPLACE FUNCTION dispatcher_send_event(
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
