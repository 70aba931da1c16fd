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

-- name: migrate_try_lock
-- Session-level: held across the migrations' own transactions (store.migrate).
SELECT pg_try_advisory_lock(hashtext('dispatcher.migrate'));

-- name: migrate_unlock
SELECT pg_advisory_unlock(hashtext('dispatcher.migrate'));

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
INSERT INTO webhook_endpoints (workspace_id, url, event_types, max_per_second, owner_contact, secret, description,
                               active, trace_headers)
VALUES (%(workspace_id)s, %(url)s, %(event_types)s, %(max_per_second)s, %(owner_contact)s, %(secret)s,
        %(description)s, %(active)s, %(trace_headers)s)
RETURNING id;

-- name: set_workspace_contacts
-- NULL parameters leave a column as it is; '' clears it.
UPDATE workspaces
   SET owner_contact = CASE WHEN %(owner_contact)s::text IS NULL THEN owner_contact
                            ELSE nullif(%(owner_contact)s::text, '') END,
       notify_webhook_url = CASE WHEN %(notify_url)s::text IS NULL THEN notify_webhook_url
                                 ELSE nullif(%(notify_url)s::text, '') END
 WHERE id = %(id)s
RETURNING id, owner_contact, notify_webhook_url;

-- name: workspace_contacts
-- owner_contact_confirmed: by the link the notifier mailed it (0019).
SELECT w.owner_contact, w.notify_webhook_url,
       EXISTS (SELECT 1 FROM contact_confirmations k
                WHERE k.workspace_id = w.id AND k.address = w.owner_contact AND k.confirmed_at IS NOT NULL)
           AS owner_contact_confirmed
  FROM workspaces w
 WHERE w.id = %(id)s;

-- name: workspace_exists
SELECT 1 FROM workspaces WHERE id = %(id)s;

-- name: set_endpoint_active
UPDATE webhook_endpoints SET active = %(active)s WHERE id = %(id)s RETURNING id;

-- name: delivery_status_counts
SELECT status, count(*) FROM webhook_deliveries
 WHERE endpoint_id = ANY (%(endpoint_ids)s::bigint[])
 GROUP BY status;

-- name: send_event
-- The producer's single round trip (2 ms p99 budget), inside the caller's
-- transaction: dispatcher_send_event (migrations 0012, 0015) decides the mode
-- from the rollout rule, numbers the event from a SEQUENCE (no row lock) on
-- every path, inserts the event and one delivery per active subscribed
-- customer endpoint, and returns what the legacy synchronous path needs when
-- the outbox is off (and what it skipped). A function so that its plans are
-- cached per session: this call is all Postgres plans per send.
-- trace_context: the caller's W3C trace context, or NULL (migration 0022).
SELECT mode, sequence, deliveries, legacy_targets, legacy_payload, skipped
  FROM dispatcher_send_event(%(workspace_id)s, %(event_id)s, %(type)s, %(occurred_at)s::timestamptz,
                             %(payload)s::jsonb, %(payload_hash)s, %(shadow_writes)s, %(grace)s::float8,
                             %(trace_context)s::jsonb);
