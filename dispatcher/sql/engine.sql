-- The dispatcher's queries, executed only by dispatcher/store/engine.py.
-- Rows are read by column name (store.engine builds its row types from
-- cursor.description), so every output column has a name.
-- Every due/lease/retry time is computed from the database clock (now()).

-- name: engine_claim
-- One short transaction, committed before any POST (docs/claim.md):
--  1. probes: flip at most a few expired-open breakers to half_open, with a
--     probe lease in open_until; FOR UPDATE SKIP LOCKED makes exactly one
--     process across the fleet the prober of an endpoint.
--  2. walk the endpoints that have pending rows (a loose index scan over
--     webhook_deliveries_due), starting after a rotating cursor and wrapping,
--     and take from each only what keeps its leased rows, across the region,
--     within per_endpoint (and its rate limit), and no more than this
--     process's share of them: no endpoint can fill a batch, every endpoint
--     is visited in turn, and a hot endpoint's slots are spread over the
--     processes that claim it.
--  3. stamp the lease in columns no index names (locked_until, locked_by,
--     claim_token: a HOT update, migration 0013), and add what each endpoint
--     now leases to endpoint_leases; the due scans skip rows whose lease is
--     ahead, so a crashed owner's rows come due again when it lapses;
--     claim_token fences results.
-- It is planned on every execution (store/engine.py: force_custom_plan):
-- a plan kept from when the table looked empty probed each endpoint through
-- webhook_deliveries_pending_age, filtering every due row (docs/benchmarks.md).
-- Every scan of webhook_deliveries is bounded by the claim's window of ids,
-- [floor, ceiling) (dispatcher_claim_window, refreshed by the worker every
-- few seconds; docs/claim.md, "The claim's window"): planned with the values,
-- it reads only the day partitions that can hold a pending row.
WITH RECURSIVE token AS (
    SELECT nextval('webhook_claim_tokens') AS value
), fence AS MATERIALIZED (
    -- False once the supervisor has released this owner (it died with this
    -- claim on the wire): then nothing below writes.  While true, it holds the
    -- owner's lock, so a release waits for this claim to commit (0029).
    SELECT dispatcher_owner_live(%(owner)s) AS live
), probe_ids AS (
    UPDATE endpoint_state s
       SET state = 'half_open', open_until = now() + make_interval(secs => %(lease)s), updated_at = now()
     WHERE s.endpoint_id IN (
            SELECT o.endpoint_id FROM endpoint_state o
             -- breaker.BreakerPolicy.admits: a missing deadline counts as lapsed
             WHERE o.state <> 'closed' AND (o.open_until IS NULL OR o.open_until <= now())
               AND o.endpoint_id <> ALL (%(busy)s::bigint[]) AND (SELECT live FROM fence)
               -- a paused endpoint is never probed (a straggler row: see candidates); an
               -- anti-join, so the planner still drives the EXISTS below from endpoint_state
               AND NOT EXISTS (SELECT 1 FROM webhook_endpoints p
                                WHERE p.id = o.endpoint_id AND p.paused_at IS NOT NULL)
               -- OFFSET 0: a test per endpoint (a probe of the due index in each
               -- partition of the window), never pulled up into a join: over
               -- partitions the planner hashed every pending row of the window
               -- whenever it guessed endpoint_state large (unanalysed)
               AND EXISTS (SELECT 1 FROM webhook_deliveries d
                            WHERE d.endpoint_id = o.endpoint_id AND d.status = 'pending'
                              AND d.next_attempt_at <= now()
                              AND dispatcher_unleased(d.locked_until)
                              AND d.id >= %(floor)s AND d.id < %(ceiling)s
                           OFFSET 0)
             ORDER BY o.open_until
             LIMIT 16
               FOR UPDATE SKIP LOCKED)
    RETURNING s.endpoint_id
), probe_rows AS (
    SELECT d.id FROM probe_ids p CROSS JOIN LATERAL (
        SELECT d.id FROM webhook_deliveries d
         WHERE d.endpoint_id = p.endpoint_id AND d.status = 'pending' AND d.next_attempt_at <= now()
           AND dispatcher_unleased(d.locked_until)
           AND d.id >= %(floor)s AND d.id < %(ceiling)s
         ORDER BY d.next_attempt_at
         LIMIT 1
           FOR UPDATE SKIP LOCKED) d
), refill_rows AS (
    -- Lanes this process already holds slots for (docs/claim.md, "Holding a
    -- lane"): more due rows of the endpoint, no new slot and no lane lock, as
    -- the slots are this process's already.  A rate-limited endpoint or one
    -- whose breaker is not closed gets none: the lane then runs dry and its
    -- slots go back.
    SELECT d.id FROM json_to_recordset(%(refill)s::json) AS f(endpoint_id bigint, want int)
     CROSS JOIN LATERAL (
        SELECT d.id FROM webhook_deliveries d
         WHERE d.endpoint_id = f.endpoint_id AND d.status = 'pending' AND d.next_attempt_at <= now()
           AND dispatcher_unleased(d.locked_until)
           AND d.id >= %(floor)s AND d.id < %(ceiling)s
         ORDER BY d.next_attempt_at
         LIMIT f.want
           FOR UPDATE SKIP LOCKED) d
     WHERE coalesce((SELECT s.state FROM endpoint_state s WHERE s.endpoint_id = f.endpoint_id), 'closed') = 'closed'
       AND (SELECT p.max_per_second FROM webhook_endpoints p WHERE p.id = f.endpoint_id) IS NULL
       AND (SELECT p.paused_at FROM webhook_endpoints p WHERE p.id = f.endpoint_id) IS NULL
), renewed AS (
    -- A lane whose slots' lease is a third through keeps them for another
    -- lease (LanePolicy.renewal_due): not at every refill, as each renewal
    -- writes the lane's ledger entries.
    UPDATE endpoint_leases l SET until = now() + make_interval(secs => %(lease)s)
      FROM json_to_recordset(%(refill)s::json) AS f(endpoint_id bigint, want int, renew boolean)
     WHERE l.endpoint_id = f.endpoint_id AND f.renew AND l.owner = %(owner)s AND l.claim_token > 0
       AND (SELECT live FROM fence)
), after_cursor(endpoint_id) AS (
    -- Each step orders by (endpoint_id, next_attempt_at), the due index's key,
    -- though it takes only the endpoint: ordered by endpoint_id alone, the
    -- planner could step through the (endpoint_id, id) index, which holds
    -- every row, and then read each delivered row of an endpoint before its
    -- first pending one (docs/claim.md, "Merged index entries").
    (SELECT endpoint_id FROM webhook_deliveries
      WHERE status = 'pending' AND endpoint_id > %(after)s AND id >= %(floor)s AND id < %(ceiling)s
      ORDER BY endpoint_id, next_attempt_at LIMIT 1)
    UNION ALL
    SELECT (SELECT d.endpoint_id FROM webhook_deliveries d
             WHERE d.status = 'pending' AND d.endpoint_id > a.endpoint_id
               AND d.id >= %(floor)s AND d.id < %(ceiling)s
             ORDER BY d.endpoint_id, d.next_attempt_at LIMIT 1)
      FROM after_cursor a WHERE a.endpoint_id IS NOT NULL
), before_cursor(endpoint_id) AS (
    (SELECT endpoint_id FROM webhook_deliveries
      WHERE status = 'pending' AND id >= %(floor)s AND id < %(ceiling)s
      ORDER BY endpoint_id, next_attempt_at LIMIT 1)
    UNION ALL
    SELECT (SELECT d.endpoint_id FROM webhook_deliveries d
             WHERE d.status = 'pending' AND d.endpoint_id > b.endpoint_id
               AND d.id >= %(floor)s AND d.id < %(ceiling)s
             ORDER BY d.endpoint_id, d.next_attempt_at LIMIT 1)
      FROM before_cursor b WHERE b.endpoint_id IS NOT NULL AND b.endpoint_id <= %(after)s
), endpoints AS (
    SELECT endpoint_id FROM after_cursor WHERE endpoint_id IS NOT NULL
    UNION ALL
    SELECT endpoint_id FROM before_cursor WHERE endpoint_id IS NOT NULL AND endpoint_id <= %(after)s
), candidates AS (
    -- Per endpoint, in this order (each LATERAL uses the one before; OFFSET 0
    -- keeps them apart): take the endpoint's lane lock for this transaction, or
    -- skip the endpoint if another claimer holds it; count its room under the
    -- region-wide limits (dispatcher_lane_free, migration 0013: a fresh snapshot,
    -- so it sees what the previous holder of the lock committed); take that many
    -- due rows.  The lock is released when this statement commits, by which time
    -- our leases are visible to the next holder.  Keys (0x0E14, id mod 2^31 - 1):
    -- two-int advisory locks never meet one-bigint locks (the API's); a rare
    -- collision only makes one claim skip an endpoint.
    -- The endpoint's rate is a scalar subquery, not a join: joined, the planner
    -- hashed the whole endpoint walk first, visiting every endpoint with
    -- pending rows instead of stopping once the batch is full.
    -- A paused endpoint (migration 0020) gets no room: its rows are `held`,
    -- not pending, so the walk meets it only for a straggler -- a row a
    -- producer wrote `pending` in a transaction that began before the pause
    -- committed -- until the upkeep round holds it (engine_hold_stragglers).
    SELECT d.id, e.endpoint_id, lane.max_per_second FROM endpoints e
     CROSS JOIN LATERAL (SELECT pg_try_advisory_xact_lock(3604, (e.endpoint_id %% 2147483647)::int) AS held,
                                (SELECT p.max_per_second FROM webhook_endpoints p WHERE p.id = e.endpoint_id)
                                    AS max_per_second,
                                (SELECT p.paused_at IS NOT NULL FROM webhook_endpoints p WHERE p.id = e.endpoint_id)
                                    AS paused
                          OFFSET 0) lock
     CROSS JOIN LATERAL (SELECT CASE WHEN lock.held AND lock.paused IS NOT TRUE
                                     THEN least(%(share)s, dispatcher_lane_free(e.endpoint_id, %(per_endpoint)s,
                                                                                lock.max_per_second))
                                     ELSE 0 END AS room,
                                lock.max_per_second
                          OFFSET 0) lane
     CROSS JOIN LATERAL (
        SELECT d.id FROM webhook_deliveries d
         WHERE d.endpoint_id = e.endpoint_id AND d.status = 'pending' AND d.next_attempt_at <= now()
           -- a leased row keeps its due time: at most the endpoint's lane
           -- (4) of them are read and passed over here
           AND dispatcher_unleased(d.locked_until)
           AND d.id >= %(floor)s AND d.id < %(ceiling)s
         ORDER BY d.next_attempt_at
         LIMIT lane.room
           FOR UPDATE SKIP LOCKED) d
     WHERE e.endpoint_id <> ALL (%(busy)s::bigint[])
       -- A scalar subquery, evaluated per endpoint in walk order.  Written as
       -- NOT EXISTS, Postgres 16 planned a hash right anti join that hashed
       -- the whole walk first: every endpoint with pending rows visited, and
       -- the batch taken in hash order instead of the cursor's.
       AND coalesce((SELECT s.state FROM endpoint_state s WHERE s.endpoint_id = e.endpoint_id), 'closed') = 'closed'
     LIMIT %(limit)s
), rated AS (
    -- Rate-limited endpoints pay one token per row taken; under the lane lock,
    -- and ON CONFLICT reads the bucket's latest version, not our snapshot's.
    INSERT INTO endpoint_rate AS r (endpoint_id, tokens, refilled_at, last_taken)
    SELECT c.endpoint_id, dispatcher_bucket_after(c.max_per_second, NULL, 0, count(*)), now(), count(*)
      FROM candidates c
     WHERE c.max_per_second IS NOT NULL AND (SELECT live FROM fence)
     GROUP BY c.endpoint_id, c.max_per_second
    ON CONFLICT (endpoint_id) DO UPDATE
       SET tokens = dispatcher_bucket_after(
               (SELECT p.max_per_second FROM webhook_endpoints p WHERE p.id = r.endpoint_id),
               r.tokens, extract(epoch FROM now() - r.refilled_at)::float8, excluded.last_taken),
           refilled_at = now(), last_taken = excluded.last_taken
), claimed AS (
    UPDATE webhook_deliveries w
       SET locked_until = now() + make_interval(secs => %(lease)s),
           locked_by = %(owner)s,
           claim_token = token.value
      FROM token
     -- By primary key, as an array: joined to the three sets instead, the planner
     -- hashed a scan of the whole outbox once the refill's estimate (a JSON
     -- list) made the sets look large.
     WHERE w.id = ANY (ARRAY(SELECT id FROM probe_rows UNION ALL SELECT id FROM candidates
                             UNION ALL SELECT id FROM refill_rows))
       AND w.id >= %(floor)s AND w.id < %(ceiling)s AND (SELECT live FROM fence)
    RETURNING w.id, w.workspace_id, w.endpoint_id, w.event_id, w.attempt, w.mode, w.created_at, w.claim_token,
              w.trace_context, w.held_seconds, w.event_day,
              w.id <> ALL (ARRAY(SELECT id FROM refill_rows)) AS slot
), leases AS (
    -- The slots this claim takes of each endpoint's lane: one per row it took
    -- by the walk or a probe, held by this process until it gives them back
    -- (engine_record's slot list) or the lease lapses.
    INSERT INTO endpoint_leases (endpoint_id, claim_token, owner, leased, until)
    SELECT endpoint_id, claim_token, %(owner)s, count(*), now() + make_interval(secs => %(lease)s)
      FROM claimed
     WHERE slot
     GROUP BY endpoint_id, claim_token
), claimed_events AS MATERIALIZED (
    -- The event, endpoint and workspace of the claimed rows are fetched by
    -- primary key (an event's is (workspace_id, id, day): ids are unique per
    -- workspace, migration 0009, and its partition is its day, 0027), once per
    -- distinct key of the claim (an event fanned out to ten endpoints is one
    -- lookup, a workspace's fifty rows one), each a NULL when the row is gone,
    -- as a LEFT JOIN would give.  Written as joins to the tables, the planner
    -- would hash-join the whole events table whenever its statistics say it is
    -- small -- a fresh or newly analysed table, or a cached generic plan -- and
    -- every claim then paid a scan of the events table (seen in the isolation
    -- benchmark: 12 ms per claim at 30k events).  The events come from
    -- dispatcher_claim_events (0027), which reads only the partitions of the
    -- claimed rows' days and finds a row's event even when its event_day is
    -- wrong.  MATERIALIZED keeps each lookup to one call per key; the joins
    -- below are between these small sets only.
    SELECT f.workspace_id, f.event_id, f.event_day, f.ev
      FROM (SELECT array_agg(k.workspace_id) AS workspace_ids, array_agg(k.event_id) AS event_ids,
                   array_agg(k.event_day) AS days
              FROM (SELECT DISTINCT workspace_id, event_id, event_day FROM claimed) k) keys
     CROSS JOIN LATERAL dispatcher_claim_events(keys.workspace_ids, keys.event_ids, keys.days) f
     WHERE keys.event_ids IS NOT NULL
), claimed_workspaces AS MATERIALIZED (
    SELECT k.workspace_id, (SELECT ws FROM workspaces ws WHERE ws.id = k.workspace_id) AS ws
      FROM (SELECT DISTINCT workspace_id FROM claimed) k
), claimed_endpoints AS MATERIALIZED (
    -- The endpoint's own secrets once it has them, else its workspace's
    -- (dispatcher_signing_secrets, migration 0010).
    SELECT e.endpoint_id, e.workspace_id, (e.ep).url, (e.ep).active, (e.ep).trace_headers, (w.ws).id AS ws_id,
           dispatcher_signing_secrets((e.ep).secret, (e.ep).previous_secret, (e.ep).secret_rotated_at,
                                      (w.ws).secret, (w.ws).previous_secret, (w.ws).secret_rotated_at,
                                      %(grace)s::float8) AS signing
      FROM (SELECT k.endpoint_id, k.workspace_id,
                   (SELECT ep FROM webhook_endpoints ep WHERE ep.id = k.endpoint_id) AS ep
              FROM (SELECT DISTINCT endpoint_id, workspace_id FROM claimed) k
            OFFSET 0) e
      JOIN claimed_workspaces w ON w.workspace_id = e.workspace_id
)
SELECT c.id, c.claim_token, c.slot AS grants_slot, c.endpoint_id, c.event_id, c.attempt + 1 AS attempt, c.mode,
       -- time held while its endpoint was paused does not count (migration 0020)
       extract(epoch FROM now() - c.created_at)::float8 - c.held_seconds AS age,
       extract(epoch FROM now())::float8 AS db_now,
       c.endpoint_id IN (SELECT endpoint_id FROM probe_ids) AS is_probe,
       (v.ev).type AS event_type, (v.ev).sequence,
       to_char((v.ev).occurred_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') AS occurred_at,
       -- An event fanned out to several endpoints is claimed as several rows:
       -- its payload is rendered and sent once per claim, on the first of them
       -- (an event is its workspace and id: the same id in two workspaces is two events)
       -- (store/engine.py hands the same string to the others).  event_type
       -- still tells a missing event (NULL) from a shared payload.
       CASE WHEN row_number() OVER (PARTITION BY c.workspace_id, c.event_id) = 1
            THEN (v.ev).payload::text END AS payload,
       p.url, p.active,
       p.signing[1] AS secret, p.signing[2] AS previous_secret,
       p.ws_id AS workspace_id,
       -- Tracing (migration 0022): the producer's context, the delivery's own
       -- trace, and whether the endpoint's POSTs carry traceparent.  As text:
       -- psycopg2 would decode jsonb for every row; the worker parses them only
       -- when a span is kept (tracing.carrier_of), and not at all untraced.
       (v.ev).trace_context::text AS event_trace, c.trace_context::text AS delivery_trace,
       coalesce(p.trace_headers, true) AS trace_headers
  FROM claimed c
  JOIN claimed_events v ON v.workspace_id = c.workspace_id AND v.event_id = c.event_id AND v.event_day = c.event_day
  JOIN claimed_endpoints p ON p.endpoint_id = c.endpoint_id AND p.workspace_id = c.workspace_id;

-- name: engine_record
-- One statement per flush: every result of the batch, fenced by its claim
-- token so a worker whose lease lapsed cannot overwrite the new owner's
-- result, and the attempt history appended for exactly the rows it wrote;
-- then the lane slots the worker gives back (docs/claim.md, "Holding a lane").
-- A result gives back no slot by itself: the worker keeps a lane's slots while
-- it has rows for it, and names here what each of its slot entries holds now
-- (keep: an absolute count, so a flush written twice gives nothing back twice).
-- Slots given back while a timed-out attempt's hold runs (limits.slot_hold)
-- stay counted that much longer in an entry of their own, keyed by the claim
-- token negated, which dispatcher_lane_free counts until it lapses.
-- Both lists travel as JSON (store/engine.py builds them with the C json
-- encoder; a result is an array read by position, a slot entry an object):
-- adapting Python lists element by element into SQL array literals cost more
-- worker CPU than the rest of the flush.
WITH results AS (
    -- One JSON array per result, read by position (store/engine.py RESULT_FIELDS): as
    -- objects they cost the worker twice as much to encode, and json_to_recordset hashed
    -- each object's keys.
    SELECT (r->>0)::bigint AS id, (r->>1)::bigint AS token, r->>2 AS status, (r->>3)::int AS attempt,
           (r->>4)::float8 AS delay, r->>5 AS error, (r->>6)::int AS status_code, r->>7 AS result,
           (r->>8)::float8 AS started_ago, (r->>9)::int AS duration_ms, r->>10 AS excerpt,
           (r->>11)::bigint AS endpoint_id, r->>12 AS traceparent, r->>13 AS trace_id
      FROM jsonb_array_elements(%(results)s::jsonb) AS r
), slots AS (
    SELECT * FROM json_to_recordset(%(slots)s::json)
        AS s(endpoint_id bigint, token bigint, keep int, held int, hold float8)
), updated AS (
    UPDATE webhook_deliveries w
       -- A retry of a row whose endpoint was paused while it was in flight is
       -- held, not pending (migration 0020).  The lookup is made for retries
       -- only (CASE evaluates it only then): deliveries and ends pay nothing.
       SET status = CASE WHEN r.status = 'pending'
                          AND (SELECT p.paused_at FROM webhook_endpoints p WHERE p.id = w.endpoint_id) IS NOT NULL
                         THEN 'held' ELSE r.status END,
           attempt = r.attempt,
           next_attempt_at = CASE WHEN r.status = 'pending'
                                  THEN now() + make_interval(secs => r.delay) ELSE w.next_attempt_at END,
           last_error = r.error,
           last_status_code = r.status_code,
           delivered_at = CASE WHEN r.status = 'delivered' THEN now() END,
           finished_at = CASE WHEN r.status <> 'pending' THEN now() END,
           locked_by = NULL, locked_until = NULL, claim_token = NULL,
           -- The first traced attempt's span roots the delivery's trace (0022).
           trace_context = CASE WHEN r.traceparent IS NULL THEN w.trace_context
                                ELSE coalesce(w.trace_context, '{}') || jsonb_build_object('traceparent', r.traceparent)
                           END
      FROM results r
     -- The ids again as an array: planned with it, the update reads only the
     -- partitions of those ids (the join alone cannot prune them).
     WHERE w.id = r.id AND w.claim_token = r.token AND w.status = 'pending' AND w.id = ANY (%(ids)s::bigint[])
    RETURNING w.id
), slots_kept AS (
    UPDATE endpoint_leases l SET leased = s.keep FROM slots s
     WHERE l.endpoint_id = s.endpoint_id AND l.claim_token = s.token AND s.keep > 0
), slots_returned AS (
    DELETE FROM endpoint_leases l USING slots s
     WHERE l.endpoint_id = s.endpoint_id AND l.claim_token = s.token AND s.keep <= 0
), slots_held AS (
    INSERT INTO endpoint_leases AS l (endpoint_id, claim_token, owner, leased, until)
    SELECT endpoint_id, -token, 'held after a timeout', held, now() + make_interval(secs => hold)
      FROM slots WHERE held > 0 AND hold > 0
    ON CONFLICT (endpoint_id, claim_token) DO UPDATE
       SET leased = greatest(l.leased, excluded.leased), until = greatest(l.until, excluded.until)
), history AS (
    INSERT INTO webhook_delivery_attempts
           (delivery_id, endpoint_id, attempt, started_at, duration_ms, result, status_code, error,
            response_excerpt, claim_token, trace_id)
    SELECT r.id, r.endpoint_id, r.attempt, now() - make_interval(secs => r.started_ago), r.duration_ms,
           r.result, r.status_code, r.error, r.excerpt, r.token, r.trace_id
      FROM results r JOIN updated u ON u.id = r.id
)
SELECT id FROM updated;

-- name: engine_breaker_ensure
INSERT INTO endpoint_state (endpoint_id)
SELECT unnest(%(endpoint_ids)s::bigint[])
ON CONFLICT (endpoint_id) DO NOTHING;

-- name: engine_breaker_lock
-- Locked in id order so that concurrent flushes never deadlock.
SELECT endpoint_id, state, consecutive_failures, extract(epoch FROM open_until)::float8 AS open_until,
       extract(epoch FROM now())::float8 AS db_now
  FROM endpoint_state
 WHERE endpoint_id = ANY (%(endpoint_ids)s::bigint[])
 ORDER BY endpoint_id
   FOR UPDATE;

-- name: engine_breaker_write
-- opened_at is when the current open window began (breaker.BreakerWrite.opens_window:
-- it opened, or reopened after a failed probe or a failure once the window had
-- lapsed); the upkeep sweep's last-chance rule reads it (engine_sweep_expired).
UPDATE endpoint_state s
   SET state = v.state,
       consecutive_failures = v.failures,
       open_until = to_timestamp(v.open_until),
       opened_at = CASE WHEN v.opened THEN now() ELSE s.opened_at END,
       -- a new open episode (breaker notices are keyed by it: dispatcher/engine/notifier.py)
       open_episode = CASE WHEN v.state = 'open' AND s.state = 'closed' THEN s.open_episode + 1
                           ELSE s.open_episode END,
       last_success_at = CASE WHEN v.succeeded THEN now() ELSE s.last_success_at END,
       last_failure_at = CASE WHEN v.failed THEN now() ELSE s.last_failure_at END,
       last_error = CASE WHEN v.failed THEN v.error ELSE s.last_error END,
       updated_at = now()
  FROM unnest(%(endpoint_ids)s::bigint[], %(states)s::text[], %(failures)s::int[], %(open_until)s::float8[],
              %(opened)s::bool[], %(succeeded)s::bool[], %(failed)s::bool[], %(errors)s::text[])
       AS v(endpoint_id, state, failures, open_until, opened, succeeded, failed, error)
 WHERE s.endpoint_id = v.endpoint_id;

-- name: engine_breaker_touch
-- The common case of a flush, in one statement and one round trip: endpoints
-- that had a success in the batch.  A success closes the breaker whatever it
-- was, so the new state (computed by the pure policy from the batch alone)
-- does not depend on the old one; when the old state was `closed` there is no
-- transition to announce either, so no lock and no read are needed first.
-- The guard `state = 'closed'` makes that so; the rows it does not match
-- (missing, open, half_open) go through ensure / lock / write as before.
-- The SET list is engine_breaker_write's for a closed -> closed change.
UPDATE endpoint_state s
   SET consecutive_failures = v.failures,
       open_until = NULL,
       last_success_at = now(),
       last_failure_at = CASE WHEN v.failed THEN now() ELSE s.last_failure_at END,
       last_error = CASE WHEN v.failed THEN v.error ELSE s.last_error END,
       updated_at = now()
  FROM unnest(%(endpoint_ids)s::bigint[], %(failures)s::int[], %(failed)s::bool[], %(errors)s::text[])
       AS v(endpoint_id, failures, failed, error)
 WHERE s.endpoint_id = v.endpoint_id AND s.state = 'closed'
RETURNING s.endpoint_id;

-- name: engine_release
-- Hand unsent claimed rows back at once (graceful shutdown, a breaker that
-- opened), fenced.  Their lane's slots go back with the next engine_record.
UPDATE webhook_deliveries w
   SET locked_by = NULL, locked_until = NULL, claim_token = NULL
  FROM unnest(%(ids)s::bigint[], %(tokens)s::bigint[]) AS r(id, token)
 WHERE w.id = r.id AND w.claim_token = r.token AND w.status = 'pending' AND w.id = ANY (%(ids)s::bigint[])
RETURNING w.id;

-- name: engine_release_owner
-- The supervisor hands back every row a dead worker had claimed, their lane
-- slots, and its upkeep lease, so another process takes the region over at its next round
-- instead of when the lease lapses.  The owner is retired first, once a claim
-- of it still in flight has committed: a later one takes nothing (0029).
SELECT dispatcher_release_owner(%(owner)s) AS released;

-- name: engine_hold_leadership
-- The region's upkeep leader holds a lease row, renewed every upkeep round;
-- another process takes it only once it has lapsed (or the supervisor
-- deleted it with the dead owner's claims: engine_release_owner).  Returns a
-- row only to the holder.  Works through a transaction pooler, unlike a
-- session advisory lock.
INSERT INTO region_leader AS l (region, owner, until)
VALUES (%(region)s, %(owner)s, now() + make_interval(secs => %(lease)s))
ON CONFLICT (region) DO UPDATE SET owner = EXCLUDED.owner, until = EXCLUDED.until
 WHERE l.until < now() OR l.owner = EXCLUDED.owner
RETURNING l.owner;

-- name: engine_backlog
-- The figures of the backlog rule (dispatcher/rules/health.py BacklogRule), read by
-- both the upkeep leader's alert and `dispatcher check`, so the two agree.
-- Only endpoints whose breaker is closed count toward the backlog: rows behind
-- an open or half-open breaker wait by design (a customer's maintenance
-- window) and are reported apart, as held_rows.  Bounded: the count stops at
-- threshold + 1, and the oldest due row comes from the pending index.
-- A leased row keeps its due time (0013): in flight is not overdue.
SELECT (SELECT count(*) FROM (
            SELECT 1 FROM webhook_deliveries d
             WHERE d.status = 'pending' AND d.next_attempt_at <= now() - make_interval(secs => %(row_age)s)
               AND dispatcher_unleased(d.locked_until)
               AND NOT EXISTS (SELECT 1 FROM endpoint_state s
                                WHERE s.endpoint_id = d.endpoint_id AND s.state <> 'closed')
             LIMIT %(threshold)s + 1) old) AS overdue_rows,
       (SELECT extract(epoch FROM now() - d.next_attempt_at)::float8
          FROM webhook_deliveries d
         WHERE d.status = 'pending' AND d.next_attempt_at <= now()
           AND dispatcher_unleased(d.locked_until)
           AND NOT EXISTS (SELECT 1 FROM endpoint_state s
                            WHERE s.endpoint_id = d.endpoint_id AND s.state <> 'closed')
         ORDER BY d.next_attempt_at
         LIMIT 1) AS oldest_age,
       (SELECT count(*) FROM endpoint_state s
          JOIN webhook_deliveries d ON d.endpoint_id = s.endpoint_id
                                   AND d.status = 'pending' AND d.next_attempt_at <= now()
                                   AND dispatcher_unleased(d.locked_until)
         WHERE s.state <> 'closed') AS held_rows,
       (SELECT count(*) FROM endpoint_state WHERE state <> 'closed') AS open_breakers;

-- name: engine_claim_window
-- The claim's window of ids (docs/claim.md, "The claim's window").
SELECT floor, ceiling FROM dispatcher_claim_window();

-- name: engine_wake_mark
-- What an idle worker reads between claims (rules/wake.py; docs/claim.md,
-- "Waking for new rows"): how many ids the outbox's sequence has handed out
-- (every new row takes one), and the transactions in progress, whose rows a
-- claim cannot see yet.  It reads no table and plans in microseconds, unlike a
-- claim.  Not the snapshot's xip: a transaction whose id is past every
-- completed one's is in progress without being listed there.
SELECT (SELECT last_value - (NOT is_called)::int FROM webhook_deliveries_id_seq) AS last_id,
       ARRAY(SELECT backend_xid::text::bigint FROM pg_stat_activity
              WHERE backend_xid IS NOT NULL) AS in_progress;

-- name: engine_record_backlog
-- The round's backlog figures, kept for the rollout gates (migration 0016),
-- and the backlog alert's episode: opened by the first round that fires it,
-- closed by the first round that finds it clear, whichever process holds the
-- lease then (alert_episodes_open admits one open episode).
WITH sample AS (
    INSERT INTO backlog_samples (oldest_age, overdue_rows, held_rows, alerting)
    VALUES (%(oldest_age)s, %(overdue_rows)s, %(held_rows)s, %(alerting)s)
), opened AS (
    INSERT INTO alert_episodes (alert, detail)
    SELECT 'backlog', %(detail)s WHERE %(alerting)s
    ON CONFLICT (alert) WHERE cleared_at IS NULL DO NOTHING
    RETURNING id
), cleared AS (
    UPDATE alert_episodes SET cleared_at = now()
     WHERE alert = 'backlog' AND cleared_at IS NULL AND NOT %(alerting)s
    RETURNING id
)
SELECT (SELECT count(*) FROM opened) AS opened, (SELECT count(*) FROM cleared) AS cleared;

-- name: engine_prune_gate_evidence
-- Samples, and alert episodes that cleared, longer ago than the gates read (a
-- round adds one sample, so each run deletes about as many).  An open
-- episode stays however old it is.
DELETE FROM backlog_samples WHERE taken_at < now() - make_interval(secs => %(older_than)s);
DELETE FROM alert_episodes WHERE cleared_at < now() - make_interval(secs => %(older_than)s);

-- name: engine_open_breakers
-- Breakers to publish as webhook_breaker_open: every open or half-open one
-- (1), and those that opened within the last day but are closed again (0), so
-- a gauge set to 1 is set back to 0 even by a leader that never saw it open.
SELECT endpoint_id, state FROM endpoint_state
 WHERE state <> 'closed' OR opened_at > now() - interval '1 day'
 ORDER BY endpoint_id;

-- name: engine_sweep_expired
-- The last chance at the retry ceiling (docs/decisions.md, "Last chance"), the SQL
-- twin of breaker.last_chance_spent, held to the same cases by
-- tests/integration/test_last_chance_rule.py: a pending row past its ceiling
-- (created_at + its event type's retry.ceiling; %(ceilings)s maps the types
-- that have their own, a missing event takes the default) ends dead without an
-- attempt of its own only behind an open breaker whose window opened at or
-- after that ceiling -- the endpoint failed an attempt the breaker admitted
-- once the row's window had ended.  Rows behind a closed breaker are the
-- claim's, behind a half-open one the probe's, behind a window opened earlier
-- the next probe's (at most breaker.open_for away).  A leased row is its
-- worker's.  min_ceiling (the shortest ceiling of any type) drops rows that
-- cannot qualify before their event is looked up.  Batched, like pruning; the
-- caller repeats until a batch comes back short.
WITH doomed AS (
    SELECT d.id
      FROM endpoint_state s
      JOIN webhook_deliveries d ON d.endpoint_id = s.endpoint_id AND d.status = 'pending'
      LEFT JOIN events ev ON ev.workspace_id = d.workspace_id AND ev.id = d.event_id AND ev.day = d.event_day
     WHERE s.state = 'open'
       AND d.created_at <= s.opened_at - make_interval(secs => %(min_ceiling)s)
       -- time held while paused does not count toward the ceiling (migration 0020)
       AND d.created_at + make_interval(secs => coalesce((%(ceilings)s::jsonb ->> ev.type)::float8, %(ceiling)s)
                                                + d.held_seconds)
           <= s.opened_at
       AND dispatcher_unleased(d.locked_until)
     LIMIT %(limit)s
       FOR UPDATE OF d SKIP LOCKED
)
UPDATE webhook_deliveries w
   SET status = 'dead', finished_at = now(), locked_by = NULL, locked_until = NULL, claim_token = NULL,
       last_error = coalesce(last_error || '; ', '') || %(reason)s
  FROM doomed
 WHERE w.id = doomed.id
RETURNING w.id;

-- name: engine_prune_leases
-- Lane entries whose lease lapsed count for nothing (dispatcher_lane_free);
-- the upkeep leader deletes them so the ledger stays as small as what is in flight.
-- A retired owner's name fences claims that come after its release (0029):
-- a day outlives any statement of a dead process.
WITH retired AS (
    DELETE FROM retired_owners WHERE retired_at < now() - interval '1 day'
)
DELETE FROM endpoint_leases WHERE until < now();

-- name: engine_prune_deliveries
-- Retention of the rows the DEFAULT partition caught (a day without a
-- partition of its own: the upkeep leader was down, or could not create it);
-- day partitions go whole (dispatcher_drop_partition), so at steady state
-- this finds nothing.  Batched, so one run never holds many row locks or
-- writes a burst of WAL; the caller repeats until a batch comes back short.
-- Both statements run as one implicit transaction (one query string), so SET
-- LOCAL holds for the DELETE only: with stale statistics the planner
-- otherwise bets on a LIMITed sequential scan, which reads the whole table
-- when nothing is due for pruning; the BRIN index reads only the old block
-- ranges.
SET LOCAL enable_seqscan = off;
WITH doomed AS (
    SELECT id FROM webhook_deliveries_default
     WHERE status = ANY (%(statuses)s::text[])
       AND created_at < now() - make_interval(secs => %(older_than)s)
     LIMIT %(batch)s
)
DELETE FROM webhook_deliveries_default d USING doomed WHERE d.id = doomed.id;

-- name: engine_prune_attempts
SET LOCAL enable_seqscan = off;
WITH doomed AS (
    SELECT id FROM webhook_delivery_attempts_default
     WHERE started_at < now() - make_interval(secs => %(older_than)s)
     LIMIT %(batch)s
)
DELETE FROM webhook_delivery_attempts_default a USING doomed WHERE a.id = doomed.id;

-- name: engine_prune_events
-- Events the DEFAULT partition caught, past retention.events and no longer
-- referred to by any delivery row (webhook_deliveries_event, per partition).
WITH doomed AS (
    SELECT e.workspace_id, e.id, e.day FROM events_default e
     WHERE e.created_at < now() - make_interval(secs => %(older_than)s)
       AND NOT EXISTS (SELECT 1 FROM webhook_deliveries d
                        WHERE d.event_id = e.id AND d.workspace_id = e.workspace_id AND d.event_day = e.day)
     LIMIT %(batch)s
)
DELETE FROM events_default e USING doomed
 WHERE e.workspace_id = doomed.workspace_id AND e.id = doomed.id AND e.day = doomed.day;

-- name: engine_hold_stragglers
-- Rows written `pending` for an endpoint after its pause, by a producer
-- transaction that began before the pause committed, are held like the rest
-- (the claim gives a paused endpoint no room meanwhile).  Paused endpoints
-- only, through webhook_endpoints_paused and webhook_deliveries_due; leased
-- rows are their worker's (its result is written held: engine_record).
UPDATE webhook_deliveries d
   SET status = 'held'
  FROM webhook_endpoints e
 WHERE e.paused_at IS NOT NULL AND d.endpoint_id = e.id AND d.status = 'pending'
   AND dispatcher_unleased(d.locked_until)
RETURNING d.id;

-- name: engine_expire_held
-- A held row keeps its place for endpoints.hold_for (%(hold_for)s seconds),
-- counted from when it was held: the pause, or its creation if later.  Then
-- it is dead with that reason (the owner was told beforehand: the lifecycle's
-- 'expiring' notice).  Batched; the caller repeats until a batch comes back short.
WITH doomed AS (
    SELECT d.id
      FROM webhook_endpoints e
      JOIN webhook_deliveries d ON d.endpoint_id = e.id AND d.status = 'held'
     WHERE e.paused_at IS NOT NULL AND e.paused_at <= now() - make_interval(secs => %(hold_for)s)
       AND d.created_at <= now() - make_interval(secs => %(hold_for)s)
     LIMIT %(limit)s
       FOR UPDATE OF d SKIP LOCKED
)
UPDATE webhook_deliveries w
   SET status = 'dead', finished_at = now(), locked_by = NULL, locked_until = NULL, claim_token = NULL,
       last_error = coalesce(last_error || '; ', '') || %(reason)s
  FROM doomed
 WHERE w.id = doomed.id
RETURNING w.id;

-- name: engine_held_figures
-- The held gauges: paused endpoints and their held rows (webhook_deliveries_held).
SELECT (SELECT count(*) FROM webhook_endpoints WHERE paused_at IS NOT NULL) AS paused_endpoints,
       (SELECT count(*) FROM webhook_deliveries WHERE status = 'held') AS held_rows;

-- name: engine_release_unpaused
-- Held rows whose endpoint is not paused (any more): deleted with its
-- workspace or by SQL, resumed by SQL, or resumed while a producer that read
-- it paused had not committed yet.  They become pending again, so the claim
-- sends them (or ends them: endpoint deleted).  The endpoints with held rows
-- are walked as the claim walks pending ones (a loose index scan over
-- webhook_deliveries_held): a round reads one index entry per such endpoint,
-- however many rows they hold.
WITH RECURSIVE holding(endpoint_id) AS (
    (SELECT endpoint_id FROM webhook_deliveries WHERE status = 'held' ORDER BY endpoint_id LIMIT 1)
    UNION ALL
    SELECT (SELECT d.endpoint_id FROM webhook_deliveries d
             WHERE d.status = 'held' AND d.endpoint_id > h.endpoint_id ORDER BY d.endpoint_id LIMIT 1)
      FROM holding h WHERE h.endpoint_id IS NOT NULL
), unpaused AS (
    SELECT h.endpoint_id FROM holding h
     WHERE h.endpoint_id IS NOT NULL
       AND NOT EXISTS (SELECT 1 FROM webhook_endpoints e WHERE e.id = h.endpoint_id AND e.paused_at IS NOT NULL)
)
UPDATE webhook_deliveries d
   SET status = 'pending'
  FROM unpaused u
 WHERE d.endpoint_id = u.endpoint_id AND d.status = 'held'
RETURNING d.id;
