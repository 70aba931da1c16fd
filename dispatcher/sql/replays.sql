-- Bulk replay by filter (issue 24, section 3; migration 0021).  Every query
-- selects through dispatcher_replay_candidates, the one definition of which
-- rows a filter re-queues.

-- name: replay_max_id
-- The newest row of the workspace: a count and the job made from it see the same rows.
SELECT coalesce(max(id), 0) AS max_id FROM webhook_deliveries WHERE workspace_id = %(workspace_id)s;

-- name: replay_count
-- Counted up to `cap` (one more row than the hourly budget can ever pay
-- for): a filter matching millions of rows costs no more than one that the
-- budget refuses anyway.
SELECT count(*) AS total
  FROM (SELECT 1 FROM dispatcher_replay_candidates(%(workspace_id)s, %(since)s, %(until)s, %(types)s::text[],
                                                   %(endpoints)s::bigint[], %(statuses)s::text[], 0, %(max_id)s)
         LIMIT %(cap)s) c;

-- name: replay_sample
SELECT c.id, c.endpoint_id, c.event_id, c.event_type, c.status, c.created_at
  FROM dispatcher_replay_candidates(%(workspace_id)s, %(since)s, %(until)s, %(types)s::text[],
                                    %(endpoints)s::bigint[], %(statuses)s::text[], 0, %(max_id)s) c
 ORDER BY c.id
 LIMIT %(limit)s;

-- name: replay_unknown_endpoints
-- The filter's endpoint ids that are not customer endpoints of the workspace.
SELECT x.id FROM unnest(%(endpoints)s::bigint[]) AS x(id)
 WHERE NOT EXISTS (SELECT 1 FROM webhook_endpoints e
                    WHERE e.id = x.id AND e.workspace_id = %(workspace_id)s AND e.purpose = 'customer')
 ORDER BY x.id;

-- name: replay_job_find
-- A job by its request key: a retried request finds the job it made.
SELECT * FROM replay_jobs WHERE workspace_id = %(workspace_id)s AND request_key = %(request_key)s;

-- name: replay_job_insert
-- A job with nothing to queue is done at once.
INSERT INTO replay_jobs (workspace_id, request_key, fingerprint, token_id, since, until, event_types,
                         endpoint_ids, statuses, state, total, replay_units, max_id, finished_at)
VALUES (%(workspace_id)s, %(request_key)s, %(fingerprint)s, %(token_id)s, %(since)s, %(until)s,
        %(types)s::text[], %(endpoints)s::bigint[], %(statuses)s::text[],
        CASE WHEN %(total)s = 0 THEN 'done' ELSE 'running' END, %(total)s, %(units)s, %(max_id)s,
        CASE WHEN %(total)s = 0 THEN now() END)
RETURNING *;

-- name: replay_job_get
SELECT * FROM replay_jobs WHERE id = %(id)s AND workspace_id = %(workspace_id)s;

-- name: replay_job_next
-- The oldest running job: jobs run one at a time, in the order they were made.
SELECT id FROM replay_jobs WHERE state = 'running' ORDER BY id LIMIT 1;

-- name: replay_job_lock
-- The job a batch works on, locked until the batch commits: a second process
-- running the same batch (a lapsed leader lease) waits, then reads the
-- cursor the first one committed.
SELECT id, workspace_id, after_id FROM replay_jobs WHERE id = %(id)s AND state = 'running' FOR UPDATE;

-- name: replay_job_batch
-- Up to `limit` candidates after the cursor, each queued as a new replay row
-- (the engine sends the same event, so the same Idempotency-Key, signed anew).
-- To a paused endpoint it is held, sent after the resume, as api_insert_replay.
INSERT INTO webhook_deliveries (workspace_id, endpoint_id, event_id, payload_hash,
                                attempt, status, mode, next_attempt_at, replay_of, event_day)
SELECT j.workspace_id, c.endpoint_id, c.event_id, c.payload_hash, 0,
       CASE WHEN (SELECT e.paused_at FROM webhook_endpoints e WHERE e.id = c.endpoint_id) IS NULL
            THEN 'pending' ELSE 'held' END,
       'live', now(), c.id, c.event_day
  FROM replay_jobs j
 CROSS JOIN LATERAL dispatcher_replay_candidates(j.workspace_id, j.since, j.until, j.event_types,
                                                 j.endpoint_ids, j.statuses, j.after_id, j.max_id) c
 WHERE j.id = %(id)s
 ORDER BY c.id
 LIMIT %(limit)s
RETURNING id, replay_of;

-- name: replay_job_advance
-- In the batch's transaction: the cursor moves with the rows it queued.  A
-- short batch means no candidate is left: the job is done.
UPDATE replay_jobs
   SET after_id = CASE WHEN %(done)s THEN max_id ELSE %(after_id)s END,
       queued = queued + %(queued)s,
       state = CASE WHEN %(done)s THEN 'done' ELSE state END,
       finished_at = CASE WHEN %(done)s THEN now() END,
       updated_at = now()
 WHERE id = %(id)s
RETURNING state, queued, total;

-- name: replay_prune_jobs
-- Finished jobs kept as long as dead rows are (retention.dead): a retried
-- request older than that makes a new job, which finds every pair its
-- predecessor queued already replayed.  A running job stays however old.
DELETE FROM replay_jobs WHERE state = 'done' AND finished_at < now() - make_interval(secs => %(older_than)s);
