-- 0017: a secret of its own for every customer endpoint (docs/decisions.md,
-- "Own secret per endpoint").  Until now an endpoint the CLI's `endpoint add`
-- made, and every endpoint older than 0010, signed with its workspace's
-- secret, so a secret one receiver leaked forged deliveries to the others.
--
-- Each customer endpoint without a secret gets one here through the normal
-- rotation (api_rotate_endpoint_secret): the workspace secret it signed with
-- becomes its previous secret, and both sign every delivery for
-- secrets.rotation_grace from now (dispatcher_signing_secrets, 0010), so a
-- receiver verifying with the workspace secret keeps accepting.
--
-- Nobody has seen these secrets.  secret_shown says so (false) until a
-- rotation shows the endpoint's secret to someone (API, console, `endpoint
-- rotate-secret`), and that rotation keeps the previous secret -- the
-- workspace's, which the receiver verifies with -- instead of demoting the
-- unseen one (api_rotate_endpoint_secret).  Every other secret was shown
-- when it was set; an outside tool that writes one knows it.
--
-- The operational endpoint (0011) is the workspace's own notify webhook, not
-- the customer's to list or rotate; it keeps signing with the workspace secret.
--
-- The secret is 'whsec_' and the base64 of 30 random bytes: the 30 random hex
-- digits of each of two gen_random_uuid() values (pg_strong_random; version
-- and variant digits left out), so no extension is needed.
ALTER TABLE webhook_endpoints ADD COLUMN secret_shown boolean NOT NULL DEFAULT true;

CREATE FUNCTION pg_temp.dispatcher_random_secret() RETURNS text LANGUAGE sql VOLATILE AS $$
    SELECT 'whsec_' || encode(decode(string_agg(substr(u, 1, 12) || substr(u, 14, 3) || substr(u, 18, 15), ''),
                                     'hex'), 'base64')
      FROM (SELECT replace(gen_random_uuid()::text, '-', '') AS u FROM generate_series(1, 2)) uuids
$$;

UPDATE webhook_endpoints e
   SET secret = pg_temp.dispatcher_random_secret(), previous_secret = w.secret, secret_rotated_at = now(),
       secret_shown = false
  FROM workspaces w
 WHERE w.id = e.workspace_id AND e.secret IS NULL AND e.purpose = 'customer';

DROP FUNCTION pg_temp.dispatcher_random_secret();
