-- Operations: the fleet's heartbeat rows, `dispatcher status` and
-- `dispatcher check`.  Executed only by dispatcher/store/operations.py; rows
-- are read by column name.  Every age is computed from the database clock.

-- name: operations_heartbeat
-- One row per worker process, upserted every workers.status_interval.
INSERT INTO dispatcher_processes AS p (owner, region, host, pid, started_at, heartbeat_at, in_flight)
VALUES (%(owner)s, %(region)s, %(host)s, %(pid)s, to_timestamp(%(started)s), now(), %(in_flight)s)
ON CONFLICT (owner) DO UPDATE
   SET heartbeat_at = now(), in_flight = EXCLUDED.in_flight, pid = EXCLUDED.pid, region = EXCLUDED.region;

-- name: operations_leave
-- A worker that stops gracefully removes its row: status lists live processes.
DELETE FROM dispatcher_processes WHERE owner = %(owner)s;

-- name: operations_mark_leader
-- The upkeep leader, at the start of each round it holds the region's lease
-- (engine_hold_leadership); returns the live workers for the gauge.
WITH marked AS (
    UPDATE dispatcher_processes SET leader_at = now() WHERE owner = %(owner)s
)
SELECT count(*) AS workers_alive FROM dispatcher_processes
 WHERE region = %(region)s AND heartbeat_at > now() - make_interval(secs => %(alive_within)s);

-- name: operations_prune_processes
DELETE FROM dispatcher_processes WHERE heartbeat_at < now() - interval '1 day';

-- name: operations_statement_timeout
-- status and check must answer within a bound, even on a struggling database.
SELECT set_config('statement_timeout', %(ms)s, false);

-- name: operations_stopped
-- A supervisor stops (migration 0024): its workers' rows go (a fast stop
-- leaves them, as its workers exit without leaving), and the region's last
-- stop says when, how and which one.
WITH gone AS (
    DELETE FROM dispatcher_processes WHERE owner = ANY (%(owners)s::text[])
)
INSERT INTO fleet_stops AS f (region, stopped_at, how, host, pid)
VALUES (%(region)s, now(), %(how)s, %(host)s, %(pid)s)
ON CONFLICT (region) DO UPDATE SET stopped_at = now(), how = EXCLUDED.how, host = EXCLUDED.host, pid = EXCLUDED.pid;

-- name: operations_fleet
-- The fleet figures of the health rule (dispatcher/rules/health.py FleetFigures):
-- the heartbeats, the region's last clean stop, and whether any row waits.
SELECT extract(epoch FROM now() - max(p.heartbeat_at))::float8 AS heartbeat_age,
       count(*) FILTER (WHERE p.heartbeat_at > now() - make_interval(secs => %(alive_within)s)) AS workers_alive,
       extract(epoch FROM now() - max(p.leader_at))::float8 AS leader_age,
       (SELECT extract(epoch FROM now() - s.stopped_at)::float8 FROM fleet_stops s
         WHERE s.region = %(region)s) AS stopped_age,
       (SELECT s.how FROM fleet_stops s WHERE s.region = %(region)s) AS stopped_how,
       EXISTS (SELECT 1 FROM webhook_deliveries d WHERE d.status = 'pending') AS rows_waiting
  FROM dispatcher_processes p
 WHERE p.region = %(region)s;

-- name: operations_last_stop
-- The region's last clean stop, for status (null: none recorded).
SELECT stopped_at, how, host, pid FROM fleet_stops WHERE region = %(region)s;

