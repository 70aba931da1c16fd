-- 0016: what the rollout gates read that nothing recorded before (docs/rollout.md).
--
-- The upkeep leader measures the backlog every alerts.check_interval and
-- evaluates the backlog alert (dispatcher/engine/upkeep.py), but kept neither:
-- the gauge went to statsd and the alert to a log line.  A gate then could not
-- say what the backlog age was at every moment of its window, nor tell a quiet
-- week from a week nobody watched, nor count alerts.

-- One row per upkeep round: the figures of engine_backlog as the round
-- measured them.  Consecutive rows are at most alerts.leader_age apart while a
-- leader runs, so a longer gap is a stretch nobody measured.
CREATE TABLE backlog_samples (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    taken_at     timestamptz NOT NULL DEFAULT now(),
    oldest_age   double precision,    -- webhook_backlog_age_seconds; NULL: no row was due
    overdue_rows integer NOT NULL,
    held_rows    integer NOT NULL,
    alerting     boolean NOT NULL     -- the backlog alert fired this round
);
CREATE INDEX backlog_samples_taken ON backlog_samples (taken_at);

-- One row per alert episode: from the round that fired it to the round that
-- found it cleared.  At most one open episode per alert, whichever process
-- holds the lease when it fires or clears.
CREATE TABLE alert_episodes (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    alert      text NOT NULL CHECK (alert IN ('backlog')),
    fired_at   timestamptz NOT NULL DEFAULT now(),
    cleared_at timestamptz,
    detail     text NOT NULL
);
CREATE UNIQUE INDEX alert_episodes_open ON alert_episodes (alert) WHERE cleared_at IS NULL;
CREATE INDEX alert_episodes_fired ON alert_episodes (fired_at);
