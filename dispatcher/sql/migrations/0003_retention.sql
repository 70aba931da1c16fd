-- 0003: retention (docs/decisions.md, Q2). Pruning selects by age, and both tables are
-- appended in time order, so BRIN indexes on the insertion timestamps find
-- old rows for a few pages of index and almost no write cost -- unlike a
-- B-tree on finished_at, which every result write would have to maintain.
CREATE INDEX webhook_deliveries_created_brin ON webhook_deliveries USING brin (created_at);
CREATE INDEX webhook_delivery_attempts_started_brin ON webhook_delivery_attempts USING brin (started_at);
