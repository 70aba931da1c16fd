"""Another version of the code, from the checkout's git history, to run beside this one.

An online migration is run by the new version's ``dispatcher migrate`` while the previous
version's dispatchers keep draining (they boot only on a schema with every migration they
ship, so they cannot be this checkout's code).  :func:`export_revision` writes the tree of
an older commit into a directory; :class:`~dispatcher_devtools.kit.runner.Dispatcher` runs
the engine found there (``repo=``).
"""

from __future__ import annotations

import io
import shutil
import subprocess
import tarfile
from pathlib import Path


class RevisionUnavailable(RuntimeError):
    """The checkout has no git history holding the revision (a source tarball, a shallow clone)."""


def has_history(repo: Path) -> bool:
    """Whether ``repo`` is a git checkout and git is installed."""
    return shutil.which("git") is not None and (repo / ".git").exists()


def export_revision(repo: Path, revision: str, into: Path, paths: tuple[str, ...] = ("dispatcher", "bin")) -> Path:
    """Write ``paths`` of ``revision``'s tree under ``into`` (created); returns ``into``."""
    if not has_history(repo):
        raise RevisionUnavailable(f"{repo} is not a git checkout (or git is missing): cannot read {revision}")
    done = subprocess.run(["git", "-C", str(repo), "archive", "--format=tar", revision, *paths],
                          capture_output=True, check=False)
    if done.returncode != 0:
        message = done.stderr.decode("utf-8", "replace").strip().splitlines() or ["git archive failed"]
        raise RevisionUnavailable(f"revision {revision} is not in {repo}'s history: {message[0]}")
    into.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(done.stdout)) as archive:
        archive.extractall(into, filter="data")
    return into
