"""The unit tier: pure code, no database.

A unit test that asks for a database (``db``, ``empty_db``, the server's DSN)
fails at once instead of starting the embedded server: it belongs in
``tests/integration`` or ``tests/e2e``.
"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def pg_server_dsn() -> str:
    pytest.fail("a unit test asked for a database: move it to tests/integration or tests/e2e", pytrace=False)
