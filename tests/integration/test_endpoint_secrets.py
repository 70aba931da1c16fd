"""Every endpoint signs with a secret of its own (docs/decisions.md, "Own secret per
endpoint"), so a secret one receiver leaks cannot forge deliveries to another.

* Registering an endpoint (the store's one path: the API, the CLI's ``endpoint
  add``, the demo) needs a secret of its own with at least 24 key bytes.
* Migration 0017 gives every customer endpoint that had none its own through the
  normal rotation: the workspace secret it signed with becomes its previous
  secret, and both sign every delivery for ``secrets.rotation_grace``.
* Nobody has seen a secret the migration made, so the rotation that shows the
  customer one keeps the workspace secret (what the receiver verifies with) as
  the previous secret, rather than the unseen one.

The signing secrets are read through ``dispatcher_signing_secrets`` (0010), the
rule the claim and the flag-off path both sign by.
"""

from __future__ import annotations

from typing import Any

import pytest

from dispatcher import store
from dispatcher.signing import SECRET_PREFIX, WeakSecret, new_secret, secret_key
from dispatcher.store import endpoints as endpoint_store
from tests.conftest import TestDatabase as Database

OWN_SECRET = 17           # the migration under test
W1 = "whsec_" + "d29ya3NwYWNlLW9uZS1zZWNyZXQtYnl0ZXMtMzI="   # the workspaces' secrets
W2 = "plain-legacy-workspace-secret"
GRACE = 86400.0           # secrets.rotation_grace


def _migrate_before(db: Database, version: int) -> None:
    """Apply every shipped migration older than ``version``, as a database of that age has them."""
    conn = db.connect()
    try:
        with conn, conn.cursor() as cur:
            cur.execute(store.QUERIES["migrations_table"])
            for migration in store.migrations():
                if migration.version < version:
                    cur.execute(migration.sql)
                    cur.execute(store.QUERIES["record_migration"],
                                {"version": migration.version, "name": migration.name})
    finally:
        conn.close()


def _endpoint(db: Database, workspace: str, url: str, **columns: Any) -> int:
    names = ["workspace_id", "url", *columns]
    values = [workspace, url, *columns.values()]
    sql = f"INSERT INTO webhook_endpoints ({', '.join(names)}) VALUES ({', '.join(['%s'] * len(names))}) RETURNING id"
    return int(db.query(sql, values)[0][0])


def _signing(db: Database, endpoint_id: int, grace: float = GRACE) -> list[str | None]:
    """The secrets a delivery to the endpoint is signed with now: [current, previous or None]."""
    return db.query("SELECT dispatcher_signing_secrets(e.secret, e.previous_secret, e.secret_rotated_at, w.secret, "
                    "w.previous_secret, w.secret_rotated_at, %s) FROM webhook_endpoints e "
                    "JOIN workspaces w ON w.id = e.workspace_id WHERE e.id = %s", (grace, endpoint_id))[0][0]


@pytest.fixture
def before_0017(empty_db: Database) -> dict[str, int]:
    """A database migrated up to 0016, with the endpoints such a region has; their ids by name."""
    _migrate_before(empty_db, OWN_SECRET)
    empty_db.query("INSERT INTO workspaces (id, secret) VALUES ('ws1', %s), ('ws2', %s)", (W1, W2))
    own = new_secret()
    ids = {
        "added": _endpoint(empty_db, "ws1", "http://127.0.0.1:9/a"),
        "added too": _endpoint(empty_db, "ws1", "http://127.0.0.1:9/b"),
        "inactive": _endpoint(empty_db, "ws2", "http://127.0.0.1:9/c", active=False),
        "own": _endpoint(empty_db, "ws1", "http://127.0.0.1:9/d", secret=own),
        "operational": _endpoint(empty_db, "ws1", "http://127.0.0.1:9/notify", purpose="operational"),
    }
    empty_db.query("UPDATE webhook_endpoints SET secret_rotated_at = now() - interval '3 days', "
                   "previous_secret = 'whsec_b2xkZXItb3duLXNlY3JldC1ieXRlcy0zMg==' WHERE id = %s", (ids["own"],))
    return ids


