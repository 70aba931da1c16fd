"""A real primary and a streaming standby on loopback ports, for the failover
and read-replica tests and the failover benchmark.

The primary is a fresh ``initdb`` (``wal_level = replica``); the standby is a
``pg_basebackup -R`` of it, streaming.  With ``synchronous=True`` the primary
names the standby in ``synchronous_standby_names``: a COMMIT returns only once
the standby has flushed it, so nothing a producer saw committed can be lost
by a failover.  Both run the Debian Postgres binaries (``PG_BIN``, overridable
with ``DISPATCHER_PG_BIN``) as the ``postgres`` OS user when we are root
(Postgres refuses to run as root), with their sockets and data in one
temporary directory that is removed on exit, whatever happened.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Self

import psutil
import psycopg2
import psycopg2.extensions

from dispatcher_devtools.kit.database import query, run_autocommit
from dispatcher_devtools.kit.waiting import wait_until

PG_BIN = Path(os.environ.get("DISPATCHER_PG_BIN", "/usr/lib/postgresql/15/bin"))
BINARIES = ("initdb", "pg_ctl", "pg_basebackup", "postgres")
STANDBY_NAME = "standby"
DATABASE = "dispatcher"


class ReplicationUnavailable(RuntimeError):
    """A Postgres binary is missing, or the pair could not be started."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def dsn_for(port: int, dbname: str = DATABASE, **extra: Any) -> str:
    return psycopg2.extensions.make_dsn(host="127.0.0.1", port=port, user="postgres", dbname=dbname, **extra)


