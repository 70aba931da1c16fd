-- 0007: hardening (issue 13).

-- The region-wide replay budget (api.region_replays_per_hour) sums the last
-- hour of every workspace's spending: an index on the time alone finds that
-- hour without walking the per-workspace index.
CREATE INDEX api_replay_ledger_at ON api_replay_ledger (at);

-- The region's upkeep leader (issue 13 item 5): a lease row instead of a
-- session advisory lock, which means nothing behind a transaction pooler
-- (PgBouncer pool_mode = transaction) where every worker "held" it.
CREATE TABLE region_leader (
    region text PRIMARY KEY,
    owner  text NOT NULL,
    until  timestamptz NOT NULL
);
