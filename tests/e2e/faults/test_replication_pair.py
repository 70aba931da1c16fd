"""The kit's primary + standby pair cleans up after itself, whatever happens in its block."""

from __future__ import annotations

import psutil
import pytest

from dispatcher_devtools.kit import ReplicationPair, query


def _postmaster(pid_file: str) -> int:
    with open(pid_file, encoding="utf-8") as file:
        return int(file.readline())


def test_a_failing_block_still_stops_both_servers_and_removes_their_data() -> None:
    with pytest.raises(RuntimeError, match="the test failed"):
        with ReplicationPair(synchronous=True, migrate=False) as pair:
            assert query(pair.standby.dsn(), "SELECT pg_is_in_recovery()") == [(True,)]
            root = pair.root
            pids = [_postmaster(str(node.data / "postmaster.pid")) for node in (pair.primary, pair.standby)]
            raise RuntimeError("the test failed")
    assert not root.exists()
    assert not [pid for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]
