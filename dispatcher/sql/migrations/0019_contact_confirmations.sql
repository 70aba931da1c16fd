-- 0019: owner contacts are confirmed by a mailed link before any notice goes
-- to them (issue 23 item 6), and mails are counted per recipient.
--
-- Before it a customer could name any address as an owner contact and make
-- the operator's relay mail it.  Now a contact in use (an endpoint's or a
-- workspace's owner_contact) gets one row here per workspace, found by the
-- notifier (notices_contacts_discover), which mails it a link once; the API's
-- confirm route sets confirmed_at.  Until then its notices go to the
-- workspace's confirmed owner, else the operator.  A contact no longer in use
-- loses its row: named again, it is asked again.  Contacts named before this
-- migration are unconfirmed too: they are asked on the notifier's next round.
CREATE TABLE contact_confirmations (
    workspace_id    text NOT NULL REFERENCES workspaces (id) ON DELETE CASCADE,
    address         text NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    -- The mail's retry state, as in breaker_notices: claimed by moving
    -- next_attempt_at past a lease, ended by sent_at or by next_attempt_at NULL.
    attempts        int NOT NULL DEFAULT 0,
    next_attempt_at timestamptz DEFAULT now(),
    sent_at         timestamptz,
    last_error      text,
    -- SHA-256 (hex) of the token in the mailed link; the token itself is never stored.
    token_hash      text UNIQUE,
    confirmed_at    timestamptz,
    PRIMARY KEY (workspace_id, address)
);
CREATE INDEX contact_confirmations_due ON contact_confirmations (next_attempt_at) WHERE sent_at IS NULL;

-- notifier.mails_per_recipient_hour counts the mails sent to an address in the
-- last hour, notices and confirmations alike, by these.
CREATE INDEX contact_confirmations_sent ON contact_confirmations (lower(address), sent_at)
    WHERE sent_at IS NOT NULL;
CREATE INDEX breaker_notices_sent ON breaker_notices (lower(recipient), sent_at) WHERE sent_at IS NOT NULL;
