-- Lifecycle notices to endpoint owners (docs/decisions.md, Q3; issue 24) and
-- the confirmation of their addresses (0019), executed only by
-- dispatcher/store/notices.py.  Which stage is due is the rule's
-- (dispatcher/rules/lifecycle.py), who hears it the notifier's
-- (dispatcher/engine/notifier.py); these queries keep one notice per
-- endpoint, lifecycle episode and kind, whichever process finds it first.

-- name: notices_round_lock
-- One lifecycle round at a time across the region: a process that finds the
-- lock taken skips its round (the holder is writing the same notices).
SELECT pg_try_advisory_xact_lock(3605, 0) AS held;

-- name: lifecycle_facts
-- What the lifecycle rule (dispatcher/rules/lifecycle.py) needs of every
-- endpoint that may have a step to take: a breaker not closed, an episode
-- running, or a pause.  The clock is the database's.  A first episode is
-- numbered past any notice already kept (notices of before migration 0020
-- were numbered by the breaker's open_episode).
SELECT e.id AS endpoint_id, e.workspace_id, e.url, e.purpose = 'customer' AS pausable,
       coalesce(s.state, 'closed') = 'closed' AS breaker_closed,
       coalesce(l.episode, (SELECT max(n.episode) FROM breaker_notices n WHERE n.endpoint_id = e.id), 0)
           AS episode,
       l.endpoint_id IS NOT NULL AND l.ended_at IS NULL AS running,
       extract(epoch FROM l.failing_since)::float8 AS failing_since,
       extract(epoch FROM l.closed_at)::float8 AS closed_at,
       extract(epoch FROM e.paused_at)::float8 AS paused_at, e.pause_cause,
       ARRAY(SELECT n.kind FROM breaker_notices n
              WHERE n.endpoint_id = e.id AND n.episode = l.episode AND l.ended_at IS NULL) AS sent,
       extract(epoch FROM now())::float8 AS db_now,
       ws.notify_webhook_url AS notify_url,
       coalesce(s.consecutive_failures, 0) AS consecutive_failures, s.last_error
  FROM webhook_endpoints e
  JOIN workspaces ws ON ws.id = e.workspace_id
  LEFT JOIN endpoint_state s ON s.endpoint_id = e.id
  LEFT JOIN endpoint_lifecycle l ON l.endpoint_id = e.id
 WHERE e.id IN (SELECT endpoint_id FROM endpoint_state WHERE state <> 'closed'
                UNION SELECT endpoint_id FROM endpoint_lifecycle WHERE ended_at IS NULL
                UNION SELECT id FROM webhook_endpoints WHERE paused_at IS NOT NULL)
 ORDER BY e.id;

-- name: lifecycle_write
-- The endpoint's lifecycle row as the rule left it (NULL epochs are NULL times).
-- An episode that ends keeps its end time (ended_at); one running has none.
INSERT INTO endpoint_lifecycle AS l (endpoint_id, episode, failing_since, closed_at, ended_at, stage, next_step,
                                     next_step_at, updated_at)
VALUES (%(endpoint_id)s, %(episode)s, to_timestamp(%(failing_since)s::float8), to_timestamp(%(closed_at)s::float8),
        CASE WHEN NOT %(running)s THEN now() END, %(stage)s, %(next_step)s,
        to_timestamp(%(next_step_at)s::float8), now())
ON CONFLICT (endpoint_id) DO UPDATE
   SET episode = excluded.episode, failing_since = excluded.failing_since, closed_at = excluded.closed_at,
       ended_at = CASE WHEN excluded.ended_at IS NULL THEN NULL ELSE coalesce(l.ended_at, excluded.ended_at) END,
       stage = excluded.stage, next_step = excluded.next_step, next_step_at = excluded.next_step_at,
       updated_at = now()
 WHERE (l.episode, l.failing_since, l.closed_at, l.ended_at IS NULL, l.stage, l.next_step, l.next_step_at)
       IS DISTINCT FROM (excluded.episode, excluded.failing_since, excluded.closed_at, excluded.ended_at IS NULL,
                         excluded.stage, excluded.next_step, excluded.next_step_at);

-- name: lifecycle_notice
-- One notice per endpoint, episode and kind (the primary key), whoever writes it first.
INSERT INTO breaker_notices (endpoint_id, episode, kind, workspace_id, detail)
VALUES (%(endpoint_id)s, %(episode)s, %(kind)s, %(workspace_id)s, %(detail)s::jsonb)
ON CONFLICT DO NOTHING
RETURNING endpoint_id;

-- name: notices_operational_endpoint
-- The workspace's one operational endpoint (migration 0011), pointed at its
-- notify URL of the moment.
INSERT INTO webhook_endpoints (workspace_id, url, purpose)
VALUES (%(workspace_id)s, %(url)s, 'operational')
ON CONFLICT (workspace_id) WHERE purpose = 'operational'
DO UPDATE SET url = EXCLUDED.url, active = true
RETURNING id;

-- name: notices_operational_event
-- The notice as an event and one delivery row to the operational endpoint:
-- sent, signed, retried and refused by policy like any other delivery.
-- The event's id is unique per workspace and day (0009, 0027); the notice's
-- own row (lifecycle_notice, same transaction) keeps it from being written twice.
WITH event AS (
    INSERT INTO events (id, workspace_id, type, sequence, payload, day)
    VALUES (%(event_id)s, %(workspace_id)s, %(type)s, nextval('event_sequence'), %(payload)s::jsonb,
            dispatcher_today())
    ON CONFLICT (workspace_id, id, day) DO NOTHING
    RETURNING id, day
)
INSERT INTO webhook_deliveries (workspace_id, endpoint_id, event_id, payload_hash, event_day)
SELECT %(workspace_id)s, %(endpoint_id)s, event.id, %(payload_hash)s, event.day FROM event
RETURNING id;

-- name: notices_claim
-- Due mails, each taken by one sender: the claim moves next_attempt_at past a
-- lease (a sender that dies leaves the mail due again after it) and counts
-- the attempt.  The owners are read now, so a contact set after the breaker
-- opened is used.
WITH due AS (
    SELECT endpoint_id, episode, kind FROM breaker_notices
     WHERE sent_at IS NULL AND next_attempt_at <= now()
     ORDER BY next_attempt_at
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE breaker_notices n
       SET attempts = n.attempts + 1, next_attempt_at = now() + make_interval(secs => %(lease)s)
      FROM due
     WHERE n.endpoint_id = due.endpoint_id AND n.episode = due.episode AND n.kind = due.kind
    RETURNING n.endpoint_id, n.episode, n.kind, n.workspace_id, n.attempts, n.detail
)
SELECT c.endpoint_id, c.episode, c.kind, c.workspace_id, c.attempts, e.url,
       e.owner_contact AS endpoint_owner, ws.owner_contact AS workspace_owner,
       -- Only a confirmed contact gets notices (0019); the rule is notifier.recipient.
       EXISTS (SELECT 1 FROM contact_confirmations k
                WHERE k.workspace_id = c.workspace_id AND k.address = e.owner_contact
                  AND k.confirmed_at IS NOT NULL) AS endpoint_owner_confirmed,
       EXISTS (SELECT 1 FROM contact_confirmations k
                WHERE k.workspace_id = c.workspace_id AND k.address = ws.owner_contact
                  AND k.confirmed_at IS NOT NULL) AS workspace_owner_confirmed,
       coalesce(s.consecutive_failures, 0) AS consecutive_failures, s.last_error, c.detail
  FROM claimed c
  LEFT JOIN webhook_endpoints e ON e.id = c.endpoint_id
  LEFT JOIN workspaces ws ON ws.id = c.workspace_id
  LEFT JOIN endpoint_state s ON s.endpoint_id = c.endpoint_id
 ORDER BY c.endpoint_id, c.episode, c.kind;

-- name: notices_finish
-- A mail's outcome: sent (sent_at), to be tried again in retry_in seconds, or
-- given up (retry_in NULL: next_attempt_at NULL, sent_at NULL).
UPDATE breaker_notices
   SET sent_at = CASE WHEN %(sent)s THEN now() END,
       recipient = %(recipient)s,
       last_error = %(error)s,
       next_attempt_at = CASE WHEN NOT %(sent)s AND %(retry_in)s::float8 IS NOT NULL
                              THEN now() + make_interval(secs => %(retry_in)s::float8) END
 WHERE endpoint_id = %(endpoint_id)s AND episode = %(episode)s AND kind = %(kind)s;

-- name: notices_prune
-- Episodes that ended (their 'recovered' notice exists) longer ago than the
-- retention go, both notices at once; an 'opened' notice of an episode still
-- open stays, or it would be found and sent again.
DELETE FROM breaker_notices n
 WHERE n.created_at < now() - make_interval(secs => %(older_than)s)
   AND EXISTS (SELECT 1 FROM breaker_notices r
                WHERE r.endpoint_id = n.endpoint_id AND r.episode = n.episode AND r.kind = 'recovered'
                  AND r.created_at < now() - make_interval(secs => %(older_than)s));

-- name: notices_defer
-- A claimed mail its recipient may not get yet (notifier.mails_per_recipient_hour):
-- due again in wait seconds, and the claim's attempt given back.
UPDATE breaker_notices
   SET attempts = greatest(attempts - 1, 0), next_attempt_at = now() + make_interval(secs => %(wait)s::float8)
 WHERE endpoint_id = %(endpoint_id)s AND episode = %(episode)s AND kind = %(kind)s;

-- name: notices_recent_mails
-- How long ago (seconds) each mail of the last hour to this address was
-- sent, notices and confirmation requests alike (indexes of 0019).
SELECT extract(epoch FROM now() - sent_at)::float8 AS age
  FROM breaker_notices
 WHERE lower(recipient) = lower(%(address)s) AND sent_at IS NOT NULL AND sent_at > now() - interval '1 hour'
UNION ALL
SELECT extract(epoch FROM now() - sent_at)::float8
  FROM contact_confirmations
 WHERE lower(address) = lower(%(address)s) AND sent_at IS NOT NULL AND sent_at > now() - interval '1 hour';

-- name: contacts_discover
-- Owner contacts in use get a confirmation row (0019), whoever set them (the
-- API, the CLI, raw SQL); rows of contacts no longer in use go, so a contact
-- named again is asked again.  Both see the statement's snapshot.
WITH used AS (
    SELECT workspace_id, owner_contact AS address FROM webhook_endpoints WHERE owner_contact IS NOT NULL
    UNION
    SELECT id, owner_contact FROM workspaces WHERE owner_contact IS NOT NULL
), gone AS (
    DELETE FROM contact_confirmations k
     WHERE NOT EXISTS (SELECT 1 FROM used u WHERE u.workspace_id = k.workspace_id AND u.address = k.address)
)
INSERT INTO contact_confirmations (workspace_id, address)
SELECT workspace_id, address FROM used
ON CONFLICT DO NOTHING;

-- name: contacts_claim
-- Due confirmation requests, each taken by one sender, as notices_claim does.
WITH due AS (
    SELECT workspace_id, address FROM contact_confirmations
     WHERE sent_at IS NULL AND next_attempt_at <= now()
     ORDER BY next_attempt_at
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
)
UPDATE contact_confirmations k
   SET attempts = k.attempts + 1, next_attempt_at = now() + make_interval(secs => %(lease)s)
  FROM due
 WHERE k.workspace_id = due.workspace_id AND k.address = due.address
RETURNING k.workspace_id, k.address, k.attempts;

-- name: contacts_finish
-- A confirmation request's outcome: sent (with the hash of the link's token),
-- tried again in retry_in seconds, or given up (retry_in NULL).
UPDATE contact_confirmations
   SET sent_at = CASE WHEN %(sent)s THEN now() END,
       token_hash = CASE WHEN %(sent)s THEN %(token_hash)s END,
       last_error = %(error)s,
       next_attempt_at = CASE WHEN NOT %(sent)s AND %(retry_in)s::float8 IS NOT NULL
                              THEN now() + make_interval(secs => %(retry_in)s::float8) END
 WHERE workspace_id = %(workspace_id)s AND address = %(address)s;

-- name: contacts_defer
UPDATE contact_confirmations
   SET attempts = greatest(attempts - 1, 0), next_attempt_at = now() + make_interval(secs => %(wait)s::float8)
 WHERE workspace_id = %(workspace_id)s AND address = %(address)s;

-- name: contacts_by_token
-- The API's confirm route: whose link this is (nothing for an unknown token).
SELECT workspace_id, address, confirmed_at FROM contact_confirmations WHERE token_hash = %(token_hash)s;

-- name: contacts_confirm
UPDATE contact_confirmations SET confirmed_at = coalesce(confirmed_at, now())
 WHERE token_hash = %(token_hash)s
RETURNING workspace_id, address;
