"""Stopping an embedded (pgserver) server that a test started."""

from __future__ import annotations

from pathlib import Path

from dispatcher.runtime.embedded import stop_embedded


def stop(data_dir: Path) -> None:
    """Stop the server if it runs: the product's own `dispatcher embedded stop`."""
    stop_embedded(data_dir)
