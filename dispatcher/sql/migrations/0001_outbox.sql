-- 0001: the outbox (RFC-014). These tables are contracts: outside tools
-- insert and read them directly, so columns are added, never renamed.

CREATE TABLE workspaces (
    id                text PRIMARY KEY,
    secret            text NOT NULL,
    previous_secret   text,
    secret_rotated_at timestamptz,
    flags             jsonb NOT NULL DEFAULT '{}',
    created_at        timestamptz NOT NULL DEFAULT now()
);

-- Per-workspace event sequence, kept out of `workspaces` so the producer's
-- increment (one new tuple per event) churns a tiny HOT-friendly table
-- instead of the row every claim joins.
CREATE TABLE event_sequences (
    workspace_id  text PRIMARY KEY REFERENCES workspaces ON DELETE CASCADE,
    last_sequence bigint NOT NULL DEFAULT 0
) WITH (fillfactor = 50);

CREATE TABLE webhook_endpoints (
    id           bigserial PRIMARY KEY,
    workspace_id text NOT NULL REFERENCES workspaces ON DELETE CASCADE,
    url          text NOT NULL,
    event_types  text[] NOT NULL DEFAULT '{}',
    active       boolean NOT NULL DEFAULT true,
    created_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX webhook_endpoints_workspace ON webhook_endpoints (workspace_id) WHERE active;

-- At most 10 active endpoints per workspace, enforced here so that every
-- writer (CLI, API, outside tools) obeys it. Locking the workspace row
-- serialises concurrent inserts, so two sessions cannot both see 9.
CREATE FUNCTION webhook_endpoints_limit() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    active_count int;
BEGIN
    IF NOT NEW.active THEN
        RETURN NEW;
    END IF;
    PERFORM 1 FROM workspaces WHERE id = NEW.workspace_id FOR UPDATE;
    SELECT count(*) INTO active_count FROM webhook_endpoints
     WHERE workspace_id = NEW.workspace_id AND active AND id <> NEW.id;
    IF active_count >= 10 THEN
        RAISE EXCEPTION 'workspace % already has 10 active endpoints', NEW.workspace_id
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END;
$$;
CREATE TRIGGER webhook_endpoints_limit BEFORE INSERT OR UPDATE OF active, workspace_id
    ON webhook_endpoints FOR EACH ROW EXECUTE FUNCTION webhook_endpoints_limit();

CREATE TABLE events (
    id           text PRIMARY KEY,
    workspace_id text NOT NULL,
    type         text NOT NULL,
    sequence     bigint NOT NULL,
    occurred_at  timestamptz NOT NULL DEFAULT now(),
    payload      jsonb NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    UNIQUE (workspace_id, sequence)
);

-- No foreign keys to events or endpoints: events age out under their own
-- retention and endpoints can be deleted, and a delivery must then end
-- `failed` with a reason instead of vanishing (and FK checks would cost the
-- producer's 2 ms budget).
CREATE TABLE webhook_deliveries (
    id               bigserial PRIMARY KEY,
    workspace_id     text NOT NULL,
    endpoint_id      bigint NOT NULL,
    event_id         text NOT NULL,
    payload_hash     text NOT NULL,
    attempt          int NOT NULL DEFAULT 0,
    status           text NOT NULL DEFAULT 'pending'
                     CHECK (status IN ('pending', 'delivered', 'failed', 'dead')),
    mode             text NOT NULL DEFAULT 'live' CHECK (mode IN ('live', 'shadow')),
    next_attempt_at  timestamptz NOT NULL DEFAULT now(),
    last_error       text,
    last_status_code int,
    created_at       timestamptz NOT NULL DEFAULT now(),
    delivered_at     timestamptz,
    finished_at      timestamptz,
    replay_of        bigint,
    locked_by        text,
    locked_until     timestamptz,
    claim_token      bigint
) WITH (fillfactor = 80);

-- The claim walks endpoints with due rows and takes a few from each
-- (docs/claim.md); this index serves both the per-endpoint probe and the
-- RFC's "partial index on next_attempt_at WHERE status = 'pending'" role.
CREATE INDEX webhook_deliveries_due
    ON webhook_deliveries (endpoint_id, next_attempt_at) WHERE status = 'pending';
-- Backlog age and alerts: oldest pending row without scanning per endpoint.
CREATE INDEX webhook_deliveries_pending_age
    ON webhook_deliveries (next_attempt_at) WHERE status = 'pending';
CREATE INDEX webhook_deliveries_event ON webhook_deliveries (event_id);
CREATE INDEX webhook_deliveries_workspace ON webhook_deliveries (workspace_id, id);

CREATE SEQUENCE webhook_claim_tokens;

CREATE TABLE webhook_delivery_attempts (
    id               bigserial PRIMARY KEY,
    delivery_id      bigint NOT NULL,
    endpoint_id      bigint NOT NULL,
    attempt          int NOT NULL,
    started_at       timestamptz NOT NULL,
    duration_ms      int NOT NULL,
    result           text NOT NULL,
    status_code      int,
    error            text,
    response_excerpt text,
    claim_token      bigint
);
CREATE INDEX webhook_delivery_attempts_delivery ON webhook_delivery_attempts (delivery_id, attempt);

CREATE TABLE endpoint_state (
    endpoint_id          bigint PRIMARY KEY,
    state                text NOT NULL DEFAULT 'closed'
                         CHECK (state IN ('closed', 'open', 'half_open')),
    consecutive_failures int NOT NULL DEFAULT 0,
    open_until           timestamptz,
    opened_at            timestamptz,
    last_success_at      timestamptz,
    last_failure_at      timestamptz,
    last_error           text,
    updated_at           timestamptz NOT NULL DEFAULT now()
) WITH (fillfactor = 70);
