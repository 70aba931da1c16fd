-- 0024: a region's last clean stop, so status can tell a stopped fleet from one that never ran.
--
-- A worker that stops gracefully removes its dispatcher_processes row, so a
-- region whose supervisors had all stopped cleanly looked exactly like one
-- that had never run ("no dispatcher worker has ever recorded a heartbeat").
-- A supervisor that stops (TERM, INT or QUIT, or a halt) removes its workers'
-- rows and writes here when, how and which one it was; the health rule
-- (dispatcher/rules/health.py FleetRule) reports it when no worker is left.

CREATE TABLE fleet_stops (
    region     text PRIMARY KEY,
    stopped_at timestamptz NOT NULL DEFAULT now(),
    how        text NOT NULL,
    host       text NOT NULL,
    pid        integer NOT NULL
);
