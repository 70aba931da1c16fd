-- Named queries of the HTTP API (dispatcher/api), executed only by
-- dispatcher/store/ (deliveries.py, endpoints.py, tokens.py, audit.py, and the
-- session set-up in __init__.py). Every name starts with api_. Rows are read
-- by column name, so every output column has a name (an alias where needed).
-- Optional filters are written "(%(x)s::type IS NULL OR ...)": psycopg2
-- interpolates on the client, so the planner sees a constant NULL and folds
-- the unused branch away, and each call still gets the right index.

-- name: api_session_setup
-- Per connection: bound every API statement, and render timestamps in UTC.
SELECT set_config('statement_timeout', %(statement_timeout)s, false),
       set_config('TimeZone', 'UTC', false);

-- name: api_ping
SELECT 1;

-- name: api_insert_token
INSERT INTO api_tokens (token_sha256, workspace_id, scopes, token_prefix, expires_at)
SELECT %(token_sha256)s, id, %(scopes)s, %(prefix)s,
       now() + make_interval(secs => %(expires_in)s::float8)
  FROM workspaces WHERE id = %(workspace_id)s
RETURNING id;

-- name: api_lookup_token
-- Every request reads its token here; revoked and expired tokens match
-- nothing, so they get 401 on the very next request (no cache holds a
-- positive answer). last_used_at is written only when it is older than
-- touch_every seconds: at most one write per token per interval, not one per
-- request. Concurrent requests at the boundary queue on the row lock and the
-- later ones, re-reading it, find it fresh and write nothing.
WITH found AS (
    SELECT id, workspace_id, scopes, last_used_at FROM api_tokens
     WHERE token_sha256 = %(token_sha256)s AND revoked_at IS NULL AND (expires_at IS NULL OR expires_at > now())
), touched AS (
    UPDATE api_tokens t SET last_used_at = now()
      FROM found f
     WHERE t.id = f.id
       AND (f.last_used_at IS NULL OR f.last_used_at <= now() - make_interval(secs => %(touch_every)s::float8))
       AND (t.last_used_at IS NULL OR t.last_used_at <= now() - make_interval(secs => %(touch_every)s::float8))
    RETURNING t.id
)
SELECT id, workspace_id, scopes FROM found;

-- name: api_list_tokens
SELECT id, token_prefix AS prefix, workspace_id, scopes, created_at, expires_at, last_used_at, revoked_at
  FROM api_tokens
 WHERE (%(workspace_id)s::text IS NULL OR workspace_id = %(workspace_id)s::text)
   AND (%(before_id)s::bigint IS NULL OR id < %(before_id)s::bigint)
 ORDER BY id DESC
 LIMIT %(limit)s;

-- name: api_revoke_token
UPDATE api_tokens SET revoked_at = now() WHERE id = %(id)s AND revoked_at IS NULL RETURNING id;

-- name: api_token_exists
SELECT revoked_at FROM api_tokens WHERE id = %(id)s;

