-- 0011: who owns an endpoint, and the breaker notices sent to them (issue 12 item 4, docs/decisions.md, Q3).

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

-- The producer's function sends to customer endpoints only (e.purpose =
-- 'customer'): migration 0012.

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
