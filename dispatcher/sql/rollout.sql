-- Rollout controls and gate reports (docs/rollout.md). Executed only by
-- dispatcher/store/rollout.py. The outbox decision itself lives in the
-- SQL functions of migration 0004, called by dispatcher_send_event (0012).

-- name: rollout_percent
SELECT percent, updated_at FROM rollout_settings;

-- name: rollout_set_percent
UPDATE rollout_settings SET percent = %(percent)s, updated_at = now() RETURNING percent;

-- name: rollout_unknown_workspaces
SELECT i.id FROM unnest(%(ids)s::text[]) AS i(id)
 WHERE NOT EXISTS (SELECT 1 FROM workspaces w WHERE w.id = i.id)
 ORDER BY i.id;

-- name: rollout_list
INSERT INTO rollout_workspaces (workspace_id, list)
SELECT DISTINCT i.id, %(list)s FROM unnest(%(ids)s::text[]) AS i(id)
ON CONFLICT (workspace_id) DO UPDATE SET list = EXCLUDED.list, updated_at = now();

-- name: rollout_unlist
DELETE FROM rollout_workspaces WHERE workspace_id = ANY (%(ids)s::text[]);

-- name: rollout_listed
SELECT workspace_id, list FROM rollout_workspaces ORDER BY list, workspace_id;

-- name: rollout_clear_flag
UPDATE workspaces SET flags = flags - 'webhook_outbox' WHERE id = %(id)s RETURNING id;

-- name: rollout_counts
-- How many workspaces the rule puts on the outbox, and why.
SELECT count(*) AS workspaces,
       count(*) FILTER (WHERE webhook_outbox_on(w.flags -> 'webhook_outbox', r.list, p.percent,
                                                rollout_bucket(w.id))) AS outbox_on,
       count(*) FILTER (WHERE w.flags -> 'webhook_outbox' = 'true'::jsonb) AS flag_on,
       count(*) FILTER (WHERE w.flags -> 'webhook_outbox' = 'false'::jsonb) AS flag_off,
       count(*) FILTER (WHERE r.list = 'include') AS included,
       count(*) FILTER (WHERE r.list = 'exclude') AS excluded
  FROM workspaces w
  LEFT JOIN rollout_workspaces r ON r.workspace_id = w.id
 CROSS JOIN (SELECT percent FROM rollout_settings) p;

-- name: rollout_pending
-- Rows still draining, by mode (served by webhook_deliveries_pending_age).
SELECT mode, count(*) AS pending FROM webhook_deliveries WHERE status = 'pending' GROUP BY mode ORDER BY mode;

-- name: gate_backlog_samples
-- The upkeep leader's backlog age, one sample per round (migration 0016);
-- NULL (nothing was due) is an age of 0, as the gauge sends it.
SELECT taken_at, coalesce(oldest_age, 0) AS age
  FROM backlog_samples
 WHERE taken_at >= %(since)s AND taken_at <= %(until)s
 ORDER BY taken_at;

-- name: gate_alert_counts
-- Backlog alert episodes that fired in the window and in the stretch before it.
SELECT count(*) FILTER (WHERE fired_at >= %(since)s) AS in_window,
       count(*) FILTER (WHERE fired_at < %(since)s) AS before
  FROM alert_episodes
 WHERE alert = 'backlog' AND fired_at >= %(before)s AND fired_at < %(until)s;

-- name: gate_shadow_hours
-- Phase 0's shadow rows created in the window, per hour of it (hour k is
-- [since + k h, since + k h + 1 h)): how many, how many are still unmarked,
-- and the longest wait from creation to being marked; a row not marked yet
-- counts with its age so far, so a stopped dispatcher cannot pass.
SELECT floor(extract(epoch FROM created_at - %(since)s) / 3600)::int AS hour,
       count(*) AS rows,
       count(*) FILTER (WHERE status = 'pending') AS unmarked,
       max(extract(epoch FROM coalesce(finished_at, now()) - created_at))::float8 AS longest_wait
  FROM webhook_deliveries
 WHERE mode = 'shadow' AND created_at >= %(since)s AND created_at < %(until)s
 GROUP BY 1
 ORDER BY 1;

-- name: gate_rollout_state
-- The percentage, since when it holds, and how many workspaces the rule
-- keeps off the outbox all the same (an explicit flag off, the exclude list).
SELECT p.percent, p.updated_at,
       (SELECT count(*) FROM workspaces w
          LEFT JOIN rollout_workspaces r ON r.workspace_id = w.id
         WHERE NOT webhook_outbox_on(w.flags -> 'webhook_outbox', r.list, p.percent, rollout_bucket(w.id)))
           AS workspaces_off
  FROM rollout_settings p;

-- name: gate_include_list
SELECT workspace_id FROM rollout_workspaces WHERE list = 'include' ORDER BY workspace_id;

