"""Helpers for the fault tests (``tests/e2e/faults/``): a throwaway Postgres, the API
server process, database dumps, and a worker run in a gevent-patched child.

Everything here stays on loopback (or a Unix socket).  The pytest process never
imports gevent: :func:`run_poison_worker` is a target for ``green.py`` and
imports what it needs when it runs there.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import psycopg2

from dispatcher_devtools.kit import REPO, query

# --------------------------------------------------------------------------- database helpers

DISPATCHER_SESSIONS = ("SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                       "AND application_name LIKE 'dispatcher%%' AND pid <> pg_backend_pid()")


def terminate_dispatcher_sessions(dsn: str) -> int:
    """``pg_terminate_backend`` on every dispatcher session of this database; how many."""
    rows = query(dsn, f"SELECT count(pg_terminate_backend(pid)) FROM ({DISPATCHER_SESSIONS}) s")
    return int(rows[0][0])


def text_dump(dsn: str, exclude: tuple[str, ...] = ("workspaces",)) -> list[tuple[str, str, str]]:
    """Every text-like value (text, varchar, json, jsonb, arrays of them) of every
    table in ``public`` except ``exclude``: (table, column, value)."""
    columns = query(dsn, """
        SELECT table_name, column_name FROM information_schema.columns
         WHERE table_schema = 'public'
           AND (data_type IN ('text', 'character varying', 'character', 'json', 'jsonb')
                OR (data_type = 'ARRAY' AND udt_name IN ('_text', '_varchar')))
         ORDER BY table_name, ordinal_position""")
    out: list[tuple[str, str, str]] = []
    for table, column in columns:
        if table in exclude:
            continue
        for (value,) in query(dsn, f'SELECT "{column}"::text FROM "{table}" WHERE "{column}" IS NOT NULL'):
            out.append((table, column, value))
    return out


# --------------------------------------------------------------------------- a throwaway Postgres


class ThrowawayPostgres:
    """A private pgserver instance in a temporary directory, which a test may stop
    and start again (a real server restart) without touching the shared one."""

    def __init__(self) -> None:
        self.directory = Path(tempfile.mkdtemp(prefix="pgfault-"))
        self.pgdata = self.directory / "data"
        self._server: Any = None
        self.dsn = ""

    def __enter__(self) -> ThrowawayPostgres:
        import pgserver  # type: ignore[import-untyped]

        self._server = pgserver.get_server(self.pgdata, cleanup_mode=None)
        self.dsn = str(self._server.get_uri())
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self._pg_ctl("-m", "immediate", "stop", check=False)
        finally:
            shutil.rmtree(self.directory, ignore_errors=True)

    @property
    def socket_dir(self) -> str:
        match = re.search(r"host=([^&]+)", self.dsn)
        assert match, self.dsn
        return match.group(1)

    def _pg_ctl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[bytes]:
        import pgserver  # type: ignore[import-untyped]

        pg_ctl = Path(pgserver.__file__).parent / "pginstall" / "bin" / "pg_ctl"
        return subprocess.run([str(pg_ctl), "-D", str(self.pgdata), "-w", *args], user=self._server.system_user,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60, check=check)

    def stop(self) -> None:
        """A fast shutdown, as a restart by an operator or a failover does it: sessions are cut."""
        self._pg_ctl("-m", "fast", "stop")

    def start(self) -> None:
        """Start again with the options pgserver used (no TCP, the same socket directory)."""
        self._pg_ctl("-o", '-h ""', "-o", f"-k {self.socket_dir}", "-l", str(self.pgdata / "log"), "start")


# --------------------------------------------------------------------------- the API server process


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DISPATCHER_")}
    env["PYTHONPATH"] = str(REPO)
    return env


def cli(config: Path, *args: str, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dispatcher.cli", "-c", str(config), *args], capture_output=True,
                          text=True, timeout=timeout, cwd=REPO, env=_clean_env(), check=False)


def create_token(config: Path, workspace: str, scope: str = "webhooks:read,webhooks:write") -> str:
    result = cli(config, "token", "create", "--workspace", workspace, "--scope", scope)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().splitlines()[-1]


class ApiServer:
    """``python -m dispatcher.runtime.api_main -c CONFIG`` (``api.listen`` port 0) as a subprocess."""

    def __init__(self, config: Path) -> None:
        self.config = config
        self.lines: list[str] = []
        self.port = 0
        self.process: subprocess.Popen[str] | None = None

    def __enter__(self) -> ApiServer:
        self.process = subprocess.Popen([sys.executable, "-m", "dispatcher.runtime.api_main", "-c", str(self.config)],
                                        cwd=REPO, env=_clean_env(), stdout=subprocess.DEVNULL,
                                        stderr=subprocess.PIPE, text=True, start_new_session=True)
        ready = threading.Event()

        def read() -> None:
            assert self.process is not None and self.process.stderr is not None
            for line in self.process.stderr:
                self.lines.append(line)
                match = re.search(r"API listening on http://[^:]+:(\d+)", line)
                if match:
                    self.port = int(match.group(1))
                    ready.set()
            ready.set()

        threading.Thread(target=read, daemon=True).start()
        if not ready.wait(30) or not self.port:
            self.__exit__()
            raise AssertionError("the API did not start:\n" + "".join(self.lines))
        return self

    def __exit__(self, *exc: object) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)

    def request(self, method: str, path: str, token: str, body: Any = None) -> tuple[int, Any]:
        import json
        import urllib.error
        import urllib.request

        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=data, method=method,
                                         headers={"Authorization": f"Bearer {token}",
                                                  "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, json.loads(response.read() or b"null")
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read() or b"null")


# --------------------------------------------------------------------------- a poison row in a real worker


def run_poison_worker(config: str, dsn: str, poison_event_id: str, secret: str, expect_finished: int,
                      more_events: int, workspace: str, timeout: float = 20.0) -> dict[str, Any]:
    """``green.py`` target: run a real :class:`dispatcher.engine.worker.Worker` (claim loop,
    lanes, flusher) whose transport *raises* for one event, inside this patched process.

    Once the first ``expect_finished`` rows have all left ``pending``, ``more_events``
    further events are produced: the same worker must deliver them too.  The
    exception message carries ``secret``, so the caller can check that neither
    the log nor the row keeps it.
    """
    import io
    import logging

    import gevent

    from dispatcher.config import load_config
    from dispatcher.engine.delivery import DeliveryMaker, build_transport
    from dispatcher.engine.worker import Worker
    from dispatcher.producer import Event, WebhookSender

    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s %(message)s"))
    logging.getLogger().handlers[:] = [handler]
    logging.getLogger().setLevel(logging.INFO)

    cfg = load_config(config, env={})
    inner = build_transport(cfg)
    raised: list[str] = []

    class PoisonTransport:
        def post(self, url: str, headers: dict[str, str], body: bytes, workspace: str | None = None) -> Any:
            if headers.get("webhook-id") == poison_event_id:
                raised.append(poison_event_id)
                raise KeyError(f"cannot process this row (signing key {secret})")
            return inner.post(url, headers, body, workspace)

        def close(self) -> None:
            inner.close()

    maker = DeliveryMaker(PoisonTransport(), cfg.retry.retry_policies())  # type: ignore[arg-type]
    worker = Worker(cfg, dsn, "green:poison", maker=maker)
    runner = gevent.spawn(worker.run)

    def pending() -> int:
        conn = psycopg2.connect(dsn)
        try:
            with conn, conn.cursor() as cur:
                cur.execute("SELECT count(*) FILTER (WHERE status = 'pending'), count(*) FROM webhook_deliveries")
                waiting, total = cur.fetchone()
                return int(waiting) if total >= expect_finished else -1
        finally:
            conn.close()

    def wait_for(condition: Any) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not runner.dead:
            if condition():
                return True
            gevent.sleep(0.05)
        return False

    first_done = wait_for(lambda: pending() == 0)
    alive_after_poison = not runner.dead
    if first_done and more_events:
        sender = WebhookSender(cfg)
        conn = psycopg2.connect(dsn)
        try:
            with sender.transaction(conn) as tx:
                for n in range(more_events):
                    tx.send(Event(workspace, "job.created", {"after_poison": n}))
        finally:
            conn.close()
    second_done = first_done and wait_for(lambda: pending() == 0)
    alive_at_end = not runner.dead
    worker.stop()
    runner.join(timeout=10)
    return {"first_done": first_done, "second_done": second_done, "alive_after_poison": alive_after_poison,
            "alive_at_end": alive_at_end, "raised": len(raised), "log": stream.getvalue()}


# --------------------------------------------------------------------------- waiting with a diagnosis


def settle(dispatcher: Any, dsn: str, predicate: Any, message: str, timeout: float = 30.0) -> Any:
    """``wait_until`` that, at its bound, fails with the rows' state and the log's tail."""
    from dispatcher_devtools.kit import status_counts, wait_until

    try:
        return wait_until(predicate, timeout=timeout, message=message)
    except AssertionError as exc:
        pending = query(dsn, "SELECT endpoint_id, attempt, locked_by, last_error FROM webhook_deliveries "
                             "WHERE status = 'pending' ORDER BY id LIMIT 10")
        raise AssertionError(f"{exc}\nstatus counts: {status_counts(dsn)}\npending (first 10): {pending}\n"
                             f"log tail:\n{dispatcher.log()[-4000:]}") from None


def unread_answers(pid: int, port: int) -> int:
    """Bytes waiting unread in the receive queues of ``pid``'s TCP connections to ``port``.

    A stopped process reads nothing, so an answer to a request it had in flight when it was
    stopped waits in its socket: this is how a test tells a worker frozen mid-request from one
    frozen holding only queued rows (the kernel's table, /proc/net/tcp, has no owner column;
    psutil names the process's local ports)."""
    local = {c.laddr.port for c in psutil.Process(pid).net_connections(kind="tcp")
             if c.raddr and c.raddr.port == port}
    unread = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local_port, remote_port = int(fields[1].rsplit(":", 1)[1], 16), int(fields[2].rsplit(":", 1)[1], 16)
            if local_port in local and remote_port == port:
                unread += int(fields[4].split(":")[1], 16)
    return unread


# --------------------------------------------------------------------------- a hot lane held, then handed on


def run_hot_lane_workers(config: str, dsn: str, total: int, hand_on_after: int, timeout: float = 60.0
                         ) -> dict[str, Any]:
    """``green.py`` target: two real :class:`dispatcher.engine.worker.Worker` s (owners ``green:a`` and
    ``green:b``, two processes as far as the region's ledger knows) on one hot endpoint.

    ``a`` runs alone until ``hand_on_after`` rows are delivered, then ``b`` starts and ``a`` stops:
    ``a`` must have kept its lane's slots from claim to claim, and hands them on when it stops.
    Returns, per worker, the rows it claimed and how many of them took a slot, and the ledger left.
    """
    import gevent

    from dispatcher.config import load_config
    from dispatcher.engine.worker import Worker

    cfg = load_config(config, env={})
    counts: dict[str, dict[str, int]] = {}

    def counted(owner: str) -> Worker:
        worker = Worker(cfg, dsn, owner)
        tally = counts[owner] = {"rows": 0, "slots": 0}
        claim = worker._claims.claim

        def claim_and_count(*args: Any, **kwargs: Any) -> Any:
            rows = claim(*args, **kwargs)
            tally["rows"] += len(rows)
            tally["slots"] += sum(1 for row in rows if row.grants_slot)
            return rows

        worker._claims.claim = claim_and_count  # type: ignore[method-assign]
        return worker

    def wait_for(count: int) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if _delivered(dsn) >= count:
                return True
            gevent.sleep(0.05)
        return False

    first, second = counted("green:a"), counted("green:b")
    running = gevent.spawn(first.run)
    first_part = wait_for(hand_on_after)
    held_by_a = _ledger(dsn)
    later = gevent.spawn(second.run)
    first.stop()
    running.join(timeout=30)
    all_done = wait_for(total)
    second.stop()
    later.join(timeout=30)
    return {"first_part": first_part, "all_done": all_done, "counts": counts, "held_by_a": held_by_a,
            "ledger_after": _ledger(dsn)}


def run_lone_worker(config: str, dsn: str, total: int, timeout: float = 90.0) -> dict[str, Any]:
    """``green.py`` target: one real :class:`dispatcher.engine.worker.Worker` (owner ``green:a``) of a region
    configured for more processes, none of which runs, on one hot endpoint.  Returns whether all ``total``
    rows were delivered and the most slots the ledger showed it holding at once."""
    import gevent

    from dispatcher.config import load_config
    from dispatcher.engine.worker import Worker

    worker = Worker(load_config(config, env={}), dsn, "green:a")
    running = gevent.spawn(worker.run)
    most, deadline, done = 0, time.monotonic() + timeout, False
    while time.monotonic() < deadline and not done:
        most = max([most, *(held for _, held in _ledger(dsn))])
        done = _delivered(dsn) >= total
        gevent.sleep(0.05)
    worker.stop()
    running.join(timeout=30)
    return {"all_done": done, "most_held": most, "ledger_after": _ledger(dsn)}


def _delivered(dsn: str) -> int:
    conn = psycopg2.connect(dsn)
    try:
        with conn, conn.cursor() as cur:
            cur.execute("SELECT count(*) FROM webhook_deliveries WHERE status = 'delivered'")
            return int(cur.fetchone()[0])
    finally:
        conn.close()


def _ledger(dsn: str) -> list[list[Any]]:
    conn = psycopg2.connect(dsn)
    try:
        with conn, conn.cursor() as cur:
            cur.execute("SELECT owner, sum(leased)::int FROM endpoint_leases WHERE until > now() "
                        "GROUP BY owner ORDER BY owner")
            return [list(row) for row in cur.fetchall()]
    finally:
        conn.close()


# ------------------------------------------------------------- a slow row does not hold its lane's other slots


def run_one_slow_row_worker(config: str, dsn: str, slow_event_id: str, total: int, timeout: float = 30.0
                            ) -> dict[str, Any]:
    """``green.py`` target: a real :class:`dispatcher.engine.worker.Worker` whose transport holds the
    POST of ``slow_event_id`` until every other row of the endpoint is delivered (or ``timeout``).

    With per-endpoint concurrency 2 and one slot held by the slow row, the other slot must keep
    turning: its rows are delivered while the slow one is still in flight.
    """
    import gevent
    import gevent.event

    from dispatcher.config import load_config
    from dispatcher.engine.delivery import DeliveryMaker, build_transport
    from dispatcher.engine.worker import Worker

    cfg = load_config(config, env={})
    inner = build_transport(cfg)
    others_done = gevent.event.Event()

    class SlowOneTransport:
        def post(self, url: str, headers: dict[str, str], body: bytes, workspace: str | None = None) -> Any:
            if headers.get("webhook-id") == slow_event_id:
                others_done.wait(timeout)
            return inner.post(url, headers, body, workspace)

        def close(self) -> None:
            inner.close()

    worker = Worker(cfg, dsn, "green:slow", maker=DeliveryMaker(SlowOneTransport(),  # type: ignore[arg-type]
                                                                cfg.retry.retry_policies()))
    runner = gevent.spawn(worker.run)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and _delivered(dsn) < total - 1:
        gevent.sleep(0.05)
    others_before_slow = _delivered(dsn)
    others_done.set()
    while time.monotonic() < deadline + 10 and _delivered(dsn) < total:
        gevent.sleep(0.05)
    worker.stop()
    runner.join(timeout=30)
    return {"others_before_slow": others_before_slow, "all": _delivered(dsn)}


def resolve_while_a_workspace_is_refused(dns_port: int) -> dict[str, Any]:
    """Workspace ``attacker`` (one lookup slot, held by ``hold.slow.test``) and ``victim`` ask for the same
    name at once; the attacker's turn is refused.  What each workspace got, and the victim once more."""
    import gevent

    from dispatcher.outbound.netguard import DnsError
    from dispatcher.outbound.resolver import DnsResolver

    resolver = DnsResolver([f"127.0.0.1:{dns_port}"], timeout=1.0, per_workspace=1, hosts={})

    def ask(host: str, workspace: str) -> Any:
        try:
            return resolver.resolve(host, workspace)
        except DnsError as exc:
            return f"DnsError: {exc}"

    # Each spawn runs up to its first wait before the next one starts: the slot holder's
    # lookup, then the attacker waiting for its slot, then the victim.
    holder = gevent.spawn(ask, "hold.slow.test", "attacker")
    gevent.sleep(0)
    attacker = gevent.spawn(ask, "shared.lit.test", "attacker")
    gevent.sleep(0)
    victim = gevent.spawn(ask, "shared.lit.test", "victim")
    gevent.joinall([holder, attacker, victim])
    return {"holder": holder.value, "attacker": attacker.value, "victim": victim.value,
            "victim_again": ask("shared.lit.test", "victim")}
