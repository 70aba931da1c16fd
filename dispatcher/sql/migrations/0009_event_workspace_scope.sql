-- 0009: event ids are unique per workspace, not globally (issue 13 item 2,
-- docs/decisions.md, Limits).  Until now events.id alone was the primary key: the
-- same caller-supplied id in a second workspace was a unique violation that
-- aborted that producer's whole transaction.  The key becomes
-- (workspace_id, id), and every lookup of an event -- the claim, the API,
-- rollout checks, the expiry sweep -- names the workspace as well as the id.
-- webhook_deliveries already carries (workspace_id, event_id); it has never
-- had a foreign key to events (0001) and gets none now.  Writers that say
-- ON CONFLICT (id) on events must now say ON CONFLICT (workspace_id, id).
--
-- Cost on a populated table.  Migrations run in one transaction, so the
-- index cannot be built CONCURRENTLY; it is built first, under a SHARE lock
-- (reads go on -- claims, the API -- while producers' inserts wait), and
-- only the swap of the key takes ACCESS EXCLUSIVE, which is held to the
-- commit, a moment later.  No table rewrite and no NOT NULL scan (both
-- columns already are).  Measured: 1.07 s for 1,000,000 events (uuid ids,
-- 263 MB) on a shared 2-core test machine; docs/operations.md, "Upgrading".
CREATE UNIQUE INDEX events_workspace_event ON events (workspace_id, id);
ALTER TABLE events
    DROP CONSTRAINT events_pkey,
    ADD CONSTRAINT events_pkey PRIMARY KEY USING INDEX events_workspace_event;
