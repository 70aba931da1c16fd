-- 0004: producer contract and rollout (issue 10).

-- Event sequences come from one Postgres SEQUENCE instead of a per-workspace
-- counter row. nextval() is not transactional and takes no row lock, so two
-- producers of one workspace never wait for each other's commit (G2; the
-- counter row was locked until the producer committed). The contract becomes
-- "unique and increasing in allocation order per workspace, with gaps", see
-- docs/producer.md. CACHE 1 (the default) keeps allocation order global:
-- a per-session cache would hand out numbers out of order across sessions.
CREATE SEQUENCE event_sequence AS bigint;
-- Continue above every number already handed out, so sequences stay
-- monotonic for workspaces that produced under the counter table.
SELECT setval('event_sequence',
              greatest((SELECT max(last_sequence) FROM event_sequences),
                       (SELECT max(sequence) FROM events), 0) + 1,
              false);

-- The percentage rollout: one row, 0..100.
CREATE TABLE rollout_settings (
    singleton  boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    percent    int NOT NULL DEFAULT 0 CHECK (percent BETWEEN 0 AND 100),
    updated_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO rollout_settings DEFAULT VALUES;

-- Explicit lists (internal and beta workspaces in, a troubled one out).
CREATE TABLE rollout_workspaces (
    workspace_id text PRIMARY KEY REFERENCES workspaces ON DELETE CASCADE,
    list         text NOT NULL CHECK (list IN ('include', 'exclude')),
    updated_at   timestamptz NOT NULL DEFAULT now()
);

-- A workspace's stable bucket 0..99: the first 32 bits of md5(id) mod 100.
-- md5 is computed identically by Python's hashlib (dispatcher/rollout_rule.py),
-- unlike hashtext, so the CLI, the tests and the producer agree, and the set
-- at 25 % is contained in the set at 50 %.
CREATE FUNCTION rollout_bucket(workspace_id text) RETURNS int
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    RETURN (('x' || substr(md5(workspace_id), 1, 8))::bit(32)::bigint % 100)::int;

-- Whether a workspace's events go to the outbox. The rule is written in
-- Python as dispatcher.rollout_rule.outbox_on and tests check this function
-- against the same table of cases: the explicit flag overrides, then the
-- exclude list, then the include list, then the percentage.
CREATE FUNCTION webhook_outbox_on(flag jsonb, listed text, percent int, bucket int) RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN CASE WHEN flag = 'true'::jsonb THEN true
                WHEN flag = 'false'::jsonb THEN false
                WHEN listed = 'exclude' THEN false
                WHEN listed = 'include' THEN true
                ELSE bucket < coalesce(percent, 0) END;
