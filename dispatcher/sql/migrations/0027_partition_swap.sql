-- 0027: the outbox partitioned by day, step 3 of 3 (issue 25; docs/operations.md,
-- "Partitioning the outbox").  One short transaction, no scan and no index
-- build (0026 did those):
--
--  * each legacy table, its indexes and keys are renamed to *_before names;
--  * a partitioned table takes its canonical name, with the same columns,
--    defaults, checks, keys and indexes under their canonical names:
--    webhook_deliveries and webhook_delivery_attempts by RANGE (id), ids
--    that encode their day (0025); events by RANGE (day), its keys carrying
--    the day (ids are unique per workspace and day; dispatcher_send_event
--    also looks in yesterday's partition: docs/producer.md, "Deduplication");
--  * the legacy table is attached as the *_before partition: its validated
--    bound (0025, 0026) spares the scan, and every index it has is attached
--    to the parent's, none built;
--  * the id sequences are owned by the new tables' columns (dropping a
--    *_before partition never drops a sequence), and new ids, events.day and
--    webhook_deliveries.event_day default to today's;
--  * DEFAULT partitions catch a row whose day has no partition (the upkeep
--    down for a week): a producer's insert never fails for want of one;
--  * today's partitions and the next 7 days' (dispatcher_ensure_partitions,
--    which the upkeep leader calls every round from now on);
--  * the producer's function (0022's, statement for statement) writes the day.
--
-- ACCESS EXCLUSIVE on the three tables until the commit, taken first, all
-- at once.  Waiting for it behind a long transaction would queue every
-- producer and worker behind this migration, so it gives up after
-- lock_timeout: nothing of it is then applied, and `dispatcher migrate` is run again.
-- In the producer's order (dispatcher_send_event writes events, then
-- webhook_deliveries): a send holding events waits for nothing of ours and
-- commits, then we go on; taken the other way round, it waited for
-- webhook_deliveries while we waited for events, a deadlock that failed it.
SET LOCAL lock_timeout = '2s';
LOCK TABLE events, webhook_deliveries, webhook_delivery_attempts IN ACCESS EXCLUSIVE MODE;

-- webhook_deliveries -------------------------------------------------------

-- The legacy table's index names are the ones Postgres gives a partition's
-- indexes (as on every day partition), in the parent's index order below.
ALTER TABLE webhook_deliveries RENAME TO webhook_deliveries_before;
ALTER INDEX webhook_deliveries_pkey RENAME TO webhook_deliveries_before_pkey;
ALTER INDEX webhook_deliveries_due RENAME TO webhook_deliveries_before_endpoint_id_next_attempt_at_idx;
ALTER INDEX webhook_deliveries_pending_age RENAME TO webhook_deliveries_before_next_attempt_at_idx;
ALTER INDEX webhook_deliveries_event RENAME TO webhook_deliveries_before_event_id_idx;
ALTER INDEX webhook_deliveries_workspace RENAME TO webhook_deliveries_before_workspace_id_id_idx;
ALTER INDEX webhook_deliveries_endpoint RENAME TO webhook_deliveries_before_endpoint_id_id_idx;
ALTER INDEX webhook_deliveries_endpoint_failed RENAME TO webhook_deliveries_before_endpoint_id_created_at_idx;
ALTER INDEX webhook_deliveries_created_brin RENAME TO webhook_deliveries_before_created_at_idx;
ALTER INDEX webhook_deliveries_held RENAME TO webhook_deliveries_before_endpoint_id_created_at_idx1;