-- name: api_list_deliveries
-- Keyset pagination on id, newest first: a page is "ids below the cursor",
-- so rows inserted meanwhile (higher ids) never shift later pages.
-- endpoint_url is not shown: it tells views.delivery_json what to mask in
-- the row's texts for a read-only token (NULL: the endpoint was deleted).
SELECT d.id, d.event_id, ev.type AS event_type, d.endpoint_id, d.status, d.attempt, d.mode, d.payload_hash,
       d.replay_of, d.created_at, d.next_attempt_at, d.delivered_at, d.finished_at,
       d.last_status_code, d.last_error, ep.url AS endpoint_url,
       -- Whether the endpoint's breaker holds the row (breaker.BreakerPolicy.holds), decided
       -- in Python from these and the database clock, as api_endpoints' shown state is.
       coalesce(s.state, 'closed') AS breaker_state, coalesce(s.consecutive_failures, 0) AS breaker_failures,
       s.open_until AS breaker_open_until, extract(epoch FROM s.open_until)::float8 AS breaker_open_until_epoch,
       extract(epoch FROM d.next_attempt_at)::float8 AS next_attempt_epoch, extract(epoch FROM now())::float8 AS db_now,
       dispatcher_sampled_trace_id(d.trace_context ->> 'traceparent') AS trace_id,
       dispatcher_sampled_trace_id(ev.trace_context ->> 'traceparent') AS producer_trace_id
  FROM webhook_deliveries d
  LEFT JOIN events ev ON ev.id = d.event_id AND ev.workspace_id = d.workspace_id AND ev.day = d.event_day
  LEFT JOIN endpoint_state s ON s.endpoint_id = d.endpoint_id
  LEFT JOIN webhook_endpoints ep ON ep.id = d.endpoint_id
 WHERE d.workspace_id = %(workspace_id)s
   AND (%(before_id)s::bigint IS NULL OR d.id < %(before_id)s::bigint)
   AND (%(event_id)s::text IS NULL OR d.event_id = %(event_id)s::text)
   AND (%(endpoint_id)s::bigint IS NULL OR d.endpoint_id = %(endpoint_id)s::bigint)
   AND (%(status)s::text IS NULL OR d.status = %(status)s::text)
   AND (%(since)s::timestamptz IS NULL OR d.created_at >= %(since)s::timestamptz)
   AND (%(until)s::timestamptz IS NULL OR d.created_at < %(until)s::timestamptz)
 ORDER BY d.id DESC
 LIMIT %(limit)s;

-- name: api_get_delivery
SELECT d.id, d.event_id, ev.type AS event_type, d.endpoint_id, d.status, d.attempt, d.mode, d.payload_hash,
       d.replay_of, d.created_at, d.next_attempt_at, d.delivered_at, d.finished_at,
       d.last_status_code, d.last_error, ep.url AS endpoint_url,
       -- The breaker columns, as in api_list_deliveries.
       coalesce(s.state, 'closed') AS breaker_state, coalesce(s.consecutive_failures, 0) AS breaker_failures,
       s.open_until AS breaker_open_until, extract(epoch FROM s.open_until)::float8 AS breaker_open_until_epoch,
       extract(epoch FROM d.next_attempt_at)::float8 AS next_attempt_epoch, extract(epoch FROM now())::float8 AS db_now,
       -- The POST body's "data": the whole delivery only, never a list (a payload may be 256 KiB).
       ev.payload,
       dispatcher_sampled_trace_id(d.trace_context ->> 'traceparent') AS trace_id,
       dispatcher_sampled_trace_id(ev.trace_context ->> 'traceparent') AS producer_trace_id
  FROM webhook_deliveries d
  LEFT JOIN events ev ON ev.id = d.event_id AND ev.workspace_id = d.workspace_id AND ev.day = d.event_day
  LEFT JOIN endpoint_state s ON s.endpoint_id = d.endpoint_id
  LEFT JOIN webhook_endpoints ep ON ep.id = d.endpoint_id
 WHERE d.id = %(id)s AND d.workspace_id = %(workspace_id)s;

-- name: api_delivery_attempts
-- The caller passes only ids it already read under the workspace filter.  %(last)s: each delivery's
-- last so many attempts only (NULL: all); of_delivery says how many the delivery has in all.
-- %(first)s is the smallest of the ids: an attempt is written after its delivery, so its id's day
-- (migration 0027) is never before the delivery's, and the planner reads only the attempts
-- partitions from the day before the oldest delivery's on (the day's margin is for a clock that
-- steps back across midnight).  A delivery from before 0027 has an id of no day: the bound is then
-- below every id, and every partition is read.
SELECT delivery_id, attempt, started_at, duration_ms, result, status_code, error, response_excerpt, trace_id, of_delivery
  FROM (SELECT a.*, row_number() OVER w AS from_end, count(*) OVER (PARTITION BY delivery_id) AS of_delivery
          FROM webhook_delivery_attempts a
         WHERE delivery_id = ANY (%(ids)s::bigint[])
           AND a.id >= dispatcher_first_id(dispatcher_day_of_id(%(first)s::bigint) - 1)
        WINDOW w AS (PARTITION BY delivery_id ORDER BY attempt DESC, id DESC)) a
 WHERE %(last)s::int IS NULL OR from_end <= %(last)s::int
 ORDER BY delivery_id, attempt, id;

