-- 0002: the delivery-history / replay API (issue 4, RFC-014 G4).
-- Like 0001 these tables are contracts: columns are added, never renamed.

-- Bearer tokens. Only the SHA-256 of a token is stored, so a leaked table or
-- backup cannot be used against the API. Tokens carry 256 random bits, so an
-- unsalted fast hash is enough: there is no dictionary to attack.
CREATE TABLE api_tokens (
    id           bigserial PRIMARY KEY,
    token_sha256 text NOT NULL UNIQUE CHECK (token_sha256 ~ '^[0-9a-f]{64}$'),
    workspace_id text NOT NULL REFERENCES workspaces ON DELETE CASCADE,
    scopes       text[] NOT NULL
                 CHECK (cardinality(scopes) > 0
                        AND scopes <@ ARRAY['webhooks:read', 'webhooks:write']::text[]),
    created_at   timestamptz NOT NULL DEFAULT now(),
    revoked_at   timestamptz
);

-- The replay budget (RFC: 100 replays per workspace per hour), shared by
-- every API process because it lives here. One row per accepted replay
-- request; a recover writes one row worth ceil(rows / 100) units. The API
-- sums the last hour under a per-workspace advisory lock (a sliding window,
-- so there is no burst of 2x the limit at an hour boundary) and deletes the
-- workspace's expired rows as it goes: the table holds at most about
-- `replays_per_hour` rows per active workspace.
CREATE TABLE api_replay_ledger (
    id           bigserial PRIMARY KEY,
    workspace_id text NOT NULL,
    at           timestamptz NOT NULL DEFAULT now(),
    units        int NOT NULL CHECK (units > 0)
);
CREATE INDEX api_replay_ledger_workspace ON api_replay_ledger (workspace_id, at);

-- History filtered by endpoint (the console's endpoint view and
-- ?endpoint_id=), newest first by keyset on id. Without it the query walks
-- the whole workspace's (workspace_id, id) index and discards the other
-- endpoints' rows, which for a quiet endpoint next to a busy one means
-- scanning nearly every row of the retention window. Cost: one more entry per
-- insert and per non-HOT update (docs/api.md has the measurement).
CREATE INDEX webhook_deliveries_endpoint ON webhook_deliveries (endpoint_id, id);

-- POST /v2/webhooks/endpoints/{id}/recover: an endpoint's dead and failed
-- rows since a time. Terminal failures are a small fraction of rows and a row
-- enters this partial index once, on its final (already non-HOT) update.
CREATE INDEX webhook_deliveries_endpoint_failed
    ON webhook_deliveries (endpoint_id, created_at) WHERE status IN ('dead', 'failed');
