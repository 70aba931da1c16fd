-- The upkeep leader's partition maintenance (issue 25): what the partition
-- policy (dispatcher/rules/partitions.py) reads, and the DDL it asks for.
-- Run by dispatcher/store/partitions.py only.

-- name: partitions_list
-- Every partition of the three partitioned tables with its bounds (NULL:
-- MINVALUE, MAXVALUE or DEFAULT; the policy tells a day, *_before and DEFAULT
-- apart by them), and for deliveries the facts the policy reads: a pending
-- (leased included) or held row, a dead or failed row -- each one probe of a
-- partial index of that partition (dispatcher_partition_holds, 0028).  With
-- %(facts)s false (dispatcher check, status) only the catalog is read.
WITH found AS MATERIALIZED (
    SELECT p.relname::text AS parent, c.relname::text AS name, c.oid::regclass AS part,
           pg_get_expr(c.relpartbound, c.oid) = 'DEFAULT' AS is_default,
           regexp_match(pg_get_expr(c.relpartbound, c.oid),
                        'FROM \(''?([^'')]*)''?\) TO \(''?([^'')]*)''?\)') AS bound
      FROM pg_inherits i
      JOIN pg_class c ON c.oid = i.inhrelid
      JOIN pg_class p ON p.oid = i.inhparent
     WHERE i.inhparent IN ('webhook_deliveries'::regclass, 'webhook_delivery_attempts'::regclass,
                           'events'::regclass)
), bounds AS MATERIALIZED (
    SELECT parent, name, part, is_default,
           CASE WHEN parent <> 'events' THEN nullif(bound[1], 'MINVALUE')::bigint END AS lower_id,
           CASE WHEN parent <> 'events' THEN nullif(bound[2], 'MAXVALUE')::bigint END AS upper_id,
           CASE WHEN parent = 'events' THEN nullif(bound[1], 'MINVALUE')::date END AS lower_day,
           CASE WHEN parent = 'events' THEN nullif(bound[2], 'MAXVALUE')::date END AS upper_day,
           %(facts)s AND parent = 'webhook_deliveries' AND NOT is_default AS probed
      FROM found
)
SELECT parent, name, is_default, lower_id, upper_id, lower_day, upper_day,
       CASE WHEN probed THEN dispatcher_partition_holds(part, '{pending}')
                          OR dispatcher_partition_holds(part, '{held}') ELSE false END AS open_rows,
       CASE WHEN probed THEN dispatcher_partition_holds(part, '{dead,failed}') ELSE false END AS ended_rows
  FROM bounds
 ORDER BY parent, is_default, coalesce(lower_id, -9223372036854775808), lower_day NULLS FIRST;

-- name: partitions_legacy_until
-- The database clock, and when each legacy table stopped taking rows (0027):
-- the newest row of its *_before partition.
SELECT now() AS db_now, p.table_name, p.legacy_until
  FROM (SELECT 1) AS one
  LEFT JOIN partitioning p ON true;

-- name: partitions_events_referenced
-- Whether a delivery row refers to an event of the days [lower, upper)
-- (lower NULL: from the first day, for events_before): the
-- BRIN index on event_day reads only the block ranges that may (rows are
-- appended with the day they are written; a replay copies its original's).
SET LOCAL enable_seqscan = off;
SELECT EXISTS (SELECT 1 FROM webhook_deliveries d
                WHERE d.event_day >= coalesce(%(lower)s::date, '-infinity') AND d.event_day < %(upper)s::date) AS referenced;

-- name: partitions_create
-- One day's partition of one table, in a transaction of its own (the
-- statements share one implicit transaction): CREATE ... PARTITION OF takes
-- ACCESS EXCLUSIVE on the parent and its DEFAULT partition, and a request
-- waiting for it queues every producer and worker behind it, so it gives up
-- after partitions.lock_timeout and is tried again next round.
SELECT set_config('lock_timeout', %(lock_timeout)s, true);
SELECT dispatcher_create_partition(%(parent)s, %(day)s::date) AS created;

-- name: partitions_drop
-- Detach and drop one partition the policy found past retention, under the
-- same short lock_timeout; NULL when dropped, else why it was kept
-- (dispatcher_drop_partition, migration 0028, checks again under the lock).
SELECT set_config('lock_timeout', %(lock_timeout)s, true);
SELECT dispatcher_drop_partition(%(parent)s, %(name)s) AS kept;
