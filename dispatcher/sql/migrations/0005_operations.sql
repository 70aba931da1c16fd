-- 0005: operations (issue 11).  One row per dispatcher worker process, so
-- that `dispatcher status` and `dispatcher check` read the fleet from the
-- database -- and `check` still sees it when every dispatcher is dead.
--
-- Each worker upserts its own row every `workers.status_interval` from a
-- greenlet of its own (never the claim/send/record path); the upkeep leader
-- stamps leader_at at the start of every round, and prunes rows silent for a
-- day.  Rows are updated in place every few seconds: no index covers the
-- updated columns and the fillfactor leaves room, so every update is HOT.
CREATE TABLE dispatcher_processes (
    owner        text PRIMARY KEY,                 -- host:supervisor_pid:wN, as in locked_by
    region       text NOT NULL,
    host         text NOT NULL,
    pid          integer NOT NULL,
    started_at   timestamptz NOT NULL,
    heartbeat_at timestamptz NOT NULL DEFAULT now(),
    in_flight    integer NOT NULL DEFAULT 0,       -- deliveries held (queued + sending) at the last beat
    leader_at    timestamptz                       -- last upkeep round this process ran as the region's leader
) WITH (fillfactor = 50);