-- fillfactor = 50 is set on each partition (a partitioned table has no
-- storage): the lease columns' updates stay HOT (docs/claim.md).
CREATE TABLE webhook_deliveries (
    id               bigint NOT NULL DEFAULT dispatcher_next_id('webhook_deliveries_id_seq'),
    workspace_id     text NOT NULL,
    endpoint_id      bigint NOT NULL,
    event_id         text NOT NULL,
    payload_hash     text NOT NULL,
    attempt          integer NOT NULL DEFAULT 0,
    status           text NOT NULL DEFAULT 'pending',
    mode             text NOT NULL DEFAULT 'live',
    next_attempt_at  timestamptz NOT NULL DEFAULT now(),
    last_error       text,
    last_status_code integer,
    created_at       timestamptz NOT NULL DEFAULT now(),
    delivered_at     timestamptz,
    finished_at      timestamptz,
    replay_of        bigint,
    locked_by        text,
    locked_until     timestamptz,
    claim_token      bigint,
    held_seconds     double precision NOT NULL DEFAULT 0,
    trace_context    jsonb,
    event_day        date NOT NULL DEFAULT dispatcher_today(),
    CONSTRAINT webhook_deliveries_pkey PRIMARY KEY (id),
    CONSTRAINT webhook_deliveries_mode_check CHECK (mode IN ('live', 'shadow')),
    CONSTRAINT webhook_deliveries_shadow_status
        CHECK (status NOT IN ('delivered', 'shadow') OR (status = 'shadow') = (mode = 'shadow')),
    CONSTRAINT webhook_deliveries_status_check
        CHECK (status IN ('pending', 'held', 'delivered', 'failed', 'dead', 'shadow'))
) PARTITION BY RANGE (id);
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (endpoint_id, next_attempt_at) WHERE status = 'pending';
CREATE INDEX webhook_deliveries_pending_age ON webhook_deliveries (next_attempt_at) WHERE status = 'pending';
CREATE INDEX webhook_deliveries_event ON webhook_deliveries (event_id);
CREATE INDEX webhook_deliveries_workspace ON webhook_deliveries (workspace_id, id);
CREATE INDEX webhook_deliveries_endpoint ON webhook_deliveries (endpoint_id, id);
CREATE INDEX webhook_deliveries_endpoint_failed ON webhook_deliveries (endpoint_id, created_at)
    WHERE status IN ('dead', 'failed');
CREATE INDEX webhook_deliveries_created_brin ON webhook_deliveries USING brin (created_at);
CREATE INDEX webhook_deliveries_held ON webhook_deliveries (endpoint_id, created_at) WHERE status = 'held';
-- Which events partitions deliveries still refer to (retention of events).
CREATE INDEX webhook_deliveries_event_day_brin ON webhook_deliveries USING brin (event_day);

ALTER TABLE webhook_deliveries ATTACH PARTITION webhook_deliveries_before
    FOR VALUES FROM (MINVALUE) TO (274877906944);
ALTER TABLE webhook_deliveries_before DROP CONSTRAINT webhook_deliveries_before_bound;
ALTER SEQUENCE webhook_deliveries_id_seq OWNED BY webhook_deliveries.id;
ALTER TABLE webhook_deliveries_before
    ALTER COLUMN id SET DEFAULT dispatcher_next_id('webhook_deliveries_id_seq'),
    ALTER COLUMN event_day SET DEFAULT dispatcher_today();

-- webhook_delivery_attempts ------------------------------------------------

ALTER TABLE webhook_delivery_attempts RENAME TO webhook_delivery_attempts_before;
ALTER INDEX webhook_delivery_attempts_pkey RENAME TO webhook_delivery_attempts_before_pkey;
ALTER INDEX webhook_delivery_attempts_delivery RENAME TO webhook_delivery_attempts_before_delivery_id_attempt_idx;
ALTER INDEX webhook_delivery_attempts_started_brin RENAME TO webhook_delivery_attempts_before_started_at_idx;
ALTER INDEX webhook_delivery_attempts_endpoint RENAME TO webhook_delivery_attempts_before_endpoint_id_started_at_idx;