-- name: operations_workers
-- Every live worker process (heartbeat within alerts.heartbeat_age), and the
-- number of silent rows (killed processes whose rows wait for pruning).
SELECT owner, host, pid, started_at, heartbeat_at, in_flight,
       extract(epoch FROM now() - heartbeat_at)::float8 AS heartbeat_age,
       -- the leader: the freshest stamp, recent, of a process still alive (a
       -- killed leader's stamp stays recent for a while; its lock is gone)
       leader_at IS NOT NULL AND leader_at = max(leader_at) OVER ()
           AND leader_at > now() - make_interval(secs => %(leader_within)s)
           AND heartbeat_at > now() - make_interval(secs => %(alive_within)s) AS leader,
       leader_at,
       heartbeat_at > now() - make_interval(secs => %(alive_within)s) AS alive
  FROM dispatcher_processes
 WHERE region = %(region)s
 ORDER BY host, owner;

-- name: operations_pending
-- Pending rows: total, scheduled (not yet due), and due rows by how long
-- they have been overdue; bands end at the RFC's 5 and 15 minute thresholds.
-- A row in flight (its lease ahead; it keeps its due time, 0013) counts as
-- scheduled, not due.
SELECT count(*) AS total,
       count(*) FILTER (WHERE NOT due) AS scheduled,
       count(*) FILTER (WHERE due) AS due,
       count(*) FILTER (WHERE due AND next_attempt_at > now() - interval '1 minute') AS overdue_under_1m,
       count(*) FILTER (WHERE due AND next_attempt_at <= now() - interval '1 minute'
                          AND next_attempt_at > now() - interval '5 minutes') AS overdue_1m_5m,
       count(*) FILTER (WHERE due AND next_attempt_at <= now() - interval '5 minutes'
                          AND next_attempt_at > now() - interval '15 minutes') AS overdue_5m_15m,
       count(*) FILTER (WHERE due AND next_attempt_at <= now() - interval '15 minutes') AS overdue_over_15m,
       now() AS db_now
  FROM (SELECT next_attempt_at,
               next_attempt_at <= now() AND dispatcher_unleased(locked_until) AS due
          FROM webhook_deliveries
         WHERE status = 'pending') p;

-- name: operations_oldest_due
-- The oldest due row of a closed-breaker endpoint: the one the backlog rule judges.
SELECT d.id, d.workspace_id, d.endpoint_id, d.event_id, d.attempt, d.created_at, d.next_attempt_at,
       extract(epoch FROM now() - d.next_attempt_at)::float8 AS overdue_seconds, d.last_error
  FROM webhook_deliveries d
 WHERE d.status = 'pending' AND d.next_attempt_at <= now()
   AND dispatcher_unleased(d.locked_until)
   AND NOT EXISTS (SELECT 1 FROM endpoint_state s WHERE s.endpoint_id = d.endpoint_id AND s.state <> 'closed')
 ORDER BY d.next_attempt_at
 LIMIT 1;

-- name: operations_status_counts
-- Rows created in the last hour and day, by their status now.  The BRIN
-- index on created_at (migration 0003) limits the scan to the last day's blocks.
SELECT status,
       count(*) FILTER (WHERE created_at > now() - interval '1 hour') AS last_hour,
       count(*) AS last_day
  FROM webhook_deliveries
 WHERE created_at > now() - interval '1 day'
 GROUP BY status;

-- name: operations_breakers
-- Open and half-open breakers, with the rows waiting behind each.
SELECT s.endpoint_id, e.workspace_id, s.state, coalesce(s.opened_at, s.updated_at) AS since,
       s.consecutive_failures, s.open_until, s.last_error,
       (SELECT count(*) FROM webhook_deliveries d
         WHERE d.endpoint_id = s.endpoint_id AND d.status = 'pending') AS pending
  FROM endpoint_state s
  LEFT JOIN webhook_endpoints e ON e.id = s.endpoint_id
 WHERE s.state <> 'closed'
 ORDER BY since, s.endpoint_id;

-- name: operations_top_failing
-- The endpoints with the most failed attempts in the last hour (attempt
-- history; the BRIN index on started_at bounds the scan). A shadow row's mark
-- (result shadow) is neither a delivery nor a failure: nothing was sent.
SELECT a.endpoint_id, e.workspace_id, count(*) AS failures, max(a.started_at) AS last_failure_at,
       (array_agg(a.result ORDER BY a.started_at DESC))[1] AS last_result
  FROM webhook_delivery_attempts a
  LEFT JOIN webhook_endpoints e ON e.id = a.endpoint_id
 WHERE a.started_at > now() - interval '1 hour' AND a.result NOT IN ('delivered', 'shadow')
 GROUP BY a.endpoint_id, e.workspace_id
 ORDER BY failures DESC, a.endpoint_id
 LIMIT 10;