-- name: api_event_exists
SELECT 1 FROM events WHERE id = %(event_id)s AND workspace_id = %(workspace_id)s;

-- name: api_replay_source
-- What a replay needs to decide 404 / 409 before it spends the budget.
SELECT d.endpoint_id, d.event_id, d.payload_hash,
       e.id IS NOT NULL AS endpoint_exists,
       coalesce(e.active, false) AS endpoint_active,
       EXISTS (SELECT 1 FROM events ev
                WHERE ev.id = d.event_id AND ev.workspace_id = d.workspace_id AND ev.day = d.event_day)
           AS event_exists,
       -- A replay row is always live: replaying a shadow row of a workspace
       -- whose outbox is off would be a live send the rollout has not allowed.
       d.mode = 'shadow' AND NOT EXISTS (
           SELECT 1 FROM workspaces w
             LEFT JOIN rollout_workspaces r ON r.workspace_id = w.id
            WHERE w.id = d.workspace_id
              AND webhook_outbox_on(w.flags -> 'webhook_outbox', r.list,
                                    (SELECT s.percent FROM rollout_settings s), rollout_bucket(w.id)))
           AS shadow_while_off
  FROM webhook_deliveries d
  LEFT JOIN webhook_endpoints e ON e.id = d.endpoint_id AND e.workspace_id = d.workspace_id
 WHERE d.id = %(id)s AND d.workspace_id = %(workspace_id)s;

-- name: api_insert_replay
-- A new row, never a reset of the old one: the old row keeps its attempts
-- and outcome, and the engine sends the same event (so the same
-- Idempotency-Key / webhook-id), freshly signed.  To a paused endpoint it
-- is held, sent after the resume (migration 0020).
WITH ins AS (
    INSERT INTO webhook_deliveries (workspace_id, endpoint_id, event_id, payload_hash,
                                    attempt, status, mode, next_attempt_at, replay_of, trace_context, event_day)
    VALUES (%(workspace_id)s, %(endpoint_id)s, %(event_id)s, %(payload_hash)s,
            0, CASE WHEN (SELECT e.paused_at FROM webhook_endpoints e WHERE e.id = %(endpoint_id)s) IS NULL
                    THEN 'pending' ELSE 'held' END,
            'live', now(), %(replay_of)s,
            -- A replay is a trace of its own (the replay request's, when it is
            -- traced), linked to the original row's (migration 0022).
            nullif(jsonb_strip_nulls(jsonb_build_object(
                'traceparent', %(traceparent)s::text,
                'replayed_from', (SELECT o.trace_context ->> 'traceparent' FROM webhook_deliveries o
                                   WHERE o.id = %(replay_of)s AND o.workspace_id = %(workspace_id)s))),
                   '{}'::jsonb),
            -- The same event, in the same events partition as the original's (0027).
            coalesce((SELECT o.event_day FROM webhook_deliveries o
                       WHERE o.id = %(replay_of)s AND o.workspace_id = %(workspace_id)s), dispatcher_today()))
    RETURNING *
)
SELECT d.id, d.event_id, ev.type AS event_type, d.endpoint_id, d.status, d.attempt, d.mode, d.payload_hash,
       d.replay_of, d.created_at, d.next_attempt_at, d.delivered_at, d.finished_at,
       d.last_status_code, d.last_error, ep.url AS endpoint_url,
       -- The breaker columns, as in api_list_deliveries.
       coalesce(s.state, 'closed') AS breaker_state, coalesce(s.consecutive_failures, 0) AS breaker_failures,
       s.open_until AS breaker_open_until, extract(epoch FROM s.open_until)::float8 AS breaker_open_until_epoch,
       extract(epoch FROM d.next_attempt_at)::float8 AS next_attempt_epoch, extract(epoch FROM now())::float8 AS db_now,
       dispatcher_sampled_trace_id(d.trace_context ->> 'traceparent') AS trace_id,
       dispatcher_sampled_trace_id(ev.trace_context ->> 'traceparent') AS producer_trace_id
  FROM ins d
  LEFT JOIN events ev ON ev.id = d.event_id AND ev.workspace_id = d.workspace_id AND ev.day = d.event_day
  LEFT JOIN endpoint_state s ON s.endpoint_id = d.endpoint_id
  LEFT JOIN webhook_endpoints ep ON ep.id = d.endpoint_id;