class PostgresNode:
    """One Postgres server of the pair: a data directory and a loopback port."""

    def __init__(self, name: str, root: Path, run_as: _RunAs) -> None:
        self.name = name
        self.data = root / name
        self.port = free_port()
        self._run_as = run_as

    @property
    def log_path(self) -> Path:
        return self.data.parent / f"{self.name}.log"

    def dsn(self, dbname: str = DATABASE, **extra: Any) -> str:
        return dsn_for(self.port, dbname, **extra)

    def pg_ctl(self, *args: str, check: bool = True, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        return self._run_as.run([str(PG_BIN / "pg_ctl"), "-D", str(self.data), *args], check=check, timeout=timeout)

    def start(self) -> None:
        self.pg_ctl("-w", "-t", "30", "-l", str(self.log_path), "start")

    def stop(self, mode: str = "immediate") -> None:
        """``pg_ctl stop -m MODE``; immediate is a crash: no checkpoint, sessions cut at once."""
        self.pg_ctl("-w", "-t", "30", "-m", mode, "stop")

    def kill(self) -> None:
        """Make sure no postmaster of this node is left (cleanup; never raises)."""
        try:
            pid: int | None = int((self.data / "postmaster.pid").read_text().splitlines()[0])
        except (OSError, ValueError, IndexError):
            pid = None
        with contextlib.suppress(Exception):
            self.pg_ctl("-w", "-t", "10", "-m", "immediate", "stop", check=False, timeout=20)
        if pid is not None and not _gone(pid, timeout=10):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
            _gone(pid, timeout=5)

    @contextlib.contextmanager
    def frozen(self) -> Iterator[None]:
        """The server's processes stopped (SIGSTOP) inside the block: a hung
        server, or a host gone silent, whose sessions hang rather than close
        (the kernel still holds the sockets).  Killed on the way out, as
        failover tooling fences an old primary: it never answers again."""
        pid = int((self.data / "postmaster.pid").read_text().splitlines()[0])
        processes = [psutil.Process(pid), *psutil.Process(pid).children()]
        for process in processes:
            process.suspend()
        try:
            yield
        finally:
            for process in processes:
                with contextlib.suppress(psutil.Error):
                    process.kill()

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"


def _gone(pid: int, timeout: float) -> bool:
    """Whether process ``pid`` has exited (a zombie counts as gone) within ``timeout`` seconds."""
    try:
        psutil.Process(pid).wait(timeout)
    except psutil.TimeoutExpired:
        return False
    except psutil.NoSuchProcess:
        pass
    return True


class _RunAs:
    """Runs commands as the ``postgres`` OS user when we are root, else as ourselves."""

    def __init__(self) -> None:
        self.account = pwd.getpwnam("postgres") if os.geteuid() == 0 else None

    def own(self, path: Path) -> None:
        if self.account is not None:
            os.chown(path, self.account.pw_uid, self.account.pw_gid)

    def run(self, command: list[str], check: bool = True, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        ids: dict[str, Any] = {}
        if self.account is not None:
            ids = {"user": self.account.pw_uid, "group": self.account.pw_gid, "extra_groups": []}
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False,
                                cwd="/", **ids)
        if check and result.returncode != 0:
            raise ReplicationUnavailable(f"{' '.join(command[:3])} ... failed ({result.returncode}):\n"
                                         f"{result.stdout[-2000:]}{result.stderr[-2000:]}")
        return result


PRIMARY_SETTINGS = """
listen_addresses = '127.0.0.1'
port = {port}
unix_socket_directories = '{sockets}'
wal_level = replica
max_wal_senders = 4
hot_standby = on
max_connections = 200
shared_buffers = 32MB
fsync = off
synchronous_commit = on
wal_sender_timeout = 5s
wal_receiver_status_interval = 1s
log_min_messages = warning
"""


class ReplicationPair:
    """``with ReplicationPair() as pair:`` a migrated primary and a streaming standby.

    ``pair.primary`` and ``pair.standby`` are :class:`PostgresNode`;
    :attr:`failover_dsn` names both (``target_session_attrs=read-write``), as a
    production DSN would.  Everything is stopped and removed on exit.
    """

    def __init__(self, synchronous: bool = True, migrate: bool = True) -> None:
        missing = [name for name in BINARIES if not (PG_BIN / name).exists()]
        if missing:
            raise ReplicationUnavailable(f"Postgres binaries missing in {PG_BIN}: {', '.join(missing)} "
                                         "(apt-get install postgresql-15, or set DISPATCHER_PG_BIN)")
        self.synchronous = synchronous
        self._migrate = migrate
        self._run_as = _RunAs()
        self.root = Path(tempfile.mkdtemp(prefix="dispatcher-replication-"))
        self._run_as.own(self.root)
        self.primary = PostgresNode("primary", self.root, self._run_as)
        self.standby = PostgresNode("standby", self.root, self._run_as)

    @property
    def failover_dsn(self) -> str:
        """Both servers, the writable one chosen at each connect (libpq multi-host syntax)."""
        # connect_timeout: a first host that accepts but never answers must not hold every connect.
        return (f"host=127.0.0.1,127.0.0.1 port={self.primary.port},{self.standby.port} user=postgres "
                f"dbname={DATABASE} target_session_attrs=read-write connect_timeout=2")

    def __enter__(self) -> Self:
        try:
            self._start_primary()
            self._start_standby()
            self.wait_streaming(synchronous=False)
            if self.synchronous:
                # Only now: with a synchronous standby named but not connected,
                # every commit (CREATE DATABASE, the migrations) would wait for it.
                run_autocommit(self.primary.dsn(), f"ALTER SYSTEM SET synchronous_standby_names = '{STANDBY_NAME}'",
                               "SELECT pg_reload_conf()")
                self.wait_streaming()
        except BaseException as exc:
            detail = f"\nprimary log:\n{self.primary.log_tail()}\nstandby log:\n{self.standby.log_tail()}"
            self.__exit__()
            if isinstance(exc, ReplicationUnavailable | psycopg2.Error | AssertionError):
                raise ReplicationUnavailable(f"the primary/standby pair did not start: {exc}{detail}") from exc
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.standby.kill()
        self.primary.kill()
        shutil.rmtree(self.root, ignore_errors=True)

    def _start_primary(self) -> None:
        self._run_as.run([str(PG_BIN / "initdb"), "-D", str(self.primary.data), "-U", "postgres", "--auth=trust",
                          "--no-sync", "-E", "UTF8", "--locale=C"])
        settings = PRIMARY_SETTINGS.format(port=self.primary.port, sockets=self.root)
        with open(self.primary.data / "postgresql.conf", "a", encoding="utf-8") as conf:
            conf.write(settings)
        self.primary.start()
        run_autocommit(self.primary.dsn("postgres"), f"CREATE DATABASE {DATABASE}")
        if self._migrate:
            from dispatcher import store

            conn = psycopg2.connect(self.primary.dsn())
            try:
                store.migrate(conn)
            finally:
                conn.close()

    def _start_standby(self) -> None:
        # The application name is what synchronous_standby_names matches.
        source = dsn_for(self.primary.port, "postgres", application_name=STANDBY_NAME)
        self._run_as.run([str(PG_BIN / "pg_basebackup"), "-D", str(self.standby.data), "-d", source, "-R",
                          "-X", "stream", "--no-sync", "-c", "fast"])
        with open(self.standby.data / "postgresql.conf", "a", encoding="utf-8") as conf:
            conf.write(f"\nport = {self.standby.port}\n")
        self.standby.start()

    def wait_streaming(self, timeout: float = 30.0, synchronous: bool | None = None) -> None:
        """Until the primary sees the standby streaming (and, if synchronous, as its sync standby)."""
        wanted = "sync" if (self.synchronous if synchronous is None else synchronous) else "async"

        def streaming() -> bool:
            rows = query(self.primary.dsn("postgres"), "SELECT state, sync_state FROM pg_stat_replication "
                                                      "WHERE application_name = %s", (STANDBY_NAME,))
            return rows == [("streaming", wanted)]

        wait_until(streaming, timeout=timeout, interval=0.1, message="the standby to stream from the primary")

    def promote(self) -> None:
        """``pg_ctl promote -w``: returns once the standby accepts writes."""
        self.standby.pg_ctl("-w", "-t", "30", "promote")

    def replay_paused(self) -> contextlib.AbstractContextManager[None]:
        """The standby stops applying WAL inside the block (it keeps receiving it)."""
        return _paused_replay(self.standby)

    def wait_replayed(self, timeout: float = 30.0) -> None:
        """Until the standby has applied everything the primary wrote so far."""
        (lsn,) = query(self.primary.dsn(), "SELECT pg_current_wal_lsn()::text")[0]
        wait_until(lambda: query(self.standby.dsn(), "SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn",
                                 (lsn,))[0][0], timeout=timeout, interval=0.05, message="the standby to catch up")


@contextlib.contextmanager
def _paused_replay(standby: PostgresNode) -> Any:
    query(standby.dsn(), "SELECT pg_wal_replay_pause()")
    wait_until(lambda: query(standby.dsn(), "SELECT pg_get_wal_replay_pause_state()")[0][0] == "paused",
               timeout=10, interval=0.05, message="replay to pause")
    try:
        yield
    finally:
        with contextlib.suppress(psycopg2.Error):
            query(standby.dsn(), "SELECT pg_wal_replay_resume()")


