-- 0007: hardening (issue 13).

-- The region-wide replay budget (api.region_replays_per_hour) sums the last
-- hour of every workspace's spending: an index on the time alone finds that
-- hour without walking the per-workspace index.
CREATE INDEX api_replay_ledger_at ON api_replay_ledger (at);