-- name: api_replay_lock
-- Serialises one workspace's budget checks across every API process; a hash
-- collision between two workspaces only makes them wait for each other.
SELECT pg_advisory_xact_lock(hashtextextended('dispatcher.api.replay:' || %(workspace_id)s, 0));

-- name: api_replay_window
-- The workspace's spending in the last hour, oldest first, with how many
-- seconds until each entry leaves the window; expired entries are deleted.
WITH expired AS (
    DELETE FROM api_replay_ledger
     WHERE workspace_id = %(workspace_id)s AND at <= now() - interval '1 hour'
)
SELECT units, extract(epoch FROM at + interval '1 hour' - now())::float8 AS expires_in
  FROM api_replay_ledger
 WHERE workspace_id = %(workspace_id)s AND at > now() - interval '1 hour'
 ORDER BY at, id;

-- name: api_region_replay_lock
-- Serialises the region-wide budget check. Always taken after the workspace's
-- lock (api_replay_lock), by every spender, so the two never deadlock.
SELECT pg_advisory_xact_lock(hashtextextended('dispatcher.api.replay-region', 0));

-- name: api_region_replay_window
-- Every workspace's spending in the last hour, one entry per minute (oldest
-- first) so the answer stays small; an entry leaves the window with its
-- minute's newest spend, so a Retry-After may be up to a minute generous.
-- Expired rows are not deleted here: other workspaces' rows are theirs to
-- delete under their own lock (api_replay_window).
SELECT sum(units)::int AS units,
       extract(epoch FROM max(at) + interval '1 hour' - now())::float8 AS expires_in
  FROM api_replay_ledger
 WHERE at > now() - interval '1 hour'
 GROUP BY date_trunc('minute', at)
 ORDER BY min(at);

-- name: api_replay_spend
INSERT INTO api_replay_ledger (workspace_id, units) VALUES (%(workspace_id)s, %(units)s);

