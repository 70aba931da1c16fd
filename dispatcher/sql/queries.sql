-- Named queries of the producer, migrations and admin commands, executed only
-- by dispatcher/store/__init__.py.
-- Each block starts with "-- name: <name>"; parameters are psycopg2 %(name)s.

-- name: migrations_table
CREATE TABLE IF NOT EXISTS schema_migrations (
    version    int PRIMARY KEY,
    name       text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);

-- name: migrations_table_exists
SELECT to_regclass('schema_migrations') IS NOT NULL;

-- name: migrate_lock
SELECT pg_advisory_xact_lock(hashtext('dispatcher.migrate'));

-- name: applied_migrations
SELECT version FROM schema_migrations ORDER BY version;

-- name: record_migration
INSERT INTO schema_migrations (version, name) VALUES (%(version)s, %(name)s);

-- name: create_workspace
INSERT INTO workspaces (id, secret, flags) VALUES (%(id)s, %(secret)s, %(flags)s::jsonb)
ON CONFLICT (id) DO UPDATE SET flags = workspaces.flags || EXCLUDED.flags
RETURNING id, (xmax <> 0) AS existed;

-- name: set_workspace_flag
UPDATE workspaces SET flags = flags || %(flags)s::jsonb WHERE id = %(id)s RETURNING id;

-- name: rotate_workspace_secret
UPDATE workspaces
   SET previous_secret = secret, secret = %(secret)s, secret_rotated_at = now()
 WHERE id = %(id)s
RETURNING id;

-- name: add_endpoint
INSERT INTO webhook_endpoints (workspace_id, url, event_types, max_per_second, secret, description, active)
VALUES (%(workspace_id)s, %(url)s, %(event_types)s, %(max_per_second)s, %(secret)s, %(description)s, %(active)s)
RETURNING id;

-- name: workspace_exists
SELECT 1 FROM workspaces WHERE id = %(id)s;

-- name: set_endpoint_active
UPDATE webhook_endpoints SET active = %(active)s WHERE id = %(id)s RETURNING id;

-- name: delete_endpoint
DELETE FROM webhook_endpoints WHERE id = %(id)s RETURNING id;

-- name: delete_workspace_endpoints
DELETE FROM webhook_endpoints WHERE workspace_id = %(workspace_id)s;

-- name: delivery_status_counts
SELECT status, count(*) FROM webhook_deliveries
 WHERE endpoint_id = ANY (%(endpoint_ids)s::bigint[])
 GROUP BY status;

-- name: send_event
-- The producer's single round trip (2 ms p99 budget): decide the mode from
-- the rollout rule (webhook_outbox_on: explicit flag, then the lists, then the
-- percentage), take a sequence number from a SEQUENCE (no row lock: producers
-- of one workspace never wait for each other), insert the event and fan out
-- one delivery per active subscribed endpoint, and return what the legacy
-- synchronous path needs when the outbox is off.
WITH ws AS (
    SELECT w.id, w.secret, w.previous_secret, w.secret_rotated_at,
           CASE WHEN webhook_outbox_on(w.flags -> 'webhook_outbox', r.list,
                                       (SELECT s.percent FROM rollout_settings s), rollout_bucket(w.id))
                THEN 'live'
                WHEN %(shadow_writes)s THEN 'shadow' END AS mode
      -- A scalar subquery for the one-row settings table: joined, its
      -- unanalysed row estimate (~2000) inflated the plan's cost past JIT's
      -- threshold and each send paid ~1 s of compilation.
      FROM workspaces w
      LEFT JOIN rollout_workspaces r ON r.workspace_id = w.id
     WHERE w.id = %(workspace_id)s
), targets AS (
    -- An endpoint's own secrets (migration 0010) sign its legacy POST; NULL: the workspace's.
    SELECT e.id, e.url, e.secret,
           CASE WHEN e.secret_rotated_at > now() - make_interval(secs => %(grace)s::float8)
                THEN e.previous_secret END AS previous_secret
      FROM webhook_endpoints e JOIN ws ON e.workspace_id = ws.id
     WHERE e.active AND (e.event_types = '{}' OR %(type)s = ANY (e.event_types))
), event AS (
    INSERT INTO events (id, workspace_id, type, sequence, occurred_at, payload)
    SELECT %(event_id)s, %(workspace_id)s, %(type)s, nextval('event_sequence'),
           coalesce(%(occurred_at)s::timestamptz, now()), %(payload)s::jsonb
      FROM ws WHERE mode IS NOT NULL
    RETURNING sequence
), deliveries AS (
    INSERT INTO webhook_deliveries (workspace_id, endpoint_id, event_id, payload_hash, mode)
    SELECT %(workspace_id)s, t.id, %(event_id)s, %(payload_hash)s, ws.mode
      FROM targets t, ws, event
    RETURNING id
)
SELECT ws.mode,
       (SELECT sequence FROM event) AS sequence,
       (SELECT count(*) FROM deliveries) AS deliveries,
       CASE WHEN ws.mode IS DISTINCT FROM 'live' THEN ws.secret END AS secret,
       CASE WHEN ws.mode IS DISTINCT FROM 'live' THEN ws.previous_secret END AS previous_secret,
       CASE WHEN ws.mode IS DISTINCT FROM 'live'
            THEN ws.secret_rotated_at > now() - make_interval(secs => %(grace)s::float8) END AS in_grace,
       CASE WHEN ws.mode IS DISTINCT FROM 'live'
            THEN ARRAY(SELECT url FROM targets ORDER BY id) END AS legacy_urls,
       -- jsonb's own text form, so the synchronous body is byte-identical to
       -- what the dispatcher sends for the same event (it reads payload::text).
       CASE WHEN ws.mode IS DISTINCT FROM 'live' THEN %(payload)s::jsonb::text END AS legacy_payload,
       CASE WHEN ws.mode IS DISTINCT FROM 'live'
            THEN ARRAY(SELECT id FROM targets ORDER BY id) END AS legacy_endpoint_ids,
       CASE WHEN ws.mode IS DISTINCT FROM 'live'
            THEN ARRAY(SELECT secret FROM targets ORDER BY id) END AS legacy_secrets,
       CASE WHEN ws.mode IS DISTINCT FROM 'live'
            THEN ARRAY(SELECT previous_secret FROM targets ORDER BY id) END AS legacy_previous_secrets
  FROM ws;