CREATE TABLE webhook_delivery_attempts (
    id               bigint NOT NULL DEFAULT dispatcher_next_id('webhook_delivery_attempts_id_seq'),
    delivery_id      bigint NOT NULL,
    endpoint_id      bigint NOT NULL,
    attempt          integer NOT NULL,
    started_at       timestamptz NOT NULL,
    duration_ms      integer NOT NULL,
    result           text NOT NULL,
    status_code      integer,
    error            text,
    response_excerpt text,
    claim_token      bigint,
    trace_id         text,
    CONSTRAINT webhook_delivery_attempts_pkey PRIMARY KEY (id)
) PARTITION BY RANGE (id);
CREATE INDEX webhook_delivery_attempts_delivery ON webhook_delivery_attempts (delivery_id, attempt);
CREATE INDEX webhook_delivery_attempts_started_brin ON webhook_delivery_attempts USING brin (started_at);
CREATE INDEX webhook_delivery_attempts_endpoint ON webhook_delivery_attempts (endpoint_id, started_at);

ALTER TABLE webhook_delivery_attempts ATTACH PARTITION webhook_delivery_attempts_before
    FOR VALUES FROM (MINVALUE) TO (274877906944);
ALTER TABLE webhook_delivery_attempts_before DROP CONSTRAINT webhook_delivery_attempts_before_bound;
ALTER SEQUENCE webhook_delivery_attempts_id_seq OWNED BY webhook_delivery_attempts.id;
ALTER TABLE webhook_delivery_attempts_before
    ALTER COLUMN id SET DEFAULT dispatcher_next_id('webhook_delivery_attempts_id_seq');

-- events --------------------------------------------------------------------

-- The keys 0026 built become the legacy table's; the old ones go.
ALTER TABLE events
    DROP CONSTRAINT events_pkey,
    ADD CONSTRAINT events_before_pkey PRIMARY KEY USING INDEX events_before_pkey,
    DROP CONSTRAINT events_workspace_id_sequence_key,
    ADD CONSTRAINT events_before_workspace_id_sequence_day_key
        UNIQUE USING INDEX events_before_workspace_id_sequence_day_key;
ALTER TABLE events RENAME TO events_before;

CREATE TABLE events (
    id            text NOT NULL,
    workspace_id  text NOT NULL,
    type          text NOT NULL,
    sequence      bigint NOT NULL,
    occurred_at   timestamptz NOT NULL DEFAULT now(),
    payload       jsonb NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    trace_context jsonb,
    day           date NOT NULL DEFAULT dispatcher_today(),
    CONSTRAINT events_pkey PRIMARY KEY (workspace_id, id, day),
    CONSTRAINT events_workspace_id_sequence_day_key UNIQUE (workspace_id, sequence, day)
) PARTITION BY RANGE (day);

ALTER TABLE events ATTACH PARTITION events_before FOR VALUES FROM (MINVALUE) TO ('2000-01-02');
ALTER TABLE events_before DROP CONSTRAINT events_before_bound;
ALTER TABLE events_before ALTER COLUMN day SET DEFAULT dispatcher_today();

-- When each legacy table stopped taking rows: its rows' newest day, for retention.
INSERT INTO partitioning (table_name, legacy_until)
VALUES ('webhook_deliveries', now()), ('webhook_delivery_attempts', now()), ('events', now())
ON CONFLICT (table_name) DO UPDATE SET legacy_until = EXCLUDED.legacy_until;

-- Partitions -----------------------------------------------------------------

-- Creates what is missing of: each table's DEFAULT partition, and its
-- partitions for today .. today + days_ahead (UTC days, by the database
-- clock); returns the names it created.  Each CREATE takes ACCESS EXCLUSIVE
-- on its table until the caller commits, and scans the DEFAULT partition
-- (normally empty) for rows the new one would hold: the caller sets a short
-- lock_timeout (the upkeep leader does: dispatcher/engine/upkeep.py).
CREATE FUNCTION dispatcher_ensure_partitions(days_ahead int) RETURNS SETOF text
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    parent text;
    day date;
    name text;
    options text;
