-- 0030: the due index keeps one entry per delivery (deduplicate_items = off)
-- in every partition of the outbox (docs/claim.md, "Merged index entries").
--
-- A burst committed in one transaction (a producer's batch, a bulk replay)
-- gives an endpoint's rows one due time, so their keys in
-- webhook_deliveries_due are equal, and Postgres merges equal keys into
-- posting lists.  A scan marks an index entry dead once its row is dead to
-- every transaction, so later scans pass it without reading the heap; but a
-- posting list is marked only when every row in it is dead.  While a lane
-- drains such a burst, the list at its frontier holds delivered and pending
-- rows, and every claim's walk and refill read each delivered row's heap page
-- again until vacuum.  Kept apart, each entry is marked on its own.
--
-- Only the partitions' indexes take the option: a partitioned index cannot be
-- altered (it would have to be built again over every partition), so
-- dispatcher_create_partition sets it on each new day's index.  Entries
-- already merged stay merged; nothing new is merged.
CREATE FUNCTION dispatcher_due_entries_apart(part regclass) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    index_name regclass;
BEGIN
    FOR index_name IN
        SELECT c.oid::regclass FROM pg_inherits i
          JOIN pg_class c ON c.oid = i.inhrelid
          JOIN pg_index x ON x.indexrelid = c.oid
         WHERE i.inhparent = 'webhook_deliveries_due'::regclass AND x.indrelid = part
    LOOP
        EXECUTE format('ALTER INDEX %s SET (deduplicate_items = off)', index_name);
    END LOOP;
END;
$$;

CREATE OR REPLACE FUNCTION dispatcher_create_partition(parent text, day date) RETURNS text
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
        PERFORM dispatcher_due_entries_apart(name::regclass);
    ELSIF parent = 'webhook_delivery_attempts' THEN
        EXECUTE format('CREATE TABLE %I PARTITION OF webhook_delivery_attempts FOR VALUES FROM (%s) TO (%s)',
                       name, dispatcher_first_id(day), dispatcher_first_id(day + 1));
    ELSE
        RAISE EXCEPTION '% is not a partitioned table of the dispatcher', parent;
    END IF;
    RETURN name;
END;
$$;

SELECT dispatcher_due_entries_apart(i.inhrelid::regclass)
  FROM pg_inherits i WHERE i.inhparent = 'webhook_deliveries'::regclass;
