"""Fixtures shared by the engine-level fault tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from dispatcher_devtools.kit import SECRET
from dispatcher_devtools.receiver import ReceiverProcess


@pytest.fixture
def receiver() -> Iterator[ReceiverProcess]:
    """A real loopback receiver verifying the seeded workspace's signatures."""
    with ReceiverProcess(secrets=[SECRET]) as rx:
        yield rx
