-- 0025: the outbox partitioned by day, step 1 of 3 (issue 25; docs/operations.md,
-- "Partitioning the outbox").  Nothing here scans or rewrites a table:
--
--  * ids that encode their day: dispatcher_first_id(day) is the first id of a
--    day, (day - 2020-01-01) << 38, so a day holds 2^38 ids and an id's day is
--    id >> 38 (dispatcher_day_of_id).  Rows written so far are plain sequence
--    values, below 2^38: "day 0".  dispatcher/rules/partitions.py holds the
--    Python twins; tests/integration/test_partitions.py holds them to the same cases.
--  * events.day and webhook_deliveries.event_day: the UTC day an event was
--    written, and the day of the event a delivery row sends, so the claim's
--    lookup of the event reads one events partition.  A constant default
--    ('2000-01-01': the legacy partition's day) is a catalog change only, no
--    rewrite; 0027 switches both defaults to dispatcher_today().
--  * CHECK constraints NOT VALID that state each legacy table's future
--    partition bound; 0026 validates them (a scan under SHARE UPDATE
--    EXCLUSIVE: producers and workers go on), so that 0027 can attach the
--    table as a partition without scanning it under its lock.
--  * partitioning: when each legacy table stopped taking rows (0027 writes
--    it): its rows' days are not in its partition key, so retention of the
--    *_before partitions reads it.
--
-- Every ALTER TABLE below takes ACCESS EXCLUSIVE for a moment.  Waiting for it
-- behind a long transaction would queue producers and workers behind this
-- migration, so it gives up after lock_timeout instead: nothing of it is then
-- applied, and `dispatcher migrate` is run again.
SET LOCAL lock_timeout = '2s';

CREATE FUNCTION dispatcher_today() RETURNS date
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT (now() AT TIME ZONE 'UTC')::date
$$;

CREATE FUNCTION dispatcher_first_id(day date) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE STRICT AS $$
    SELECT (day - DATE '2020-01-01')::bigint << 38
$$;

CREATE FUNCTION dispatcher_day_of_id(id bigint) RETURNS date
LANGUAGE sql IMMUTABLE PARALLEL SAFE STRICT AS $$
    SELECT DATE '2020-01-01' + (id >> 38)::int
$$;

-- A new id of today: the day's first id plus the table's sequence, masked to
-- 38 bits.  Unique while a day takes fewer than 2^38 (275 billion) rows.
CREATE FUNCTION dispatcher_next_id(seq regclass) RETURNS bigint
LANGUAGE sql VOLATILE AS $$
    SELECT dispatcher_first_id(dispatcher_today()) + (nextval(seq) & 274877906943)
$$;

-- The name of a table's partition for one day: events_p20260131.
CREATE FUNCTION dispatcher_partition_name(parent text, day date) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE STRICT AS $$
    SELECT parent || '_p' || to_char(day, 'YYYYMMDD')
$$;

ALTER TABLE events ADD COLUMN day date NOT NULL DEFAULT '2000-01-01',
    ADD CONSTRAINT events_before_bound CHECK (day < DATE '2000-01-02') NOT VALID;
ALTER TABLE webhook_deliveries ADD COLUMN event_day date NOT NULL DEFAULT '2000-01-01',
    ADD CONSTRAINT webhook_deliveries_before_bound CHECK (id < 274877906944) NOT VALID;
ALTER TABLE webhook_delivery_attempts
    ADD CONSTRAINT webhook_delivery_attempts_before_bound CHECK (id < 274877906944) NOT VALID;

CREATE TABLE partitioning (
    table_name   text PRIMARY KEY,
    legacy_until timestamptz
);

-- The producer's function (0022), statement for statement, but for its
-- conflict clauses: ON CONFLICT DO NOTHING names no key.  A send that is
-- waiting for 0027's locks when 0027 commits resumes with the body it
-- started with, and its INSERT INTO events is planned again against the
-- partitioned table, whose key is (workspace_id, id, day): a clause naming
-- (workspace_id, id) would fail there, and the producer's transaction with
-- it (tests/e2e/test_partition_migration.py, tests/integration/
-- test_partition_swap_online.py).  Without a named key it holds for both
-- shapes; such a send writes today's day and event_day by the new defaults.
-- Its only other unique key, (workspace_id, sequence), cannot conflict: the
-- sequence is event_sequence's.  0027 replaces the function again.
CREATE OR REPLACE FUNCTION dispatcher_send_event(
    p_workspace_id text, p_event_id text, p_type text, p_occurred_at timestamptz,
    p_payload jsonb, p_payload_hash text, p_shadow_writes boolean, p_grace float8,
    p_trace_context jsonb DEFAULT NULL)
RETURNS TABLE (mode text, sequence bigint, deliveries int, legacy_targets jsonb, legacy_payload text,
               skipped text)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    outbox boolean;
    numbered bigint;
    targets jsonb;
    written int := 0;
    shadow boolean := false;
    why text;
BEGIN
    -- A scalar subquery for the one-row settings table: joined, its
    -- unanalysed row estimate (~2000) pushed the cost past JIT's threshold.
    SELECT webhook_outbox_on(w.flags -> 'webhook_outbox', r.list,
                             (SELECT s.percent FROM rollout_settings s), rollout_bucket(w.id))
      INTO outbox
      FROM workspaces w
      LEFT JOIN rollout_workspaces r ON r.workspace_id = w.id
     WHERE w.id = p_workspace_id;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF outbox THEN
        numbered := nextval('event_sequence');
        INSERT INTO events (id, workspace_id, type, sequence, occurred_at, payload, trace_context)
        VALUES (p_event_id, p_workspace_id, p_type, numbered, coalesce(p_occurred_at, now()), p_payload,
                p_trace_context)
        ON CONFLICT DO NOTHING;
        IF NOT FOUND THEN
            RETURN QUERY SELECT 'duplicate'::text, NULL::bigint, 0, NULL::jsonb, NULL::text, NULL::text;
            RETURN;
        END IF;
        -- The hot path: one INSERT ... SELECT, nothing returned but the count.
        -- A paused endpoint's row is written held (0020).
        INSERT INTO webhook_deliveries (workspace_id, endpoint_id, event_id, payload_hash, mode, status)
        SELECT p_workspace_id, e.id, p_event_id, p_payload_hash, 'live',
               CASE WHEN e.paused_at IS NULL THEN 'pending' ELSE 'held' END
          FROM webhook_endpoints e
         WHERE e.workspace_id = p_workspace_id AND e.active AND e.purpose = 'customer'
           AND (e.event_types = '{}' OR p_type = ANY (e.event_types));
        GET DIAGNOSTICS written = ROW_COUNT;
        RETURN QUERY SELECT 'live'::text, numbered, written, NULL::jsonb, NULL::text, NULL::text;
        RETURN;
    END IF;
    -- Outbox off: whatever happens below, the caller gets its targets and POSTs.
    IF current_setting('transaction_read_only') = 'on' THEN
        why := 'read_only';
    ELSE
        numbered := nextval('event_sequence');
        IF p_shadow_writes THEN
            INSERT INTO events (id, workspace_id, type, sequence, occurred_at, payload, trace_context)
            VALUES (p_event_id, p_workspace_id, p_type, numbered, coalesce(p_occurred_at, now()), p_payload,
                    p_trace_context)
            ON CONFLICT DO NOTHING;
            shadow := FOUND;
            IF NOT shadow THEN
                why := 'duplicate_id';
            END IF;
        END IF;
    END IF;
    SELECT coalesce(jsonb_agg(jsonb_build_object(
               'id', e.id, 'url', e.url,
               'secrets', dispatcher_signing_secrets(e.secret, e.previous_secret, e.secret_rotated_at,
                                                     w.secret, w.previous_secret, w.secret_rotated_at, p_grace))
               ORDER BY e.id), '[]')
      INTO targets
      FROM webhook_endpoints e JOIN workspaces w ON w.id = e.workspace_id
     WHERE e.workspace_id = p_workspace_id AND e.active AND e.purpose = 'customer'
       AND (e.event_types = '{}' OR p_type = ANY (e.event_types));
    IF shadow THEN
        INSERT INTO webhook_deliveries (workspace_id, endpoint_id, event_id, payload_hash, mode)
        SELECT p_workspace_id, (t ->> 'id')::bigint, p_event_id, p_payload_hash, 'shadow'
          FROM jsonb_array_elements(targets) AS t;
        GET DIAGNOSTICS written = ROW_COUNT;
    END IF;
    -- jsonb's own text form, so the synchronous body is byte-identical to
    -- what the dispatcher sends for the same event (it reads payload::text).
    RETURN QUERY SELECT CASE WHEN shadow THEN 'shadow' END, numbered, written, targets, p_payload::text, why;
END;
$$;