def _run_migrations(db: Database) -> list[int]:
    conn = store.connect(db.dsn)
    try:
        return store.migrate(conn)
    finally:
        conn.close()


def test_the_migration_gives_each_customer_endpoint_its_own_secret_through_a_rotation(
        empty_db: Database, before_0017: dict[str, int]) -> None:
    own_before = empty_db.query("SELECT secret, previous_secret, secret_rotated_at FROM webhook_endpoints "
                                "WHERE id = %s", (before_0017["own"],))
    assert OWN_SECRET in _run_migrations(empty_db)
    rows = {row[0]: row[1:] for row in empty_db.query(
        "SELECT id, secret, previous_secret, now() - secret_rotated_at < interval '1 minute' FROM webhook_endpoints")}
    made = {}
    for name, workspace_secret in (("added", W1), ("added too", W1), ("inactive", W2)):
        secret, previous, rotated_now = rows[before_0017[name]]
        assert secret is not None and secret.startswith(SECRET_PREFIX), name
        assert len(secret_key(secret)) >= 24, name
        assert (previous, rotated_now) == (workspace_secret, True), name
        # Both sign during the grace: a receiver verifying with the workspace secret keeps accepting.
        assert _signing(empty_db, before_0017[name]) == [secret, workspace_secret]
        assert _signing(empty_db, before_0017[name], grace=0.0) == [secret, None]
        made[name] = secret
    assert len(set(made.values())) == 3, "each endpoint a secret of its own"
    assert empty_db.query("SELECT secret, previous_secret, secret_rotated_at FROM webhook_endpoints "
                          "WHERE id = %s", (before_0017["own"],)) == own_before
    # The operational endpoint is the workspace's own notify webhook: it signs with the workspace secret.
    assert rows[before_0017["operational"]][0] is None
    assert _signing(empty_db, before_0017["operational"]) == [W1, None]


@pytest.mark.parametrize("late", [False, True], ids=["inside-the-grace", "after-the-grace"])
def test_the_rotation_that_shows_a_migrated_secret_keeps_the_workspace_secret_signing(
        empty_db: Database, before_0017: dict[str, int], late: bool) -> None:
    _run_migrations(empty_db)
    endpoint_id = before_0017["added"]
    if late:
        # Past the grace only the unseen secret signs: a receiver that never took its own
        # fails until the customer rotates, which brings the workspace secret back.
        empty_db.query("UPDATE webhook_endpoints SET secret_rotated_at = now() - interval '25 hours'")
        assert _signing(empty_db, endpoint_id)[1] is None
    conn = store.connect(empty_db.dsn)
    try:
        first, second = new_secret(), new_secret()
        endpoint_store.rotate_endpoint_secret(conn, None, endpoint_id, first, GRACE, token_id=None)
        assert _signing(empty_db, endpoint_id) == [first, W1], "the receiver still verifies with the workspace's"
        # A shown secret is one a receiver may use: the next rotation keeps it, as every rotation does.
        endpoint_store.rotate_endpoint_secret(conn, None, endpoint_id, second, GRACE, token_id=None)
        assert _signing(empty_db, endpoint_id) == [second, first]
    finally:
        conn.close()


def test_registering_an_endpoint_takes_a_usable_secret_of_its_own(db: Database) -> None:
    db.query("INSERT INTO workspaces (id, secret) VALUES ('ws', %s)", (W1,))
    conn = store.connect(db.dsn)
    try:
        for weak in ("whsec_", "whsec_c2hvcnQ=", "short", ""):
            with pytest.raises(WeakSecret):
                store.add_endpoint(conn, "ws", "http://127.0.0.1:9/a", [], weak)
        assert db.query("SELECT count(*) FROM webhook_endpoints") == [(0,)]
        secret = new_secret()
        endpoint_id = store.add_endpoint(conn, "ws", "http://127.0.0.1:9/a", [], secret)
    finally:
        conn.close()
    assert _signing(db, endpoint_id) == [secret, None], "its own secret, never the workspace's"
