-- The dispatcher's schema as the numbered migrations (sql/migrations/) leave
-- it, in one file for readers.  Production migrates with the numbered files;
-- this is not applied anywhere but tests/integration/test_schema_snapshot.py, which
-- checks that the two agree.  Generated from a migrated database:
--     python -m dispatcher_devtools.schema DSN > dispatcher/sql/schema.sql
-- Not here: schema_migrations (the migrator's table) and the rows migrations
-- insert (rollout_settings' one row).

SET check_function_bodies = false;

CREATE SEQUENCE webhook_deliveries_id_seq;

CREATE SEQUENCE webhook_claim_tokens;

CREATE SEQUENCE webhook_delivery_attempts_id_seq;

CREATE SEQUENCE event_sequence;

CREATE OR REPLACE FUNCTION public.webhook_endpoints_limit()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
DECLARE
    owned int;
BEGIN
    IF NEW.purpose = 'operational' THEN
        RETURN NEW;
    END IF;
    IF TG_OP = 'INSERT' OR NEW.workspace_id IS DISTINCT FROM OLD.workspace_id THEN
        PERFORM 1 FROM workspaces WHERE id = NEW.workspace_id FOR UPDATE;
        SELECT count(*) INTO owned FROM webhook_endpoints
         WHERE workspace_id = NEW.workspace_id AND purpose = 'customer' AND id <> NEW.id;
        IF owned >= 100 THEN
            RAISE EXCEPTION 'workspace % already has 100 endpoints, active or not', NEW.workspace_id
                USING ERRCODE = 'check_violation';
        END IF;
    END IF;
    IF NOT NEW.active THEN
        RETURN NEW;
    END IF;
    PERFORM 1 FROM workspaces WHERE id = NEW.workspace_id FOR UPDATE;
    SELECT count(*) INTO owned FROM webhook_endpoints
     WHERE workspace_id = NEW.workspace_id AND active AND purpose = 'customer' AND id <> NEW.id;
    IF owned >= 10 THEN
        RAISE EXCEPTION 'workspace % already has 10 active endpoints', NEW.workspace_id
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END;
$function$;

CREATE OR REPLACE FUNCTION public.rollout_bucket(workspace_id text)
 RETURNS integer
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE STRICT
RETURN ((((('x'::text || substr(md5(workspace_id), 1, 8)))::bit(32))::bigint % (100)::bigint))::integer;

CREATE OR REPLACE FUNCTION public.webhook_outbox_on(flag jsonb, listed text, percent integer, bucket integer)
 RETURNS boolean
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
RETURN CASE WHEN (flag = 'true'::jsonb) THEN true WHEN (flag = 'false'::jsonb) THEN false WHEN (listed = 'exclude'::text) THEN false WHEN (listed = 'include'::text) THEN true ELSE (bucket < COALESCE(percent, 0)) END;

CREATE OR REPLACE FUNCTION public.dispatcher_bucket_level(max_per_second double precision, stored double precision, elapsed double precision)
 RETURNS double precision
 LANGUAGE sql
 IMMUTABLE
AS $function$
    SELECT CASE WHEN max_per_second IS NULL THEN NULL
                WHEN stored IS NULL THEN greatest(1.0, max_per_second)
                ELSE least(greatest(1.0, max_per_second), stored + max_per_second * greatest(elapsed, 0.0)) END
$function$;

CREATE OR REPLACE FUNCTION public.dispatcher_room(concurrency integer, in_flight bigint, max_per_second double precision, stored double precision, elapsed double precision)
 RETURNS integer
 LANGUAGE sql
 IMMUTABLE
AS $function$
    SELECT CASE WHEN max_per_second IS NULL THEN greatest(0, concurrency - in_flight)
                ELSE greatest(0, least(concurrency - in_flight,
                                       floor(dispatcher_bucket_level(max_per_second, stored, elapsed))))
           END::int
$function$;

CREATE OR REPLACE FUNCTION public.dispatcher_bucket_after(max_per_second double precision, stored double precision, elapsed double precision, taken bigint)
 RETURNS double precision
 LANGUAGE sql
 IMMUTABLE
AS $function$
    -- greatest() skips NULLs: no rate must stay NULL, not become 0.
    SELECT CASE WHEN max_per_second IS NOT NULL
                THEN greatest(0.0, dispatcher_bucket_level(max_per_second, stored, elapsed) - taken) END
$function$;

CREATE OR REPLACE FUNCTION public.dispatcher_lane_room(endpoint bigint, concurrency integer, max_per_second double precision)
 RETURNS integer
 LANGUAGE sql
 IMMUTABLE
AS $function$
    SELECT 0
$function$;

CREATE OR REPLACE FUNCTION public.dispatcher_signing_secrets(endpoint_secret text, endpoint_previous text, endpoint_rotated_at timestamp with time zone, workspace_secret text, workspace_previous text, workspace_rotated_at timestamp with time zone, grace double precision)
 RETURNS text[]
 LANGUAGE sql
 STABLE
AS $function$
    SELECT CASE WHEN endpoint_secret IS NOT NULL
                THEN ARRAY[endpoint_secret, CASE WHEN endpoint_rotated_at > now() - make_interval(secs => grace)
                                                 THEN endpoint_previous END]
                ELSE ARRAY[workspace_secret, CASE WHEN workspace_rotated_at > now() - make_interval(secs => grace)
                                                  THEN workspace_previous END]
           END
$function$;

CREATE OR REPLACE FUNCTION public.dispatcher_lane_free(endpoint bigint, concurrency integer, max_per_second double precision)
 RETURNS integer
 LANGUAGE plpgsql
 SET plan_cache_mode TO 'auto'
 SET enable_seqscan TO 'off'
AS $function$
DECLARE
    leased bigint;
    stored double precision;
    elapsed double precision;
BEGIN
    SELECT coalesce(sum(l.leased), 0) INTO leased FROM endpoint_leases l
     WHERE l.endpoint_id = endpoint AND l.until > now();
    IF max_per_second IS NOT NULL THEN
        SELECT r.tokens, extract(epoch FROM now() - r.refilled_at)::float8 INTO stored, elapsed
          FROM endpoint_rate r WHERE r.endpoint_id = endpoint;
    END IF;
    RETURN dispatcher_room(concurrency, leased, max_per_second, stored, elapsed);
END
$function$;

CREATE OR REPLACE FUNCTION public.dispatcher_unleased(locked_until timestamp with time zone)
 RETURNS boolean
 LANGUAGE sql
 STABLE PARALLEL SAFE
AS $function$
    SELECT locked_until IS NULL OR locked_until <= now()
$function$;

CREATE OR REPLACE FUNCTION public.dispatcher_sampled_trace_id(traceparent text)
 RETURNS text
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $function$
    SELECT CASE WHEN traceparent ~ '^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f][13579bdf]$'
                THEN substr(traceparent, 4, 32) END
$function$;

CREATE OR REPLACE FUNCTION public.dispatcher_send_event(p_workspace_id text, p_event_id text, p_type text, p_occurred_at timestamp with time zone, p_payload jsonb, p_payload_hash text, p_shadow_writes boolean, p_grace double precision, p_trace_context jsonb DEFAULT NULL::jsonb)
 RETURNS TABLE(mode text, sequence bigint, deliveries integer, legacy_targets jsonb, legacy_payload text, skipped text)
 LANGUAGE plpgsql
AS $function$
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
$function$;

CREATE OR REPLACE FUNCTION public.dispatcher_today()
 RETURNS date
 LANGUAGE sql
 STABLE PARALLEL SAFE
AS $function$
    SELECT (now() AT TIME ZONE 'UTC')::date
$function$;

CREATE OR REPLACE FUNCTION public.dispatcher_first_id(day date)
 RETURNS bigint
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE STRICT
AS $function$
    SELECT (day - DATE '2020-01-01')::bigint << 38
$function$;

CREATE OR REPLACE FUNCTION public.dispatcher_day_of_id(id bigint)
 RETURNS date
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE STRICT
AS $function$
    SELECT DATE '2020-01-01' + (id >> 38)::int
$function$;

CREATE OR REPLACE FUNCTION public.dispatcher_next_id(seq regclass)
 RETURNS bigint
 LANGUAGE sql
AS $function$
    SELECT dispatcher_first_id(dispatcher_today()) + (nextval(seq) & 274877906943)
$function$;

CREATE OR REPLACE FUNCTION public.dispatcher_partition_name(parent text, day date)
 RETURNS text
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE STRICT
AS $function$
    SELECT parent || '_p' || to_char(day, 'YYYYMMDD')
$function$;

CREATE OR REPLACE FUNCTION public.dispatcher_ensure_partitions(days_ahead integer)
 RETURNS SETOF text
 LANGUAGE plpgsql
AS $function$
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
$function$;

CREATE OR REPLACE FUNCTION public.dispatcher_claim_window()
 RETURNS TABLE(floor bigint, ceiling bigint)
 LANGUAGE plpgsql
 STABLE
AS $function$
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
$function$;

CREATE OR REPLACE FUNCTION public.dispatcher_replay_candidates(ws text, since timestamp with time zone, until timestamp with time zone, types text[], endpoints bigint[], statuses text[], after_id bigint, max_id bigint)
 RETURNS TABLE(id bigint, endpoint_id bigint, event_id text, event_type text, status text, created_at timestamp with time zone, payload_hash text, event_day date)
 LANGUAGE sql
 STABLE
AS $function$
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
$function$;

CREATE OR REPLACE FUNCTION public.dispatcher_create_partition(parent text, day date)
 RETURNS text
 LANGUAGE plpgsql
AS $function$
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
$function$;

CREATE OR REPLACE FUNCTION public.dispatcher_partition_holds(part regclass, statuses text[])
 RETURNS boolean
 LANGUAGE plpgsql
 STABLE
 SET enable_seqscan TO 'off'
AS $function$
DECLARE
    found boolean;
BEGIN
    EXECUTE format('SELECT EXISTS (SELECT 1 FROM %s WHERE status = ANY (%L::text[]))', part, statuses) INTO found;
    RETURN found;
END;
$function$;

CREATE OR REPLACE FUNCTION public.dispatcher_drop_partition(parent text, name text)
 RETURNS text
 LANGUAGE plpgsql
AS $function$
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
$function$;

CREATE OR REPLACE FUNCTION public.dispatcher_owner_live(owner text)
 RETURNS boolean
 LANGUAGE plpgsql
AS $function$
BEGIN
    PERFORM pg_advisory_xact_lock_shared(3605, hashtext(owner));
    RETURN NOT EXISTS (SELECT 1 FROM retired_owners r WHERE r.owner = dispatcher_owner_live.owner);
END;
$function$;

CREATE OR REPLACE FUNCTION public.dispatcher_release_owner(owner text)
 RETURNS bigint
 LANGUAGE plpgsql
AS $function$
DECLARE
    released bigint;
BEGIN
    PERFORM pg_advisory_xact_lock(3605, hashtext(owner));
    INSERT INTO retired_owners AS r (owner) VALUES (dispatcher_release_owner.owner)
    ON CONFLICT ON CONSTRAINT retired_owners_pkey DO UPDATE SET retired_at = now();
    DELETE FROM region_leader l WHERE l.owner = dispatcher_release_owner.owner;
    DELETE FROM endpoint_leases l WHERE l.owner = dispatcher_release_owner.owner;
    UPDATE webhook_deliveries
       SET locked_by = NULL, locked_until = NULL, claim_token = NULL
     WHERE status = 'pending' AND locked_by = dispatcher_release_owner.owner;
    GET DIAGNOSTICS released = ROW_COUNT;
    RETURN released;
END;
$function$;

CREATE OR REPLACE FUNCTION public.dispatcher_due_entries_apart(part regclass)
 RETURNS void
 LANGUAGE plpgsql
AS $function$
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
$function$;

CREATE TABLE workspaces (
    id                 text NOT NULL,
    secret             text NOT NULL,
    previous_secret    text,
    secret_rotated_at  timestamp with time zone,
    flags              jsonb DEFAULT '{}'::jsonb NOT NULL,
    created_at         timestamp with time zone DEFAULT now() NOT NULL,
    owner_contact      text,
    notify_webhook_url text,
    CONSTRAINT workspaces_pkey PRIMARY KEY (id)
);

CREATE TABLE webhook_endpoints (
    id                bigserial,
    workspace_id      text NOT NULL,
    url               text NOT NULL,
    event_types       text[] DEFAULT '{}'::text[] NOT NULL,
    active            boolean DEFAULT true NOT NULL,
    created_at        timestamp with time zone DEFAULT now() NOT NULL,
    max_per_second    double precision,
    secret            text,
    previous_secret   text,
    secret_rotated_at timestamp with time zone,
    description       text,
    owner_contact     text,
    purpose           text DEFAULT 'customer'::text NOT NULL,
    secret_shown      boolean DEFAULT true NOT NULL,
    paused_at         timestamp with time zone,
    pause_cause       text,
    trace_headers     boolean DEFAULT true NOT NULL,
    CONSTRAINT webhook_endpoints_pkey PRIMARY KEY (id),
    CONSTRAINT webhook_endpoints_max_per_second_check CHECK (((max_per_second > (0)::double precision) AND (max_per_second < 'Infinity'::double precision))),
    CONSTRAINT webhook_endpoints_secret_check CHECK ((secret <> ''::text)),
    CONSTRAINT webhook_endpoints_description_check CHECK ((length(description) <= 500)),
    CONSTRAINT webhook_endpoints_purpose_check CHECK ((purpose = ANY (ARRAY['customer'::text, 'operational'::text]))),
    CONSTRAINT webhook_endpoints_pause_cause_check CHECK ((pause_cause = ANY (ARRAY['customer'::text, 'operator'::text, 'lifecycle'::text]))),
    CONSTRAINT webhook_endpoints_pause_check CHECK (((paused_at IS NULL) = (pause_cause IS NULL))),
    CONSTRAINT webhook_endpoints_workspace_id_fkey FOREIGN KEY (workspace_id) REFERENCES workspaces(id) ON DELETE CASCADE
);

CREATE TABLE endpoint_state (
    endpoint_id          bigint NOT NULL,
    state                text DEFAULT 'closed'::text NOT NULL,
    consecutive_failures integer DEFAULT 0 NOT NULL,
    open_until           timestamp with time zone,
    opened_at            timestamp with time zone,
    last_success_at      timestamp with time zone,
    last_failure_at      timestamp with time zone,
    last_error           text,
    updated_at           timestamp with time zone DEFAULT now() NOT NULL,
    open_episode         bigint DEFAULT 0 NOT NULL,
    CONSTRAINT endpoint_state_pkey PRIMARY KEY (endpoint_id),
    CONSTRAINT endpoint_state_state_check CHECK ((state = ANY (ARRAY['closed'::text, 'open'::text, 'half_open'::text])))
) WITH (fillfactor=70);

CREATE TABLE api_tokens (
    id           bigserial,
    token_sha256 text NOT NULL,
    workspace_id text NOT NULL,
    scopes       text[] NOT NULL,
    created_at   timestamp with time zone DEFAULT now() NOT NULL,
    revoked_at   timestamp with time zone,
    token_prefix text,
    expires_at   timestamp with time zone,
    last_used_at timestamp with time zone,
    CONSTRAINT api_tokens_pkey PRIMARY KEY (id),
    CONSTRAINT api_tokens_token_sha256_key UNIQUE (token_sha256),
    CONSTRAINT api_tokens_token_sha256_check CHECK ((token_sha256 ~ '^[0-9a-f]{64}$'::text)),
    CONSTRAINT api_tokens_scopes_check CHECK (((cardinality(scopes) > 0) AND (scopes <@ ARRAY['webhooks:read'::text, 'webhooks:write'::text]))),
    CONSTRAINT api_tokens_workspace_id_fkey FOREIGN KEY (workspace_id) REFERENCES workspaces(id) ON DELETE CASCADE
);

CREATE TABLE api_replay_ledger (
    id           bigserial,
    workspace_id text NOT NULL,
    at           timestamp with time zone DEFAULT now() NOT NULL,
    units        integer NOT NULL,
    CONSTRAINT api_replay_ledger_pkey PRIMARY KEY (id),
    CONSTRAINT api_replay_ledger_units_check CHECK ((units > 0))
);

CREATE TABLE rollout_settings (
    singleton  boolean DEFAULT true NOT NULL,
    percent    integer DEFAULT 0 NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT rollout_settings_pkey PRIMARY KEY (singleton),
    CONSTRAINT rollout_settings_singleton_check CHECK (singleton),
    CONSTRAINT rollout_settings_percent_check CHECK (((percent >= 0) AND (percent <= 100)))
);

CREATE TABLE rollout_workspaces (
    workspace_id text NOT NULL,
    list         text NOT NULL,
    updated_at   timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT rollout_workspaces_pkey PRIMARY KEY (workspace_id),
    CONSTRAINT rollout_workspaces_list_check CHECK ((list = ANY (ARRAY['include'::text, 'exclude'::text]))),
    CONSTRAINT rollout_workspaces_workspace_id_fkey FOREIGN KEY (workspace_id) REFERENCES workspaces(id) ON DELETE CASCADE
);

CREATE TABLE dispatcher_processes (
    owner        text NOT NULL,
    region       text NOT NULL,
    host         text NOT NULL,
    pid          integer NOT NULL,
    started_at   timestamp with time zone NOT NULL,
    heartbeat_at timestamp with time zone DEFAULT now() NOT NULL,
    in_flight    integer DEFAULT 0 NOT NULL,
    leader_at    timestamp with time zone,
    CONSTRAINT dispatcher_processes_pkey PRIMARY KEY (owner)
) WITH (fillfactor=50);

CREATE TABLE endpoint_rate (
    endpoint_id bigint NOT NULL,
    tokens      double precision NOT NULL,
    refilled_at timestamp with time zone NOT NULL,
    last_taken  integer DEFAULT 0 NOT NULL,
    CONSTRAINT endpoint_rate_pkey PRIMARY KEY (endpoint_id)
);

CREATE TABLE region_leader (
    region text NOT NULL,
    owner  text NOT NULL,
    until  timestamp with time zone NOT NULL,
    CONSTRAINT region_leader_pkey PRIMARY KEY (region)
);

CREATE TABLE api_audit (
    id           bigserial,
    workspace_id text NOT NULL,
    at           timestamp with time zone DEFAULT now() NOT NULL,
    token_id     bigint,
    action       text NOT NULL,
    endpoint_id  bigint,
    delivery_ids bigint[] DEFAULT '{}'::bigint[] NOT NULL,
    detail       jsonb DEFAULT '{}'::jsonb NOT NULL,
    CONSTRAINT api_audit_pkey PRIMARY KEY (id),
    CONSTRAINT api_audit_action_check CHECK ((action = ANY (ARRAY['delivery.replay'::text, 'endpoint.recover'::text, 'endpoint.create'::text, 'endpoint.update'::text, 'endpoint.delete'::text, 'endpoint.breaker_close'::text, 'endpoint.secret_rotate'::text, 'workspace.update'::text, 'endpoint.pause'::text, 'endpoint.resume'::text, 'replay.bulk'::text])))
);

CREATE TABLE breaker_notices (
    endpoint_id     bigint NOT NULL,
    episode         bigint NOT NULL,
    kind            text NOT NULL,
    workspace_id    text NOT NULL,
    created_at      timestamp with time zone DEFAULT now() NOT NULL,
    attempts        integer DEFAULT 0 NOT NULL,
    next_attempt_at timestamp with time zone DEFAULT now(),
    sent_at         timestamp with time zone,
    recipient       text,
    last_error      text,
    detail          jsonb DEFAULT '{}'::jsonb NOT NULL,
    CONSTRAINT breaker_notices_pkey PRIMARY KEY (endpoint_id, episode, kind),
    CONSTRAINT breaker_notices_kind_check CHECK ((kind = ANY (ARRAY['opened'::text, 'will_pause'::text, 'paused'::text, 'expiring'::text, 'recovered'::text])))
);

CREATE TABLE endpoint_leases (
    endpoint_id bigint NOT NULL,
    claim_token bigint NOT NULL,
    owner       text NOT NULL,
    leased      integer NOT NULL,
    until       timestamp with time zone NOT NULL,
    CONSTRAINT endpoint_leases_pkey PRIMARY KEY (endpoint_id, claim_token),
    CONSTRAINT endpoint_leases_leased_check CHECK ((leased >= 0))
) WITH (fillfactor=70);

CREATE TABLE backlog_samples (
    id           bigint GENERATED ALWAYS AS IDENTITY,
    taken_at     timestamp with time zone DEFAULT now() NOT NULL,
    oldest_age   double precision,
    overdue_rows integer NOT NULL,
    held_rows    integer NOT NULL,
    alerting     boolean NOT NULL,
    CONSTRAINT backlog_samples_pkey PRIMARY KEY (id)
);

CREATE TABLE alert_episodes (
    id         bigint GENERATED ALWAYS AS IDENTITY,
    alert      text NOT NULL,
    fired_at   timestamp with time zone DEFAULT now() NOT NULL,
    cleared_at timestamp with time zone,
    detail     text NOT NULL,
    CONSTRAINT alert_episodes_pkey PRIMARY KEY (id),
    CONSTRAINT alert_episodes_alert_check CHECK ((alert = 'backlog'::text))
);

CREATE TABLE contact_confirmations (
    workspace_id    text NOT NULL,
    address         text NOT NULL,
    created_at      timestamp with time zone DEFAULT now() NOT NULL,
    attempts        integer DEFAULT 0 NOT NULL,
    next_attempt_at timestamp with time zone DEFAULT now(),
    sent_at         timestamp with time zone,
    last_error      text,
    token_hash      text,
    confirmed_at    timestamp with time zone,
    CONSTRAINT contact_confirmations_pkey PRIMARY KEY (workspace_id, address),
    CONSTRAINT contact_confirmations_token_hash_key UNIQUE (token_hash),
    CONSTRAINT contact_confirmations_workspace_id_fkey FOREIGN KEY (workspace_id) REFERENCES workspaces(id) ON DELETE CASCADE
);

CREATE TABLE endpoint_lifecycle (
    endpoint_id   bigint NOT NULL,
    episode       bigint NOT NULL,
    failing_since timestamp with time zone,
    closed_at     timestamp with time zone,
    ended_at      timestamp with time zone,
    stage         text DEFAULT 'healthy'::text NOT NULL,
    next_step     text,
    next_step_at  timestamp with time zone,
    updated_at    timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT endpoint_lifecycle_pkey PRIMARY KEY (endpoint_id),
    CONSTRAINT endpoint_lifecycle_stage_check CHECK ((stage = ANY (ARRAY['healthy'::text, 'failing'::text, 'will_pause'::text, 'paused'::text])))
);

CREATE TABLE replay_jobs (
    id           bigserial,
    workspace_id text NOT NULL,
    request_key  text NOT NULL,
    fingerprint  text NOT NULL,
    token_id     bigint,
    since        timestamp with time zone NOT NULL,
    until        timestamp with time zone,
    event_types  text[] DEFAULT '{}'::text[] NOT NULL,
    endpoint_ids bigint[] DEFAULT '{}'::bigint[] NOT NULL,
    statuses     text[] NOT NULL,
    state        text DEFAULT 'running'::text NOT NULL,
    total        integer NOT NULL,
    queued       integer DEFAULT 0 NOT NULL,
    replay_units integer NOT NULL,
    max_id       bigint NOT NULL,
    after_id     bigint DEFAULT 0 NOT NULL,
    created_at   timestamp with time zone DEFAULT now() NOT NULL,
    updated_at   timestamp with time zone DEFAULT now() NOT NULL,
    finished_at  timestamp with time zone,
    CONSTRAINT replay_jobs_pkey PRIMARY KEY (id),
    CONSTRAINT replay_jobs_request UNIQUE (workspace_id, request_key),
    CONSTRAINT replay_jobs_state_check CHECK ((state = ANY (ARRAY['running'::text, 'done'::text]))),
    CONSTRAINT replay_jobs_total_check CHECK ((total >= 0)),
    CONSTRAINT replay_jobs_queued_check CHECK ((queued >= 0)),
    CONSTRAINT replay_jobs_replay_units_check CHECK ((replay_units >= 0))
);

CREATE TABLE fleet_stops (
    region     text NOT NULL,
    stopped_at timestamp with time zone DEFAULT now() NOT NULL,
    how        text NOT NULL,
    host       text NOT NULL,
    pid        integer NOT NULL,
    CONSTRAINT fleet_stops_pkey PRIMARY KEY (region)
);

CREATE TABLE partitioning (
    table_name   text NOT NULL,
    legacy_until timestamp with time zone,
    CONSTRAINT partitioning_pkey PRIMARY KEY (table_name)
);

CREATE TABLE webhook_deliveries (
    id               bigint DEFAULT dispatcher_next_id('webhook_deliveries_id_seq'::regclass) NOT NULL,
    workspace_id     text NOT NULL,
    endpoint_id      bigint NOT NULL,
    event_id         text NOT NULL,
    payload_hash     text NOT NULL,
    attempt          integer DEFAULT 0 NOT NULL,
    status           text DEFAULT 'pending'::text NOT NULL,
    mode             text DEFAULT 'live'::text NOT NULL,
    next_attempt_at  timestamp with time zone DEFAULT now() NOT NULL,
    last_error       text,
    last_status_code integer,
    created_at       timestamp with time zone DEFAULT now() NOT NULL,
    delivered_at     timestamp with time zone,
    finished_at      timestamp with time zone,
    replay_of        bigint,
    locked_by        text,
    locked_until     timestamp with time zone,
    claim_token      bigint,
    held_seconds     double precision DEFAULT 0 NOT NULL,
    trace_context    jsonb,
    event_day        date DEFAULT dispatcher_today() NOT NULL,
    CONSTRAINT webhook_deliveries_pkey PRIMARY KEY (id),
    CONSTRAINT webhook_deliveries_mode_check CHECK ((mode = ANY (ARRAY['live'::text, 'shadow'::text]))),
    CONSTRAINT webhook_deliveries_shadow_status CHECK (((status <> ALL (ARRAY['delivered'::text, 'shadow'::text])) OR ((status = 'shadow'::text) = (mode = 'shadow'::text)))),
    CONSTRAINT webhook_deliveries_status_check CHECK ((status = ANY (ARRAY['pending'::text, 'held'::text, 'delivered'::text, 'failed'::text, 'dead'::text, 'shadow'::text])))
) PARTITION BY RANGE (id);

CREATE TABLE webhook_delivery_attempts (
    id               bigint DEFAULT dispatcher_next_id('webhook_delivery_attempts_id_seq'::regclass) NOT NULL,
    delivery_id      bigint NOT NULL,
    endpoint_id      bigint NOT NULL,
    attempt          integer NOT NULL,
    started_at       timestamp with time zone NOT NULL,
    duration_ms      integer NOT NULL,
    result           text NOT NULL,
    status_code      integer,
    error            text,
    response_excerpt text,
    claim_token      bigint,
    trace_id         text,
    CONSTRAINT webhook_delivery_attempts_pkey PRIMARY KEY (id)
) PARTITION BY RANGE (id);

CREATE TABLE events (
    id            text NOT NULL,
    workspace_id  text NOT NULL,
    type          text NOT NULL,
    sequence      bigint NOT NULL,
    occurred_at   timestamp with time zone DEFAULT now() NOT NULL,
    payload       jsonb NOT NULL,
    created_at    timestamp with time zone DEFAULT now() NOT NULL,
    trace_context jsonb,
    day           date DEFAULT dispatcher_today() NOT NULL,
    CONSTRAINT events_pkey PRIMARY KEY (workspace_id, id, day),
    CONSTRAINT events_workspace_id_sequence_day_key UNIQUE (workspace_id, sequence, day)
) PARTITION BY RANGE (day);

CREATE TABLE retired_owners (
    owner      text NOT NULL,
    retired_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT retired_owners_pkey PRIMARY KEY (owner)
);

CREATE TABLE events_before PARTITION OF events
    FOR VALUES FROM (MINVALUE) TO ('2000-01-02');

CREATE TABLE webhook_deliveries_before PARTITION OF webhook_deliveries
    FOR VALUES FROM (MINVALUE) TO ('274877906944') WITH (fillfactor=50);

CREATE TABLE webhook_delivery_attempts_before PARTITION OF webhook_delivery_attempts
    FOR VALUES FROM (MINVALUE) TO ('274877906944');

CREATE TABLE webhook_deliveries_default PARTITION OF webhook_deliveries
    DEFAULT WITH (fillfactor=50);

CREATE TABLE webhook_delivery_attempts_default PARTITION OF webhook_delivery_attempts
    DEFAULT;

CREATE TABLE events_default PARTITION OF events
    DEFAULT;

ALTER TABLE workspaces ADD CONSTRAINT workspaces_secret_not_empty CHECK ((secret <> ''::text)) NOT VALID;

ALTER SEQUENCE webhook_deliveries_id_seq OWNED BY webhook_deliveries.id;

ALTER SEQUENCE webhook_delivery_attempts_id_seq OWNED BY webhook_delivery_attempts.id;

CREATE INDEX webhook_endpoints_workspace ON public.webhook_endpoints USING btree (workspace_id) WHERE active;

CREATE INDEX api_replay_ledger_workspace ON public.api_replay_ledger USING btree (workspace_id, at);

CREATE INDEX api_replay_ledger_at ON public.api_replay_ledger USING btree (at);

CREATE INDEX api_tokens_workspace ON public.api_tokens USING btree (workspace_id, id);

CREATE INDEX api_audit_workspace ON public.api_audit USING btree (workspace_id, id);

CREATE INDEX api_audit_endpoint ON public.api_audit USING btree (endpoint_id, id) WHERE (endpoint_id IS NOT NULL);

CREATE UNIQUE INDEX webhook_endpoints_operational ON public.webhook_endpoints USING btree (workspace_id) WHERE (purpose = 'operational'::text);

CREATE INDEX breaker_notices_due ON public.breaker_notices USING btree (next_attempt_at) WHERE (sent_at IS NULL);

CREATE INDEX backlog_samples_taken ON public.backlog_samples USING btree (taken_at);

CREATE UNIQUE INDEX alert_episodes_open ON public.alert_episodes USING btree (alert) WHERE (cleared_at IS NULL);

CREATE INDEX alert_episodes_fired ON public.alert_episodes USING btree (fired_at);

CREATE INDEX contact_confirmations_due ON public.contact_confirmations USING btree (next_attempt_at) WHERE (sent_at IS NULL);

CREATE INDEX contact_confirmations_sent ON public.contact_confirmations USING btree (lower(address), sent_at) WHERE (sent_at IS NOT NULL);

CREATE INDEX breaker_notices_sent ON public.breaker_notices USING btree (lower(recipient), sent_at) WHERE (sent_at IS NOT NULL);

CREATE INDEX webhook_endpoints_paused ON public.webhook_endpoints USING btree (id) WHERE (paused_at IS NOT NULL);

CREATE INDEX endpoint_lifecycle_running ON public.endpoint_lifecycle USING btree (endpoint_id) WHERE (ended_at IS NULL);

CREATE INDEX replay_jobs_running ON public.replay_jobs USING btree (id) WHERE (state = 'running'::text);

CREATE INDEX webhook_deliveries_due ON public.webhook_deliveries USING btree (endpoint_id, next_attempt_at) WHERE (status = 'pending'::text);

CREATE INDEX webhook_deliveries_pending_age ON public.webhook_deliveries USING btree (next_attempt_at) WHERE (status = 'pending'::text);

CREATE INDEX webhook_deliveries_event ON public.webhook_deliveries USING btree (event_id);

CREATE INDEX webhook_deliveries_workspace ON public.webhook_deliveries USING btree (workspace_id, id);

CREATE INDEX webhook_deliveries_endpoint ON public.webhook_deliveries USING btree (endpoint_id, id);

CREATE INDEX webhook_deliveries_endpoint_failed ON public.webhook_deliveries USING btree (endpoint_id, created_at) WHERE (status = ANY (ARRAY['dead'::text, 'failed'::text]));

CREATE INDEX webhook_deliveries_created_brin ON public.webhook_deliveries USING brin (created_at);

CREATE INDEX webhook_deliveries_held ON public.webhook_deliveries USING btree (endpoint_id, created_at) WHERE (status = 'held'::text);

CREATE INDEX webhook_deliveries_event_day_brin ON public.webhook_deliveries USING brin (event_day);

CREATE INDEX webhook_delivery_attempts_delivery ON public.webhook_delivery_attempts USING btree (delivery_id, attempt);

CREATE INDEX webhook_delivery_attempts_started_brin ON public.webhook_delivery_attempts USING brin (started_at);

CREATE INDEX webhook_delivery_attempts_endpoint ON public.webhook_delivery_attempts USING btree (endpoint_id, started_at);

ALTER INDEX webhook_deliveries_before_endpoint_id_next_attempt_at_idx SET (deduplicate_items=off);

ALTER INDEX webhook_deliveries_default_endpoint_id_next_attempt_at_idx SET (deduplicate_items=off);

CREATE OR REPLACE FUNCTION public.dispatcher_claim_events(workspace_ids text[], event_ids text[], days date[])
 RETURNS TABLE(workspace_id text, event_id text, event_day date, ev events)
 LANGUAGE plpgsql
 STABLE
AS $function$
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
$function$;

CREATE TRIGGER webhook_endpoints_limit BEFORE INSERT OR UPDATE OF active, workspace_id ON webhook_endpoints FOR EACH ROW EXECUTE FUNCTION webhook_endpoints_limit();
