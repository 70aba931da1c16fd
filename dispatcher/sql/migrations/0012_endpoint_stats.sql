-- 0012: the console overview's aggregate (issue 12, section 5).

-- GET /v2/webhooks/endpoints/stats reads each endpoint's attempts of the last
-- day (at most a week): without this index it has only the BRIN index on
-- started_at, which walks every workspace's attempts of the window, or the
-- (delivery_id, attempt) index, which does not lead with the endpoint.  The
-- included columns are everything the aggregate reads, so on this
-- append-only table (mostly all-visible) it is an index-only scan.
CREATE INDEX webhook_delivery_attempts_endpoint_time
    ON webhook_delivery_attempts (endpoint_id, started_at) INCLUDE (result, status_code, duration_ms);