-- name: api_endpoints
-- One endpoint (id given) or a page of the workspace's endpoints, newest
-- first; workspace_id NULL means any workspace (the operator's CLI).
-- No endpoint_state row means the engine never recorded a failure: closed,
-- zero failures. The pending aggregate walks the endpoint's slice of
-- webhook_deliveries_due, the success rate its last 24 h of attempts
-- (webhook_delivery_attempts_endpoint, 0010), counting what
-- api_endpoint_stats counts: attempts with a response or a transport failure
-- the breaker counts; shadow rows, blocked URLs and rows ended without a
-- request (endpoint gone, event gone) are not.
-- The secrets themselves are never selected here. Only customer endpoints:
-- the workspace's operational endpoint (migration 0011) is the notifier's,
-- kept in step with workspaces.notify_webhook_url, and is not the customer's
-- to list or change.
SELECT e.id, e.workspace_id, e.url, e.active, e.event_types, e.created_at, e.max_per_second, e.description,
       e.owner_contact, e.trace_headers, e.secret IS NOT NULL AS own_secret, e.secret_rotated_at,
       EXISTS (SELECT 1 FROM contact_confirmations k
                WHERE k.workspace_id = e.workspace_id AND k.address = e.owner_contact
                  AND k.confirmed_at IS NOT NULL) AS owner_contact_confirmed,
       CASE WHEN e.previous_secret IS NOT NULL
            THEN e.secret_rotated_at + make_interval(secs => %(grace)s::float8) END AS previous_valid_until,
       coalesce(s.state, 'closed') AS state, coalesce(s.consecutive_failures, 0) AS consecutive_failures,
       s.open_until, s.opened_at,
       -- The shown state is the breaker rule's (breaker.BreakerPolicy.shown_state),
       -- decided in Python from these and the database clock.
       extract(epoch FROM s.open_until)::float8 AS open_until_epoch, extract(epoch FROM now())::float8 AS db_now,
       s.last_success_at, s.last_failure_at, s.last_error,
       p.pending AS pending_count, p.oldest AS oldest_pending_at,
       e.paused_at, e.pause_cause, h.held AS held_count, h.oldest AS oldest_held_at,
       coalesce(l.stage, 'healthy') AS lifecycle_stage, l.next_step, l.next_step_at,
       extract(epoch FROM now() - p.oldest)::float8 AS oldest_pending_age_seconds,
       r.attempts AS attempts_24h, r.delivered AS delivered_24h
  FROM webhook_endpoints e
  LEFT JOIN endpoint_state s ON s.endpoint_id = e.id
 CROSS JOIN LATERAL (
        SELECT count(*) AS pending, min(d.created_at) AS oldest
          FROM webhook_deliveries d
         WHERE d.endpoint_id = e.id AND d.status = 'pending'
       ) p
 CROSS JOIN LATERAL (
        -- webhook_deliveries_held (0020): nothing to read unless paused
        SELECT count(*) AS held, min(d.created_at) AS oldest
          FROM webhook_deliveries d
         WHERE d.endpoint_id = e.id AND d.status = 'held'
       ) h
  LEFT JOIN endpoint_lifecycle l ON l.endpoint_id = e.id
 CROSS JOIN LATERAL (
        SELECT count(*) AS attempts, count(*) FILTER (WHERE a.result = 'delivered') AS delivered
          FROM webhook_delivery_attempts a
         WHERE a.endpoint_id = e.id AND a.started_at > now() - interval '24 hours'
           -- The attempts that went on the wire, as api_endpoint_stats counts them.
           AND (a.status_code IS NOT NULL OR a.result = ANY (%(sent_errors)s::text[]))
       ) r
 WHERE e.purpose = 'customer'
   AND (%(workspace_id)s::text IS NULL OR e.workspace_id = %(workspace_id)s::text)
   AND (%(id)s::bigint IS NULL OR e.id = %(id)s::bigint)
   AND (%(before_id)s::bigint IS NULL OR e.id < %(before_id)s::bigint)
 ORDER BY e.id DESC
 LIMIT %(limit)s;

-- name: api_lock_endpoint
-- The endpoint a change applies to, locked until the change commits (a
-- customer endpoint: see api_endpoints).
SELECT id, workspace_id, url, active, event_types, description, owner_contact, trace_headers
  FROM webhook_endpoints
 WHERE id = %(id)s AND purpose = 'customer'
   AND (%(workspace_id)s::text IS NULL OR workspace_id = %(workspace_id)s::text)
   FOR UPDATE;

-- name: api_update_endpoint
UPDATE webhook_endpoints
   SET url = %(url)s, event_types = %(event_types)s, active = %(active)s, description = %(description)s,
       owner_contact = %(owner_contact)s, trace_headers = %(trace_headers)s
 WHERE id = %(id)s;

-- name: api_end_pending
-- A deactivated or deleted endpoint's pending rows end failed with the
-- engine's own reason (policy.ENDPOINT_DEACTIVATED / ENDPOINT_DELETED).
-- Rows leased to a worker (a request may be on the wire) are left to the
-- engine, which ends them with the same reason if they need another attempt.
-- Each ended row gets its history entry, as the engine's ending writes one
-- (an attempt with no request: no status code, no time on the wire), so its
-- history says why it ended.
WITH ended AS (
    UPDATE webhook_deliveries
       SET status = 'failed', last_error = %(reason)s, finished_at = now(), attempt = attempt + 1,
           locked_by = NULL, locked_until = NULL, claim_token = NULL
     WHERE endpoint_id = %(id)s AND status = 'pending' AND dispatcher_unleased(locked_until)
    RETURNING id, endpoint_id, attempt
), history AS (
    INSERT INTO webhook_delivery_attempts (delivery_id, endpoint_id, attempt, started_at, duration_ms, result, error)
    SELECT id, endpoint_id, attempt, now(), 0, 'failed', %(reason)s FROM ended
)
SELECT id FROM ended;

-- name: api_delete_endpoint
-- Its breaker goes with it: a deleted endpoint's open breaker is nothing
-- anyone can close, and status listed it.
WITH state AS (
    DELETE FROM endpoint_state WHERE endpoint_id = %(id)s
)
DELETE FROM webhook_endpoints WHERE id = %(id)s;

-- name: api_lock_workspace_endpoints
-- Every endpoint of a workspace, its operational one included, locked for deletion.
SELECT id FROM webhook_endpoints WHERE workspace_id = %(workspace_id)s ORDER BY id FOR UPDATE;

-- name: api_held_count
-- A paused endpoint's held rows (webhook_deliveries_held): deleting it asks
-- for confirmation when there are any.
SELECT count(*) AS held FROM webhook_deliveries WHERE endpoint_id = %(id)s AND status = 'held';

-- name: api_end_held
-- A deleted endpoint's held rows end failed like its pending ones (the
-- deletion was confirmed: store.endpoints.delete_endpoint), each with the
-- same history entry as api_end_pending writes.  A held row is never leased.
WITH ended AS (
    UPDATE webhook_deliveries
       SET status = 'failed', last_error = %(reason)s, finished_at = now(), attempt = attempt + 1,
           locked_by = NULL, locked_until = NULL, claim_token = NULL
     WHERE endpoint_id = %(id)s AND status = 'held'
    RETURNING id, endpoint_id, attempt
), history AS (
    INSERT INTO webhook_delivery_attempts (delivery_id, endpoint_id, attempt, started_at, duration_ms, result, error)
    SELECT id, endpoint_id, attempt, now(), 0, 'failed', %(reason)s FROM ended
)
SELECT id FROM ended;

