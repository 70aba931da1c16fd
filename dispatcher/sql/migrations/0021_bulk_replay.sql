-- 0021: bulk replay by filter (issue 24, section 3).
--
-- A request (API or CLI) counts the rows its filter matches, pays the replay
-- budget for all of them and records a job; the upkeep leader's replay loop
-- then queues them in batches.  Each batch is one transaction that inserts its
-- replay rows and advances the job's cursor (after_id) together, so a batch
-- retried after a crash starts where the last committed one ended and never
-- queues a row twice.  (workspace_id, request_key) is unique: a retried
-- request (same Idempotency-Key) finds its job instead of making another.

CREATE TABLE replay_jobs (
    id           bigserial PRIMARY KEY,
    workspace_id text NOT NULL,
    request_key  text NOT NULL,
    -- rules.bulk_replay.ReplayFilter.fingerprint: a key reused for another filter is refused.
    fingerprint  text NOT NULL,
    token_id     bigint,  -- NULL: an operator's CLI command (as in api_audit)
    since        timestamptz NOT NULL,
    until        timestamptz,
    event_types  text[] NOT NULL DEFAULT '{}',
    endpoint_ids bigint[] NOT NULL DEFAULT '{}',
    statuses     text[] NOT NULL,
    state        text NOT NULL DEFAULT 'running' CHECK (state IN ('running', 'done')),
    total        integer NOT NULL CHECK (total >= 0),
    queued       integer NOT NULL DEFAULT 0 CHECK (queued >= 0),
    replay_units integer NOT NULL CHECK (replay_units >= 0),
    -- Rows above max_id (written after the job was counted, its own replays
    -- included) are never candidates; after_id is the cursor.
    max_id       bigint NOT NULL,
    after_id     bigint NOT NULL DEFAULT 0,
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now(),
    finished_at  timestamptz,
    CONSTRAINT replay_jobs_request UNIQUE (workspace_id, request_key)
);
CREATE INDEX replay_jobs_running ON replay_jobs (id) WHERE state = 'running';

-- The one definition of what a bulk replay re-queues, shared by the dry run's
-- count and sample, the job's count and each of its batches: the newest row of
-- each (event, endpoint) pair -- so an event already replayed, pending or
-- delivered since is not queued again -- when it is live, in one of
-- `statuses`, its event was created in [since, until) with one of `types`
-- (empty: any), and its endpoint is an active customer endpoint of the
-- workspace, one of `endpoints` (empty: any).  A plain SQL function, so the
-- planner inlines it into each caller.
CREATE FUNCTION dispatcher_replay_candidates(ws text, since timestamptz, until timestamptz, types text[],
                                             endpoints bigint[], statuses text[], after_id bigint,
                                             max_id bigint)
RETURNS TABLE (id bigint, endpoint_id bigint, event_id text, event_type text, status text,
               created_at timestamptz, payload_hash text)
LANGUAGE sql STABLE AS $$
    SELECT d.id, d.endpoint_id, d.event_id, ev.type, d.status, d.created_at, d.payload_hash
      FROM webhook_deliveries d
      JOIN events ev ON ev.workspace_id = d.workspace_id AND ev.id = d.event_id
      JOIN webhook_endpoints e ON e.id = d.endpoint_id AND e.workspace_id = d.workspace_id
     WHERE d.workspace_id = ws AND d.id > after_id AND d.id <= max_id
       -- A row is written with or after its event: this bound lets the
       -- created_at BRIN index skip older blocks.
       AND d.created_at >= since
       AND d.mode = 'live' AND d.status = ANY (statuses)
       AND ev.created_at >= since AND (until IS NULL OR ev.created_at < until)
       AND (cardinality(types) = 0 OR ev.type = ANY (types))
       AND (cardinality(endpoints) = 0 OR d.endpoint_id = ANY (endpoints))
       AND e.active AND e.purpose = 'customer'
       AND NOT EXISTS (SELECT 1 FROM webhook_deliveries o
                        WHERE o.event_id = d.event_id AND o.workspace_id = d.workspace_id
                          AND o.endpoint_id = d.endpoint_id AND o.id > d.id)
$$;

-- The list is 0020's (endpoint.pause, endpoint.resume) plus replay.bulk: each
-- migration that re-creates this CHECK keeps every action an earlier one added.
ALTER TABLE api_audit DROP CONSTRAINT api_audit_action_check;
ALTER TABLE api_audit ADD CONSTRAINT api_audit_action_check CHECK (action IN (
    'delivery.replay', 'endpoint.recover', 'endpoint.create', 'endpoint.update', 'endpoint.delete',
    'endpoint.breaker_close', 'endpoint.secret_rotate', 'workspace.update', 'endpoint.pause', 'endpoint.resume',
    'replay.bulk'));
