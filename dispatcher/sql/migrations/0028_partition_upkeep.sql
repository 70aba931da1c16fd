-- 0028: the upkeep's partition DDL, one partition at a time (issue 25; the
-- policy: dispatcher/rules/partitions.py; docs/operations.md, "Partition
-- maintenance").
--
-- dispatcher_create_partition(parent, day) creates one day's partition of one
-- table, and returns its name (NULL: it existed).  The upkeep leader calls it
-- for each missing day in a transaction of its own, under a short
-- lock_timeout: one day it cannot create (its table busy, or the DEFAULT
-- partition already holding rows of that day: check_violation) must not keep
-- it from creating the others.  dispatcher_ensure_partitions (0027) now
-- creates its days through it.
CREATE FUNCTION dispatcher_create_partition(parent text, day date) RETURNS text
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    name text := dispatcher_partition_name(parent, day);
BEGIN
    IF to_regclass(name) IS NOT NULL THEN
        RETURN NULL;  -- no lock taken: CREATE ... PARTITION OF would lock the parent first
    END IF;
    IF parent = 'events' THEN
        EXECUTE format('CREATE TABLE %I PARTITION OF events FOR VALUES FROM (%L) TO (%L)',
                       name, to_char(day, 'YYYY-MM-DD'), to_char(day + 1, 'YYYY-MM-DD'));
    ELSIF parent = 'webhook_deliveries' THEN
        -- HOT updates of the lease columns depend on the room fillfactor leaves (docs/claim.md).
        EXECUTE format('CREATE TABLE %I PARTITION OF webhook_deliveries FOR VALUES FROM (%s) TO (%s) '
                       'WITH (fillfactor = 50)', name, dispatcher_first_id(day), dispatcher_first_id(day + 1));
    ELSIF parent = 'webhook_delivery_attempts' THEN
        EXECUTE format('CREATE TABLE %I PARTITION OF webhook_delivery_attempts FOR VALUES FROM (%s) TO (%s)',
                       name, dispatcher_first_id(day), dispatcher_first_id(day + 1));
    ELSE
        RAISE EXCEPTION '% is not a partitioned table of the dispatcher', parent;
    END IF;
    RETURN name;
END;
$$;

CREATE OR REPLACE FUNCTION dispatcher_ensure_partitions(days_ahead int) RETURNS SETOF text
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    parent text;
    made text;
BEGIN
    FOREACH parent IN ARRAY ARRAY['webhook_deliveries', 'webhook_delivery_attempts', 'events'] LOOP
        IF to_regclass(parent || '_default') IS NULL THEN
            EXECUTE format('CREATE TABLE %I PARTITION OF %I DEFAULT%s', parent || '_default', parent,
                           CASE WHEN parent = 'webhook_deliveries' THEN ' WITH (fillfactor = 50)' ELSE '' END);
            RETURN NEXT parent || '_default';
        END IF;
        FOR n IN 0 .. days_ahead LOOP
            made := dispatcher_create_partition(parent, dispatcher_today() + n);
            IF made IS NOT NULL THEN
                RETURN NEXT made;
            END IF;
        END LOOP;
    END LOOP;
END;
$$;

-- Whether one partition holds a row of one of these statuses: a query of that
-- partition alone, which a partial index answers (pending: ..._pending_age,
-- held: ..._held, dead and failed: ..._endpoint_failed).  Asked through the
-- parent with the partition's id range instead, the planner joined the range
-- of the primary key to the partial index (a bitmap of the whole day).
CREATE FUNCTION dispatcher_partition_holds(part regclass, statuses text[]) RETURNS boolean
LANGUAGE plpgsql STABLE SET enable_seqscan = off AS $$
DECLARE
    found boolean;
BEGIN
    EXECUTE format('SELECT EXISTS (SELECT 1 FROM %s WHERE status = ANY (%L::text[]))', part, statuses) INTO found;
    RETURN found;
END;
$$;

-- Retention by dropping whole partitions.
--
-- dispatcher_drop_partition(parent, name) detaches and drops one day (or
-- *_before) partition that the upkeep leader's policy found past retention.
-- The policy read its facts without a lock; this function checks the ones
-- that make a drop unsafe again once it holds the lock, when they can no
-- longer change:
--
--  * DETACH takes ACCESS EXCLUSIVE on the parent, its DEFAULT partition and
--    the partition, so it starts only once every transaction that read or
--    wrote any of them has ended, and none starts until this one commits;
--  * a deliveries partition that still holds a pending (leased included) or
--    held row is kept: the row still owes a delivery;
--  * an events partition is kept while a delivery row refers to one of its
--    days (webhook_deliveries.event_day, through its BRIN index): a replay
--    committed after the policy looked, of a row that refers to it, is seen.
--
-- Kept, the function undoes the detach (a subtransaction) and returns why;
-- dropped, it returns NULL.  The caller sets a short lock_timeout: waiting
-- for the lock would queue every producer and worker behind it, so a busy
-- table makes it fail with 55P03 instead, and it is tried again next round.
-- The DEFAULT partitions are never dropped (they are pruned row by row).
CREATE FUNCTION dispatcher_drop_partition(parent text, name text) RETURNS text
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    bound text;
    bounds text[];
    busy boolean;
BEGIN
    SELECT pg_get_expr(c.relpartbound, c.oid) INTO bound
      FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
     WHERE i.inhparent = parent::regclass AND c.relname = name;
    IF bound IS NULL THEN
        RETURN format('%s is not a partition of %s', name, parent);
    ELSIF bound = 'DEFAULT' THEN
        RETURN 'the DEFAULT partition is never dropped';
    END IF;
    BEGIN
        EXECUTE format('ALTER TABLE %I DETACH PARTITION %I', parent, name);
        IF parent = 'webhook_deliveries' THEN
            EXECUTE format('SELECT EXISTS (SELECT 1 FROM %1$I WHERE status = ''pending'') '
                           'OR EXISTS (SELECT 1 FROM %1$I WHERE status = ''held'')', name) INTO busy;
            IF busy THEN
                RAISE EXCEPTION 'holds pending or held rows, which still owe a delivery';
            END IF;
        ELSIF parent = 'events' THEN
            bounds := regexp_match(bound, 'FROM \(''?([^'')]*)''?\) TO \(''?([^'')]*)''?\)');
            SELECT EXISTS (SELECT 1 FROM webhook_deliveries d
                            WHERE d.event_day >= coalesce(nullif(bounds[1], 'MINVALUE')::date, '-infinity')
                              AND d.event_day < coalesce(nullif(bounds[2], 'MAXVALUE')::date, 'infinity'))
              INTO busy;
            IF busy THEN
                RAISE EXCEPTION 'delivery rows still refer to its events';
            END IF;
        END IF;
        EXECUTE format('DROP TABLE %I', name);
    EXCEPTION WHEN raise_exception THEN
        RETURN SQLERRM;
    END;
    RETURN NULL;
END;
$$;
