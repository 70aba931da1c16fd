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