-- name: gate_phase1_workspaces
-- Each named workspace: on the outbox now, and its events of the window
-- queued on the outbox (a live row) or sent by the synchronous path (shadow
-- rows and no live row: the flag was off when it was sent).
SELECT i.id AS workspace_id, w.id IS NOT NULL AS known,
       coalesce(webhook_outbox_on(w.flags -> 'webhook_outbox', r.list,
                                  (SELECT percent FROM rollout_settings), rollout_bucket(w.id)), false) AS on_outbox,
       coalesce(f.outbox_events, 0) AS outbox_events,
       coalesce(f.synchronous_events, 0) AS synchronous_events,
       f.last_synchronous
  FROM unnest(%(workspaces)s::text[]) AS i(id)
  LEFT JOIN workspaces w ON w.id = i.id
  LEFT JOIN rollout_workspaces r ON r.workspace_id = w.id
  LEFT JOIN LATERAL (
        SELECT count(*) FILTER (WHERE e.live) AS outbox_events,
               count(*) FILTER (WHERE e.shadow AND NOT e.live) AS synchronous_events,
               max(e.created_at) FILTER (WHERE e.shadow AND NOT e.live) AS last_synchronous
          FROM (SELECT ev.created_at,
                       EXISTS (SELECT 1 FROM webhook_deliveries d WHERE d.workspace_id = ev.workspace_id
                                  AND d.event_id = ev.id AND d.event_day = ev.day AND d.mode = 'live') AS live,
                       EXISTS (SELECT 1 FROM webhook_deliveries d WHERE d.workspace_id = ev.workspace_id
                                  AND d.event_id = ev.id AND d.event_day = ev.day AND d.mode = 'shadow') AS shadow
                  FROM events ev
                 WHERE ev.workspace_id = i.id AND ev.created_at >= %(since)s AND ev.created_at < %(until)s) e
       ) f ON true
 ORDER BY i.id;

-- name: gate_phase1_missing
-- Events of the given workspaces queued for at least one endpoint (a live
-- row) that the test receiver never got, with their live rows' statuses.
SELECT e.id, e.workspace_id, e.type, e.created_at,
       (SELECT array_agg(DISTINCT d.status ORDER BY d.status) FROM webhook_deliveries d
         WHERE d.workspace_id = e.workspace_id AND d.event_id = e.id AND d.event_day = e.day
           AND d.mode = 'live') AS statuses
  FROM events e
  LEFT JOIN unnest(%(received)s::text[]) AS r(id) ON r.id = e.id
 WHERE e.workspace_id = ANY (%(workspaces)s::text[])
   AND e.created_at >= %(since)s AND e.created_at < %(until)s
   AND r.id IS NULL
   AND EXISTS (SELECT 1 FROM webhook_deliveries d
                WHERE d.workspace_id = e.workspace_id AND d.event_id = e.id AND d.event_day = e.day
                  AND d.mode = 'live')
 ORDER BY e.created_at, e.id;

-- name: gate_phase2
-- docs/rollout.md defines these. Base: live, non-replay rows created in the
-- window whose event type may be retried. Never retried: such a row that
-- ended failed/dead after at most one attempt, to an endpoint that still
-- exists and is active, and whose event was not delivered to that endpoint
-- by any other row (a replay or recover) since.
SELECT count(*) AS deliveries,
       count(*) FILTER (
           WHERE d.status IN ('failed', 'dead') AND d.attempt <= 1 AND coalesce(e.active, false)
             AND NOT EXISTS (SELECT 1 FROM webhook_deliveries o
                              WHERE o.workspace_id = d.workspace_id AND o.event_id = d.event_id
                                AND o.endpoint_id = d.endpoint_id AND o.status = 'delivered')) AS never_retried
  FROM webhook_deliveries d
  JOIN events ev ON ev.id = d.event_id AND ev.workspace_id = d.workspace_id AND ev.day = d.event_day
  LEFT JOIN webhook_endpoints e ON e.id = d.endpoint_id
 WHERE d.mode = 'live' AND d.replay_of IS NULL AND d.created_at >= %(since)s AND d.created_at < %(until)s
   AND NOT (ev.type = ANY (%(single_attempt_types)s::text[]))
   AND d.workspace_id = ANY (%(workspaces)s::text[]);

-- name: gate_phase2_duplicates
-- Sends the system knows were duplicates: a 2xx for an (event, endpoint)
-- that had already had one, across rows (replays) and attempts.
SELECT coalesce(sum(n - 1), 0) AS duplicates, count(*) AS events
  FROM (SELECT d.workspace_id, d.event_id, d.endpoint_id, count(*) AS n
          FROM webhook_deliveries d
          JOIN webhook_delivery_attempts a ON a.delivery_id = d.id AND a.result = 'delivered'
         WHERE d.mode = 'live' AND d.created_at >= %(since)s AND d.created_at < %(until)s
           AND d.workspace_id = ANY (%(workspaces)s::text[])
         GROUP BY d.workspace_id, d.event_id, d.endpoint_id
        HAVING count(*) > 1) dup;