-- name: api_pause_endpoint
-- Pause (migration 0020): stamp the endpoint (a second pause keeps the first
-- one's time and cause), then hold its pending rows not leased to a worker,
-- in one statement.  A leased row is its worker's: a retry it records is
-- written held (engine_record).  Returns the endpoint's pause as it stands
-- and how many rows this call held.
WITH paused AS (
    UPDATE webhook_endpoints
       SET paused_at = coalesce(paused_at, now()), pause_cause = coalesce(pause_cause, %(cause)s)
     WHERE id = %(id)s
    RETURNING paused_at, pause_cause, paused_at = now() AS now_paused
), held AS (
    UPDATE webhook_deliveries
       SET status = 'held'
     WHERE endpoint_id = %(id)s AND status = 'pending' AND dispatcher_unleased(locked_until)
    RETURNING id
)
SELECT p.paused_at, p.pause_cause, p.now_paused, (SELECT count(*) FROM held) AS held FROM paused p;

-- name: api_resume_endpoint
-- Resume: every held row is pending again, in its place.  The time it was
-- held (since the pause, or since it was written if later) is added to
-- held_seconds, so its retry ceiling did not run while paused, and a retry
-- that was waiting keeps the rest of its wait; a row that was due (or was
-- written while paused) is due now, oldest first.  The breaker is reset to
-- closed, as close-breaker does: a resume is a fresh start, and the claim's
-- limits pace the drain.  No-op unless paused.
WITH ended AS (
    SELECT paused_at, pause_cause FROM webhook_endpoints WHERE id = %(id)s AND paused_at IS NOT NULL FOR UPDATE
), resumed AS (
    UPDATE webhook_endpoints e SET paused_at = NULL, pause_cause = NULL
      FROM ended WHERE e.id = %(id)s
), released AS (
    UPDATE webhook_deliveries d
       SET status = 'pending',
           held_seconds = d.held_seconds
                          + greatest(0, extract(epoch FROM now() - greatest(x.paused_at, d.created_at))::float8),
           next_attempt_at = CASE WHEN d.next_attempt_at > greatest(x.paused_at, d.created_at)
                                  THEN d.next_attempt_at + (now() - greatest(x.paused_at, d.created_at))
                                  ELSE d.next_attempt_at END
      FROM ended x
     WHERE d.endpoint_id = %(id)s AND d.status = 'held'
    RETURNING d.id
), closed AS (
    UPDATE endpoint_state
       SET state = 'closed', consecutive_failures = 0, open_until = NULL, updated_at = now()
      FROM ended
     WHERE endpoint_id = %(id)s
)
SELECT x.paused_at, x.pause_cause, (SELECT count(*) FROM released) AS released FROM ended x;

-- name: api_close_breaker
-- An operator-style reset: closed, no failures, no deadline; then every
-- pending row not leased to a worker is due now (retry back-offs included).
WITH closed AS (
    UPDATE endpoint_state
       SET state = 'closed', consecutive_failures = 0, open_until = NULL, updated_at = now()
     WHERE endpoint_id = %(id)s
    RETURNING endpoint_id
), due AS (
    UPDATE webhook_deliveries
       SET next_attempt_at = now()
     WHERE endpoint_id = %(id)s AND status = 'pending' AND next_attempt_at > now()
       AND dispatcher_unleased(locked_until)
    RETURNING id
)
SELECT (SELECT count(*) FROM due) AS made_due;

-- name: api_breaker_before_close
SELECT state, consecutive_failures FROM endpoint_state WHERE endpoint_id = %(id)s FOR UPDATE;

-- name: api_rotate_endpoint_secret
-- The secret a receiver may verify with becomes the previous one: the one in
-- use, or the workspace's at an endpoint's first rotation, since that is what
-- it was signing with.  A secret nobody has seen (secret_shown false: made by
-- migration 0017) is not one a receiver can use: the previous one (the
-- workspace secret it signed with) stays, and signs for another grace.
UPDATE webhook_endpoints e
   SET previous_secret = CASE WHEN e.secret_shown THEN coalesce(e.secret, w.secret)
                              ELSE coalesce(e.previous_secret, w.secret) END,
       secret = %(secret)s, secret_rotated_at = now(), secret_shown = true
  FROM workspaces w
 WHERE w.id = e.workspace_id AND e.id = %(id)s
RETURNING e.secret_rotated_at + make_interval(secs => %(grace)s::float8) AS previous_valid_until;

-- name: api_audit_insert
INSERT INTO api_audit (workspace_id, token_id, action, endpoint_id, delivery_ids, detail)
VALUES (%(workspace_id)s, %(token_id)s, %(action)s, %(endpoint_id)s, %(delivery_ids)s::bigint[], %(detail)s::jsonb);

-- name: api_list_audit
SELECT id, at, token_id, action, endpoint_id, delivery_ids, detail
  FROM api_audit
 WHERE workspace_id = %(workspace_id)s
   AND (%(endpoint_id)s::bigint IS NULL OR endpoint_id = %(endpoint_id)s::bigint)
   AND (%(before_id)s::bigint IS NULL OR id < %(before_id)s::bigint)
 ORDER BY id DESC
 LIMIT %(limit)s;

-- name: api_endpoint_for_recover
SELECT active FROM webhook_endpoints WHERE id = %(id)s AND workspace_id = %(workspace_id)s;

-- name: api_recover_candidates
-- One row per event: the newest dead/failed live row of each event this
-- endpoint failed since the cut-off, unless the event is already pending or
-- delivered on this endpoint (an earlier recover or replay).  Run under the
-- workspace lock, so concurrent recovers cannot both queue the same event.
-- Only read here: the rows are inserted (api_recover_insert) once the budget
-- has paid for them, so a refused recover writes nothing.
SELECT c.id
  FROM (
    SELECT DISTINCT ON (d.event_id) d.id
      FROM webhook_deliveries d
     WHERE d.endpoint_id = %(endpoint_id)s AND d.workspace_id = %(workspace_id)s
       AND d.status IN ('dead', 'failed') AND d.mode = 'live'
       AND d.created_at >= %(since)s AND (%(until)s::timestamptz IS NULL OR d.created_at < %(until)s::timestamptz)
       AND NOT EXISTS (SELECT 1 FROM webhook_deliveries o
                        WHERE o.workspace_id = d.workspace_id AND o.event_id = d.event_id
                          AND o.endpoint_id = d.endpoint_id AND o.status IN ('pending', 'held', 'delivered'))
     ORDER BY d.event_id, d.id DESC
  ) c
 ORDER BY c.id;

-- name: api_recover_insert
-- A new replay row for each candidate the budget paid for (held while the
-- endpoint is paused, as api_insert_replay).
INSERT INTO webhook_deliveries (workspace_id, endpoint_id, event_id, payload_hash,
                                attempt, status, mode, next_attempt_at, replay_of, event_day)
SELECT d.workspace_id, d.endpoint_id, d.event_id, d.payload_hash, 0,
       CASE WHEN (SELECT e.paused_at FROM webhook_endpoints e WHERE e.id = d.endpoint_id) IS NULL
            THEN 'pending' ELSE 'held' END,
       'live', now(), d.id, d.event_day
  FROM webhook_deliveries d
 WHERE d.id = ANY (%(ids)s::bigint[]) AND d.workspace_id = %(workspace_id)s
 ORDER BY d.id
RETURNING id;

-- name: api_clock
-- The database's now(), stable for the rest of the transaction.
SELECT now() AS now;

-- name: api_endpoint_stats
-- Per endpoint of the workspace (active or not): the attempts that went on
-- the wire in [since, until), per bucket of bucket_seconds and in total (the
-- bucket IS NULL row, which also exists for an endpoint with no attempts).
-- An attempt went on the wire when it got a status code or failed with one
-- of the transport errors the breaker counts (policy.RETRYABLE_ERRORS, passed
-- in): shadow rows (delivered unsent, no status), rows that could never be
-- sent and URLs the outbound policy blocked say nothing about the endpoint's
-- health, as for the breaker.  Served by webhook_delivery_attempts_endpoint
-- (0010): one index range per endpoint of the workspace (docs/api.md has the
-- plan and the measurements, and why the index does not include the columns).
-- One page of endpoints, newest first: at most limit of them below before_id.
SELECT e.id AS endpoint_id, s.bucket, s.attempts, s.succeeded, s.p95_ms
  FROM (SELECT id FROM webhook_endpoints
         WHERE workspace_id = %(workspace_id)s
           AND (%(before_id)s::bigint IS NULL OR id < %(before_id)s::bigint)
         ORDER BY id DESC
         LIMIT %(limit)s) e
 CROSS JOIN LATERAL (
        SELECT floor(extract(epoch FROM a.started_at - %(since)s::timestamptz)
                     / %(bucket_seconds)s::float8)::int AS bucket,
               count(*) AS attempts,
               count(*) FILTER (WHERE a.result = 'delivered') AS succeeded,
               percentile_disc(0.95) WITHIN GROUP (ORDER BY a.duration_ms) AS p95_ms
          FROM webhook_delivery_attempts a
         WHERE a.endpoint_id = e.id
           AND a.started_at >= %(since)s::timestamptz AND a.started_at < %(until)s::timestamptz
           AND (a.status_code IS NOT NULL OR a.result = ANY (%(sent_errors)s::text[]))
         GROUP BY GROUPING SETS ((bucket), ())
       ) s
 ORDER BY e.id DESC, s.bucket NULLS FIRST;