BEGIN
    FOREACH parent IN ARRAY ARRAY['webhook_deliveries', 'webhook_delivery_attempts', 'events'] LOOP
        -- HOT updates of the lease columns depend on the room fillfactor leaves (docs/claim.md).
        options := CASE WHEN parent = 'webhook_deliveries' THEN ' WITH (fillfactor = 50)' ELSE '' END;
        IF to_regclass(parent || '_default') IS NULL THEN
            EXECUTE format('CREATE TABLE IF NOT EXISTS %I PARTITION OF %I DEFAULT%s',
                           parent || '_default', parent, options);
            RETURN NEXT parent || '_default';
        END IF;
        FOR day IN SELECT dispatcher_today() + n FROM generate_series(0, days_ahead) AS n LOOP
            name := dispatcher_partition_name(parent, day);
            CONTINUE WHEN to_regclass(name) IS NOT NULL;
            IF parent = 'events' THEN
                EXECUTE format('CREATE TABLE IF NOT EXISTS %I PARTITION OF events FOR VALUES FROM (%L) TO (%L)',
                               name, to_char(day, 'YYYY-MM-DD'), to_char(day + 1, 'YYYY-MM-DD'));
            ELSE
                EXECUTE format('CREATE TABLE IF NOT EXISTS %I PARTITION OF %I FOR VALUES FROM (%s) TO (%s)%s',
                               name, parent, dispatcher_first_id(day), dispatcher_first_id(day + 1), options);
            END IF;
            RETURN NEXT name;
        END LOOP;
    END LOOP;
END;
$$;

SELECT dispatcher_ensure_partitions(7);

-- The claim's window of ids (docs/claim.md, "The claim's window"): the
-- worker reads it every few seconds and bounds every scan of the claim by it,
-- so the planner prunes the partitions that cannot hold a due row.
--  floor: the lower bound of the oldest partition holding a pending row due
--    within a minute -- one probe of the pending index per partition older
--    than today, oldest first, until one has such a row (*_before: -2^63) --
--    else today's first id; lowered to the smallest such id in the DEFAULT
--    partition, whose rows are of days without a partition (a window over
--    such a day keeps DEFAULT in the plan).  A minute ahead: a row of an older
--    day is in the window before it is due, however many of its day's rows
--    wait for later retries; a row that becomes pending and due at once (a
--    held row resumed) is in it at the worker's next read.
--  ceiling: the first id of the day after the one ten minutes from now: tomorrow's
--    partition joins the window only in the last minutes of today (a window read
--    at 23:59:59 still reaches the rows written after midnight), and is not planned
--    in every claim all day long.
CREATE FUNCTION dispatcher_claim_window() RETURNS TABLE (floor bigint, ceiling bigint)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    part record;
    pending boolean;
    overflow regclass;
    lowest bigint;
    due_by timestamptz := now() + interval '1 minute';
BEGIN
    floor := dispatcher_first_id(dispatcher_today());
    ceiling := dispatcher_first_id(((now() + interval '10 minutes') AT TIME ZONE 'UTC')::date + 1);
    FOR part IN
        SELECT b.rel, b.lower
          FROM (SELECT c.oid::regclass AS rel,
                       CASE WHEN bound.lower = 'MINVALUE' THEN -9223372036854775808
                            ELSE bound.lower::bigint END AS lower
                  FROM pg_inherits i
                  JOIN pg_class c ON c.oid = i.inhrelid
                 CROSS JOIN LATERAL (
                       SELECT substring(pg_get_expr(c.relpartbound, c.oid)
                                        FROM 'FROM \(''?(MINVALUE|-?[0-9]+)''?\)') AS lower) bound
                 WHERE i.inhparent = 'webhook_deliveries'::regclass AND bound.lower IS NOT NULL) b
         WHERE b.lower < floor
         ORDER BY b.lower
    LOOP
        EXECUTE format('SELECT EXISTS (SELECT 1 FROM %s WHERE status = %L AND next_attempt_at <= $1)',
                       part.rel, 'pending') INTO pending USING due_by;
        IF pending THEN
            floor := part.lower;
            EXIT;
        END IF;
    END LOOP;
    SELECT p.partdefid::regclass INTO overflow
      FROM pg_partitioned_table p WHERE p.partrelid = 'webhook_deliveries'::regclass AND p.partdefid <> 0;
    IF overflow IS NOT NULL THEN
        EXECUTE format('SELECT min(id) FROM %s WHERE status = %L AND next_attempt_at <= $1', overflow, 'pending')
           INTO lowest USING due_by;
        floor := least(floor, lowest);
    END IF;
    RETURN NEXT;
