-- 0010: customer self-service (issue 12): per-endpoint secrets, endpoint
-- descriptions, token prefixes / expiry / last use, and the audit log.
-- Every added column is nullable, so outside tools' INSERTs naming only the
-- contract columns keep working.

-- The endpoint's own signing secret. NULL: the endpoint signs with its
-- workspace's secret (every endpoint registered before 0010, and the CLI's
-- `endpoint add`) until its first rotation. previous_secret also signs until
-- secret_rotated_at + secrets.rotation_grace; at the first rotation it is the
-- workspace secret the endpoint was signing with.
ALTER TABLE webhook_endpoints
    ADD COLUMN secret            text CHECK (secret <> ''),
    ADD COLUMN previous_secret   text,
    ADD COLUMN secret_rotated_at timestamptz,
    ADD COLUMN description       text CHECK (length(description) <= 500);

-- A workspace secret is never empty: an empty key would sign nothing the
-- customer could trust (the engine also refuses to send with none).
-- NOT VALID: rows written before 0010 are not re-checked at migration time.
ALTER TABLE workspaces ADD CONSTRAINT workspaces_secret_not_empty CHECK (secret <> '') NOT VALID;

-- token_prefix: the first 12 characters, shown by `token list` and the API
-- so a customer can tell tokens apart (8 random characters: not enough to
-- guess the remaining 256 bits). NULL for tokens created before 0010.
-- last_used_at is written at most once a minute per token (api/auth.py).
ALTER TABLE api_tokens
    ADD COLUMN token_prefix text,
    ADD COLUMN expires_at   timestamptz,
    ADD COLUMN last_used_at timestamptz;
CREATE INDEX api_tokens_workspace ON api_tokens (workspace_id, id);

-- Who did what, written in the same transaction as the change it records.
-- token_id NULL: an operator's CLI command. No foreign keys: an entry
-- outlives the token, the endpoint and the rows it names.
CREATE TABLE api_audit (
    id           bigserial PRIMARY KEY,
    workspace_id text NOT NULL,
    at           timestamptz NOT NULL DEFAULT now(),
    token_id     bigint,
    action       text NOT NULL CHECK (action IN ('delivery.replay', 'endpoint.recover', 'endpoint.create',
                                                 'endpoint.update', 'endpoint.delete', 'endpoint.breaker_close',
                                                 'endpoint.secret_rotate', 'workspace.update')),
    endpoint_id  bigint,
    delivery_ids bigint[] NOT NULL DEFAULT '{}',
    detail       jsonb NOT NULL DEFAULT '{}'
);
CREATE INDEX api_audit_workspace ON api_audit (workspace_id, id);
CREATE INDEX api_audit_endpoint ON api_audit (endpoint_id, id) WHERE endpoint_id IS NOT NULL;

-- The endpoint list's 24 h success rate reads an endpoint's recent attempts;
-- without this it would scan the whole attempt history. Attempts are
-- insert-only, so the cost is one index entry per attempt.
CREATE INDEX webhook_delivery_attempts_endpoint ON webhook_delivery_attempts (endpoint_id, started_at);

-- Which secrets sign a delivery: the endpoint's own once it has one, else its
-- workspace's; the previous one of whichever too while its rotation is
-- younger than `grace` seconds (secrets.rotation_grace). Returns {current,
-- previous-or-NULL}. The one rule, used by the claim (engine_claim) and the
-- legacy flag-off path (dispatcher_send_event, 0012); a plain SQL expression, so
-- the planner inlines it into the claim.
CREATE FUNCTION dispatcher_signing_secrets(endpoint_secret text, endpoint_previous text,
                                           endpoint_rotated_at timestamptz, workspace_secret text,
                                           workspace_previous text, workspace_rotated_at timestamptz,
                                           grace float8) RETURNS text[]
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN endpoint_secret IS NOT NULL
                THEN ARRAY[endpoint_secret, CASE WHEN endpoint_rotated_at > now() - make_interval(secs => grace)
                                                 THEN endpoint_previous END]
                ELSE ARRAY[workspace_secret, CASE WHEN workspace_rotated_at > now() - make_interval(secs => grace)
                                                  THEN workspace_previous END]
           END
$$;
