-- 0012: the console overview's aggregate (issue 12, section 5).

-- GET /v2/webhooks/endpoints/stats reads each endpoint's attempts of the last
-- day (at most a week), and the endpoint list its last 24 h.  The included
-- columns are everything both read, so on this append-only table (mostly
-- all-visible) each is an index-only scan: measured on 600 k attempts, the
-- stats of a workspace with 44 k attempts in the day read 582 buffers instead
-- of 10.8 k through the same index without them (docs/api.md).  It replaces
-- 0010's (endpoint_id, started_at) index, which it covers: keeping both would
-- cost a second entry per attempt for nothing.
DROP INDEX IF EXISTS webhook_delivery_attempts_endpoint;
CREATE INDEX webhook_delivery_attempts_endpoint_time
    ON webhook_delivery_attempts (endpoint_id, started_at) INCLUDE (result, status_code, duration_ms);