END;
$$;

-- The events of a claim's rows (engine_claim), by (workspace_id, id, day): a
-- query made for the days asked, so its plan holds only their partitions, not
-- every day events keep (retention.events) -- planned with the claim, the
-- lookup cost more than the claim's own work.  A key its day does not find
-- (a row whose event_day is not its event's day: written by an older release
-- or an outside tool, which default it to today) is looked up by (workspace_id,
-- id) in every partition, the newest first, as before 0027: a row is never sent
-- as "event gone" for want of its day.  Each key comes back once, its event
-- NULL when there is none.
CREATE FUNCTION dispatcher_claim_events(workspace_ids text[], event_ids text[], days date[])
RETURNS TABLE (workspace_id text, event_id text, event_day date, ev events)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    k record;
BEGIN
    FOR k IN EXECUTE format(
        'SELECT k.workspace_id, k.event_id, k.event_day,
                (SELECT e FROM events e
                  WHERE e.workspace_id = k.workspace_id AND e.id = k.event_id AND e.day = k.event_day
                    AND e.day = ANY (%L::date[])) AS ev
           FROM unnest($1, $2, $3) AS k(workspace_id, event_id, event_day)',
        (SELECT array_agg(DISTINCT d) FROM unnest(days) d))
        USING workspace_ids, event_ids, days
    LOOP
        workspace_id := k.workspace_id;
        event_id := k.event_id;
        event_day := k.event_day;
        ev := k.ev;
        IF k.ev IS NULL THEN
            SELECT e.* INTO ev FROM events e
             WHERE e.workspace_id = k.workspace_id AND e.id = k.event_id
             ORDER BY e.day DESC LIMIT 1;
        END IF;
        RETURN NEXT;
    END LOOP;
END;
$$;

