"""Stopping an embedded (pgserver) server that a test started."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


def stop(data_dir: Path) -> None:
    """Stop the server if it runs (pg_ctl as the user pgserver runs it as)."""
    if not (data_dir / "postmaster.pid").exists():
        return
    import pgserver  # type: ignore[import-untyped]

    user = "pgserver" if os.geteuid() == 0 else None
    try:
        pgserver.pg_ctl(["-w", "-m", "fast", "stop"], pgdata=str(data_dir), user=user,  # type: ignore[attr-defined]
                        timeout=60)
    except subprocess.CalledProcessError:
        pass  # already stopped