-- The producer's function (0022) again, statement for statement, with the
-- day: the event is written to today's partition and its deliveries say so
-- (event_day).  Its id is refused again the same day by the key (ON CONFLICT),
-- and the day after by a look into yesterday's partition first (one index
-- probe; and into the legacy partition, whose rows have no day of their own):
-- a resend is recognised for at least 24 hours (docs/producer.md,
-- "Deduplication").  A paused endpoint's row is written held (0020).
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
    today date := dispatcher_today();
    seen boolean;
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
        SELECT EXISTS (SELECT 1 FROM events ev
                        WHERE ev.workspace_id = p_workspace_id AND ev.id = p_event_id
                          AND ev.day IN (today - 1, DATE '2000-01-01'))
          INTO seen;
        IF seen THEN
            RETURN QUERY SELECT 'duplicate'::text, NULL::bigint, 0, NULL::jsonb, NULL::text, NULL::text;
            RETURN;
        END IF;
        numbered := nextval('event_sequence');
        INSERT INTO events (id, workspace_id, type, sequence, occurred_at, payload, trace_context, day)
        VALUES (p_event_id, p_workspace_id, p_type, numbered, coalesce(p_occurred_at, now()), p_payload,
                p_trace_context, today)
        ON CONFLICT (workspace_id, id, day) DO NOTHING;
        IF NOT FOUND THEN
            RETURN QUERY SELECT 'duplicate'::text, NULL::bigint, 0, NULL::jsonb, NULL::text, NULL::text;
            RETURN;
        END IF;
        -- The hot path: one INSERT ... SELECT, nothing returned but the count.
        INSERT INTO webhook_deliveries (workspace_id, endpoint_id, event_id, payload_hash, mode, status, event_day)
        SELECT p_workspace_id, e.id, p_event_id, p_payload_hash, 'live',
               CASE WHEN e.paused_at IS NULL THEN 'pending' ELSE 'held' END, today
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
            SELECT EXISTS (SELECT 1 FROM events ev
                            WHERE ev.workspace_id = p_workspace_id AND ev.id = p_event_id
                              AND ev.day IN (today - 1, DATE '2000-01-01'))
              INTO seen;
            IF NOT seen THEN
                INSERT INTO events (id, workspace_id, type, sequence, occurred_at, payload, trace_context, day)
                VALUES (p_event_id, p_workspace_id, p_type, numbered, coalesce(p_occurred_at, now()), p_payload,
                        p_trace_context, today)
                ON CONFLICT (workspace_id, id, day) DO NOTHING;
                shadow := FOUND;
            END IF;
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
        INSERT INTO webhook_deliveries (workspace_id, endpoint_id, event_id, payload_hash, mode, event_day)
        SELECT p_workspace_id, (t ->> 'id')::bigint, p_event_id, p_payload_hash, 'shadow', today
          FROM jsonb_array_elements(targets) AS t;
        GET DIAGNOSTICS written = ROW_COUNT;
    END IF;
    -- jsonb's own text form, so the synchronous body is byte-identical to
    -- what the dispatcher sends for the same event (it reads payload::text).
    RETURN QUERY SELECT CASE WHEN shadow THEN 'shadow' END, numbered, written, targets, p_payload::text, why;
END;
$$;

-- Bulk replay's candidates (0021) again, with the event's day: the join to
-- events reads one partition per row, and a replay row copies the day.
DROP FUNCTION dispatcher_replay_candidates(text, timestamptz, timestamptz, text[], bigint[], text[], bigint, bigint);
CREATE FUNCTION dispatcher_replay_candidates(ws text, since timestamptz, until timestamptz, types text[],
                                             endpoints bigint[], statuses text[], after_id bigint,
                                             max_id bigint)
RETURNS TABLE (id bigint, endpoint_id bigint, event_id text, event_type text, status text,
               created_at timestamptz, payload_hash text, event_day date)
LANGUAGE sql STABLE AS $$
    SELECT d.id, d.endpoint_id, d.event_id, ev.type, d.status, d.created_at, d.payload_hash, d.event_day
      FROM webhook_deliveries d
      JOIN events ev ON ev.workspace_id = d.workspace_id AND ev.id = d.event_id AND ev.day = d.event_day
      JOIN webhook_endpoints e ON e.id = d.endpoint_id AND e.workspace_id = d.workspace_id
     WHERE d.workspace_id = ws AND d.id > after_id AND d.id <= max_id
       -- A row is written with or after its event: this bound lets the
       -- created_at BRIN index skip older blocks.
       AND d.created_at >= since
       AND d.mode = 'live' AND d.status = ANY (statuses)
       AND ev.created_at >= since AND (until IS NULL OR ev.created_at < until)
       AND (cardinality(types) = 0 OR ev.type = ANY (types))
       AND (cardinality(endpoints) = 0 OR d.endpoint_id = ANY (endpoints))
       AND e.active AND e.purpose = 'customer'
       AND NOT EXISTS (SELECT 1 FROM webhook_deliveries o
                        WHERE o.event_id = d.event_id AND o.workspace_id = d.workspace_id
                          AND o.endpoint_id = d.endpoint_id AND o.id > d.id)
$$;
