"""What every scenario needs: a throw-away database, seeding, the real
dispatcher as a subprocess, a statsd sink, CPU accounting and percentiles.

Nothing here is gevent-patched: the harness is a plain process that drives
subprocesses (dispatcher, receiver, bare-loop workers) and measures them.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import psutil
import psycopg2
import psycopg2.extensions

from benchmarks.nginx import NginxReceiver
from dispatcher_devtools.kit import (
    SECRET,
    Database,
    Dispatcher,
    WaitTimeout,
    bench_config,
    process_tree,
    scratch_database,
    wait_until,
    write_config,
)
from dispatcher_devtools.receiver import ReceiverProcess

REPO = Path(__file__).resolve().parent.parent
_WORKER_STARTED = re.compile(r" worker (\S+) started \(client=")
_FENCE_WARNING = re.compile(r"(\d+) stale results rejected by the claim-token fence")
DEFAULT_SERVER_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"


def server_dsn() -> str:
    return os.environ.get("BENCH_PG_DSN", DEFAULT_SERVER_DSN)


# --------------------------------------------------------------------------- statistics


def percentile(values: Sequence[float], p: float) -> float | None:
    """Nearest-rank percentile (p in 0..100) of ``values``; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, int(round(p / 100.0 * len(ordered) + 0.5)) - 1))
    return ordered[rank]


def summary_ms(seconds: Sequence[float]) -> dict[str, float | int | None]:
    """p50/p90/p99/max in milliseconds of a list of durations in seconds."""
    def ms(value: float | None) -> float | None:
        return None if value is None else round(value * 1000.0, 2)

    return {"n": len(seconds), "p50_ms": ms(percentile(seconds, 50)), "p90_ms": ms(percentile(seconds, 90)),
            "p99_ms": ms(percentile(seconds, 99)), "max_ms": ms(max(seconds) if seconds else None)}


def paired_order(pairs: int, labels: tuple[str, str]) -> list[str]:
    """``pairs`` adjacent pairs of the two labels, alternating which goes first: a, b, b, a, a, b, ...
    A drift of the machine then weighs on both sides alike, and each pair's two runs share its phase."""
    first, second = labels
    return [label for pair in range(pairs) for label in ((first, second) if pair % 2 == 0 else (second, first))]


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def machine() -> dict[str, Any]:
    conn = psycopg2.connect(server_dsn())
    try:
        with conn.cursor() as cur:
            cur.execute("SHOW server_version")
            version = cur.fetchone()[0]
            cur.execute("SELECT name, setting FROM pg_settings WHERE name IN ('shared_buffers', "
                        "'synchronous_commit', 'autovacuum', 'autovacuum_naptime', 'autovacuum_vacuum_scale_factor', "
                        "'fsync')")
            settings = dict(cur.fetchall())
    finally:
        conn.close()
    memory = psutil.virtual_memory().total
    return {"cpus": os.cpu_count(), "memory_gib": round(memory / 2**30, 1), "python": sys.version.split()[0],
            "postgres": version, "postgres_settings": settings, "load_average": load_average()}


def server_setting(name: str) -> str:
    """One setting of the benchmark server as ``SHOW`` prints it (``shared_buffers``: ``128MB``)."""
    conn = psycopg2.connect(server_dsn())
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT current_setting(%s)", (name,))
            row = cur.fetchone()
            return str(row[0]) if row else "unknown"
    finally:
        conn.close()


# --------------------------------------------------------------------------- database


def bench_database(label: str) -> contextlib.AbstractContextManager[Database]:
    """A fresh migrated database for one scenario, dropped on exit (a killed run's leftover first):
    a clone of this process's migrated template (``migrated_template``)."""
    server = server_dsn()
    return scratch_database(server, f"bench_{label}_{os.getpid()}", template=migrated_template(server),
                            replace=True, quiet_drop=True, application_name="benchmark harness")


_TEMPLATES: dict[str, str] = {}
_TEMPLATE_DROPS = contextlib.ExitStack()
atexit.register(_TEMPLATE_DROPS.close)


def migrated_template(server: str) -> str:
    """The name of a database on ``server`` migrated once per process, dropped at exit.  A
    scenario's database is a clone of it: migrating one from scratch took 1.3-2 s on a 2-vCPU
    host, a clone 0.06 s, and a full run and the smoke tier make dozens (docs/benchmarks.md,
    "How to run")."""
    name = _TEMPLATES.get(server)
    if name is None:
        name = f"bench_template_{os.getpid()}"
        _TEMPLATE_DROPS.enter_context(scratch_database(server, name, migrate=True, replace=True, quiet_drop=True,
                                                       application_name="benchmark harness"))
        _TEMPLATES[server] = name
    return name


def insert_backlog(cur: Any, workspaces: int, events: int, payload_bytes: int, first_event: int = 0,
                   due_in: float = 0.0, workspace_offset: int = 0, traced: bool = False) -> int:
    """Insert ``events`` events spread over ``ws<o>..ws<o+workspaces-1>`` (``o``: ``workspace_offset``)
    and one pending delivery per (event, active endpoint of its workspace), set-based; returns the
    deliveries inserted.  ``traced``: each event carries a producer's W3C trace context, sampled,
    as send() stores it inside a traced request (migration 0022).

    Runs on the caller's cursor so the caller decides when the rows become visible (commit).
    """
    cur.execute(
        """
        INSERT INTO events (id, workspace_id, type, sequence, payload, trace_context)
        SELECT 'evt-' || g, 'ws' || (%(offset)s + g %% %(workspaces)s), 'job.created', g,
               jsonb_build_object('job', 'j-' || g, 'n', g, 'pad', repeat('x', %(pad)s)),
               CASE WHEN %(traced)s THEN jsonb_build_object(
                   'traceparent', '00-' || md5('t' || g) || '-' || left(md5('s' || g), 16) || '-01') END
          FROM generate_series(%(first)s, %(last)s) g
        """,
        {"workspaces": workspaces, "pad": max(0, payload_bytes - 40), "first": first_event,
         "last": first_event + events - 1, "offset": workspace_offset, "traced": traced})
    cur.execute(
        """
        INSERT INTO webhook_deliveries (workspace_id, endpoint_id, event_id, payload_hash, next_attempt_at,
                                        event_day)
        SELECT e.workspace_id, ep.id, e.id, md5(e.id), now() + make_interval(secs => %(due_in)s), e.day
          FROM events e JOIN webhook_endpoints ep ON ep.workspace_id = e.workspace_id AND ep.active
         WHERE e.sequence BETWEEN %(first)s AND %(last)s
         ORDER BY e.sequence, ep.id
        """,
        {"first": first_event, "last": first_event + events - 1, "due_in": due_in})
    return int(cur.rowcount)


# The outbox is partitioned by day (migration 0027): a partitioned table or index has no storage or
# counters of its own, so its figures are the sums over its leaf partitions (a plain table is its own leaf).
def leaves(relation: str) -> str:
    """SQL for the oids of ``relation``'s leaf partitions (a table or an index; a literal name)."""
    return f"SELECT relid FROM pg_partition_tree('{relation}') WHERE isleaf"


def size_sql(relation: str) -> str:
    """SQL for the bytes of ``relation``'s main forks, its leaf partitions' summed."""
    return (f"(SELECT coalesce(sum(pg_relation_size(relid)), 0)::bigint FROM pg_partition_tree('{relation}')"
            " WHERE isleaf)")


OUTBOX_COUNTERS = f"""
    SELECT sum(n_live_tup)::bigint, sum(n_dead_tup)::bigint, sum(n_tup_ins)::bigint, sum(n_tup_upd)::bigint,
           sum(n_tup_hot_upd)::bigint, sum(n_tup_del)::bigint, sum(autovacuum_count)::bigint,
           sum(vacuum_count)::bigint, sum(autoanalyze_count)::bigint
      FROM pg_stat_user_tables WHERE relid IN ({leaves('webhook_deliveries')})"""


def outbox_stats(db: Database) -> dict[str, Any]:
    """Tuple counters, autovacuum activity and sizes of the outbox and its indexes."""
    conn = db.connect(autocommit=True)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT pg_stat_force_next_flush()")
            cur.execute(OUTBOX_COUNTERS)
            (live, dead, ins, upd, hot, dele, autovac, vac, autoanalyze) = cur.fetchone()
            cur.execute(f"""SELECT extract(epoch FROM now() - max(last_autovacuum))::float8 FROM pg_stat_user_tables
                             WHERE relid IN ({leaves('webhook_deliveries')})""")
            (since_autovac,) = cur.fetchone()
            cur.execute(
                """SELECT c.relname, (SELECT coalesce(sum(pg_relation_size(t.relid)), 0)
                                        FROM pg_partition_tree(c.oid) t WHERE t.isleaf)
                     FROM pg_class c
                    WHERE c.relname = 'webhook_deliveries'
                       OR c.oid IN (SELECT indexrelid FROM pg_index
                                     WHERE indrelid = 'webhook_deliveries'::regclass)
                    ORDER BY c.relname""")
            sizes = {name: int(size) for name, size in cur.fetchall()}
            cur.execute("""SELECT coalesce(sum(pg_total_relation_size(relid)), 0)
                             FROM pg_partition_tree('webhook_delivery_attempts') WHERE isleaf""")
            attempts_size = int(cur.fetchone()[0])
    finally:
        conn.close()
    return {
        "live_tuples": live, "dead_tuples": dead, "inserted": ins, "updated": upd, "hot_updated": hot,
        "hot_ratio": round(hot / upd, 3) if upd else None, "deleted": dele,
        "autovacuum_runs": autovac, "vacuum_runs": vac, "autoanalyze_runs": autoanalyze,
        "seconds_since_autovacuum": None if since_autovac is None else round(since_autovac, 1),
        "sizes_bytes": sizes, "attempts_table_bytes": attempts_size,
    }


def wal_lsn(db: Database) -> int:
    """The server's current WAL position in bytes (every database's writes: others' tests add noise)."""
    return int(db.scalar("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn"))


def bloat(db: Database) -> dict[str, Any]:
    """pgstattuple of the outbox heap and pgstatindex of its claim index (exact, not estimates)."""
    conn = db.connect(autocommit=True)
    try:
        with conn.cursor() as cur:
            try:
                cur.execute("CREATE EXTENSION IF NOT EXISTS pgstattuple")
            except psycopg2.Error as exc:  # e.g. a server built without contrib
                return {"unavailable": (str(exc).strip().splitlines() or ["pgstattuple missing"])[0]}
            # Summed over the partitions (a partitioned table has no pages of its own).
            cur.execute(f"""SELECT sum(s.table_len), sum(s.tuple_count), sum(s.dead_tuple_count),
                                   coalesce(100.0 * sum(s.dead_tuple_len) / nullif(sum(s.table_len), 0), 0),
                                   coalesce(100.0 * sum(s.free_space) / nullif(sum(s.table_len), 0), 0)
                              FROM ({leaves('webhook_deliveries')}) t CROSS JOIN LATERAL pgstattuple(t.relid) s""")
            table_len, tuples, dead, dead_pct, free_pct = cur.fetchone()
            cur.execute(f"""SELECT sum(s.index_size), sum(s.leaf_pages), sum(s.deleted_pages),
                                   coalesce(sum(s.avg_leaf_density * s.leaf_pages) FILTER (WHERE s.leaf_pages > 0)
                                            / nullif(sum(s.leaf_pages) FILTER (WHERE s.leaf_pages > 0), 0), 0)
                              FROM ({leaves('webhook_deliveries_due')}) t CROSS JOIN LATERAL pgstatindex(t.relid) s""")
            index_size, leaf_pages, deleted_pages, density = cur.fetchone()
    finally:
        conn.close()
    return {"heap_bytes": int(table_len), "live_tuples": int(tuples), "dead_tuples": int(dead),
            "dead_tuple_percent": float(dead_pct), "free_percent": float(free_pct),
            "due_index_bytes": int(index_size), "due_index_leaf_pages": int(leaf_pages),
            "due_index_deleted_pages": int(deleted_pages), "due_index_leaf_density_percent": float(density)}


def timed_vacuum(db: Database) -> dict[str, Any]:
    """A plain VACUUM of the outbox, timed, and the bloat it leaves."""
    started = time.monotonic()
    db.execute_autocommit("VACUUM webhook_deliveries")
    seconds = time.monotonic() - started
    return {"vacuum_seconds": round(seconds, 3), "after_vacuum": bloat(db)}


@contextlib.contextmanager
def drained_probe(db: Database, sql: str, params: Any = None) -> Iterator[Callable[[], bool]]:
    """A check, for ``wait_until``, that ``sql`` (one boolean) is true, on one connection held
    for the wait.  A connection per check started a backend five times a second, each planning
    its first statement over every partition with cold caches: 30-50 ms of the server's CPU a
    check, taken from the engine being measured."""
    conn = db.connect(autocommit=True)
    try:
        def drained() -> bool:
            with conn.cursor() as cur:
                cur.execute(sql, params)
                row = cur.fetchone()
                return bool(row and row[0])
        yield drained
    finally:
        conn.close()


# --------------------------------------------------------------------------- statsd


class StatsdSink:
    """A local UDP statsd listener that counts what the dispatcher sends."""

    def __init__(self) -> None:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.settimeout(0.2)
        self.port = self._sock.getsockname()[1]
        self.packets = 0
        self.lines = 0
        self.names: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="statsd-sink", daemon=True)

    def __enter__(self) -> StatsdSink:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(2)
        self._sock.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                data = self._sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            self.packets += 1
            for line in data.split(b"\n"):
                if line:
                    self.lines += 1
                    name = line.split(b":", 1)[0].decode("ascii", "replace")
                    kind = name.split(".webhook_", 1)[-1].split(".", 1)[0]
                    self.names[kind] = self.names.get(kind, 0) + 1

    def report(self) -> dict[str, Any]:
        return {"packets": self.packets, "lines": self.lines, "by_metric": dict(sorted(self.names.items()))}


# --------------------------------------------------------------------------- CPU accounting


def _cpu(proc: psutil.Process) -> float | None:
    try:
        times = proc.cpu_times()
        return float(times.user + times.system)
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None


@dataclass
class _Group:
    find: Callable[[], Iterable[psutil.Process]]
    first: dict[int, float] = field(default_factory=dict)
    last: dict[int, float] = field(default_factory=dict)


class CpuMeter:
    """CPU seconds used by groups of processes between ``start`` and ``stop``.

    A sampling thread re-lists each group every ``interval`` seconds, so
    processes that appear (new workers, new backends) are counted from their
    birth, and those that exit keep what they used up to the last sample.
    """

    def __init__(self, groups: dict[str, Callable[[], Iterable[psutil.Process]]], interval: float = 0.5) -> None:
        self._groups = {name: _Group(find) for name, find in groups.items()}
        self._interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._started_at = 0.0
        self.elapsed = 0.0

    def start(self) -> CpuMeter:
        self._started_at = time.time()
        self._sample()
        self._thread = threading.Thread(target=self._loop, name="cpu-meter", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> dict[str, float]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        self._sample()
        self.elapsed = time.time() - self._started_at
        return self.totals()

    def _loop(self) -> None:
        while not self._stop.wait(self._interval):
            self._sample()

    def _sample(self) -> None:
        for group in self._groups.values():
            try:
                procs = list(group.find())
            except Exception:  # a listing failure (db hiccup) loses one sample only
                continue
            for proc in procs:
                value = _cpu(proc)
                if value is None:
                    continue
                if proc.pid not in group.first:
                    try:
                        born_after = proc.create_time() >= self._started_at
                    except psutil.Error:
                        born_after = False
                    group.first[proc.pid] = 0.0 if born_after and self._thread is not None else value
                group.last[proc.pid] = value

    def totals(self) -> dict[str, float]:
        return {name: round(sum(g.last[pid] - g.first[pid] for pid in g.last), 3)
                for name, g in self._groups.items()}


class PostgresProcesses:
    """Postgres processes that work for one database, by role.

    * ``dispatcher``: backends whose application_name starts with one of
      ``sender_apps`` ("dispatcher": workers' claim/record/upkeep connections,
      the supervisor; a peer's workers under their own name);
    * ``producer``: the benchmark's producer connections;
    * ``harness``: the benchmark's own sampling and seeding connections;
    * ``server``: the server's shared helpers (WAL writer, checkpointer,
      bgwriter, autovacuum launcher) and autovacuum workers while they serve
      this database.

    :meth:`ours` is all four; ``everything`` lists every postgres process,
    other databases' (other people's tests) included.
    """

    _SHARED = ("walwriter", "checkpointer", "background writer", "autovacuum launcher",
               "logical replication launcher")

    def __init__(self, database: str, sender_apps: tuple[str, ...] = ("dispatcher",)) -> None:
        self._database = database
        self._sender_apps = sender_apps
        self._conn: psycopg2.extensions.connection | None = None
        self._roles: dict[int, str] = {}
        self._read_at = 0.0

    def _refresh(self) -> None:
        if time.monotonic() - self._read_at < 0.2:
            return
        if self._conn is None or self._conn.closed:
            self._conn = psycopg2.connect(server_dsn(), application_name="benchmark cpu meter")
            self._conn.autocommit = True
        with self._conn.cursor() as cur:
            cur.execute("SELECT pid, datname, backend_type, application_name FROM pg_stat_activity")
            rows = cur.fetchall()
        roles: dict[int, str] = {}
        for pid, datname, kind, app in rows:
            if datname == self._database:
                if kind == "client backend":
                    app = app or ""
                    roles[pid] = ("dispatcher" if app.startswith(self._sender_apps) else
                                  "producer" if app == "benchmark producer" else "harness")
                else:
                    roles[pid] = "server"  # autovacuum worker on this database
            elif datname is None and kind in self._SHARED:
                roles[pid] = "server"
        self._roles = roles
        self._read_at = time.monotonic()

    def role(self, name: str) -> Callable[[], list[psutil.Process]]:
        def find() -> list[psutil.Process]:
            self._refresh()
            out = []
            for pid, role in self._roles.items():
                if role == name:
                    with contextlib.suppress(psutil.Error):
                        out.append(psutil.Process(pid))
            return out

        return find

    def ours(self) -> list[psutil.Process]:
        self._refresh()
        out = []
        for pid in self._roles:
            with contextlib.suppress(psutil.Error):
                out.append(psutil.Process(pid))
        return out

    def groups(self, prefix: str = "postgres") -> dict[str, Callable[[], Iterable[psutil.Process]]]:
        """CPU-meter groups: all of ours, each role, and every postgres process."""
        found: dict[str, Callable[[], Iterable[psutil.Process]]] = {prefix: self.ours}
        for role in ("dispatcher", "producer", "harness", "server"):
            found[f"{prefix}_{role}"] = self.role(role)
        found[f"{prefix}_all_databases"] = self.everything
        return found

    @staticmethod
    def everything() -> list[psutil.Process]:
        return [p for p in psutil.process_iter(["name"]) if p.info.get("name") in ("postgres", "postmaster")]

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()


class MachineCpu:
    """Busy CPU seconds of the whole machine over an interval (all processes, ours and others')."""

    def __init__(self) -> None:
        self._start = self._busy()
        self._steal = self._stolen()
        self._wall = time.monotonic()

    @staticmethod
    def _stolen() -> float:
        # Time the hypervisor gave this guest's CPUs to another: a run that lost some of it is
        # slower, and its processes' CPU per delivery higher (caches), for reasons not its own.
        return float(getattr(psutil.cpu_times(), "steal", 0.0))

    @staticmethod
    def _busy() -> float:
        times = psutil.cpu_times()
        return float(times.user + times.nice + times.system + getattr(times, "irq", 0.0)
                     + getattr(times, "softirq", 0.0) + getattr(times, "steal", 0.0))

    def stop(self, ours: float) -> dict[str, float]:
        """``ours``: CPU seconds of the processes the scenario measured itself."""
        busy = self._busy() - self._start
        wall = time.monotonic() - self._wall
        cores = os.cpu_count() or 1
        return {"machine_busy_cpu_s": round(busy, 2), "machine_busy_fraction": round(busy / (wall * cores), 3),
                "machine_steal_s": round(self._stolen() - self._steal, 2),
                "others_cpu_s": round(max(0.0, busy - ours), 2),
                "others_cores": round(max(0.0, busy - ours) / wall, 2) if wall > 0 else 0.0}


def cpu_split(totals: dict[str, float], deliveries: int) -> dict[str, Any]:
    """CPU-ms per delivery for each group."""
    per = {name: round(seconds * 1000.0 / deliveries, 3) if deliveries else None for name, seconds in totals.items()}
    return {"cpu_s": totals, "cpu_ms_per_delivery": per}


# --------------------------------------------------------------------------- the dispatcher


class DispatcherRun(Dispatcher):
    """The kit's dispatcher run with a benchmark's config dict, stopped with TERM.

    BENCH_ENGINE_REPO runs another checkout's engine (e.g. the commit before an
    optimisation) under the same harness, receiver and schema.
    """

    def __init__(self, workdir: Path, config: dict[str, Any]) -> None:
        super().__init__(workdir / "dispatcher.yaml", workdir / "dispatcher.stdout",
                         repo=Path(os.environ.get("BENCH_ENGINE_REPO", str(REPO))))
        self.config = config
        self.log_path = Path(config["logging"]["file"])

    def start(self) -> Self:
        write_config(self.config_path, self.config)
        return super().start()

    def wait_ready(self, workers: int, timeout: float = 30.0) -> None:
        """Until ``workers`` workers logged their start line."""
        def ready() -> bool:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"dispatcher exited with {self.process.returncode}: {self.tail()}")
            text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
            return text.count("started (client=") >= workers

        try:
            wait_until(ready, timeout, message=f"{workers} dispatcher workers to start")
        except WaitTimeout:
            raise RuntimeError(f"dispatcher workers did not start within {timeout:.0f}s: {self.tail()}") from None

    def tail(self, chars: int = 3000) -> str:
        parts = []
        for path in (self.output_path, self.log_path):
            if path.exists():
                parts.append(path.read_text(errors="replace")[-chars:])
        return "\n".join(parts)

    def owners(self) -> list[str]:
        """The owner ids (``host:supervisor-pid:wN``) of the workers that logged their start."""
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return _WORKER_STARTED.findall(text)

    def log_counts(self) -> dict[str, int]:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return {"lines": text.count("\n"), "attempt_lines": text.count(" attempt event_id="),
                "warnings": text.count(" WARNING "), "errors": text.count(" ERROR "),
                "bytes": len(text.encode("utf-8", "replace")),
                # Results of rows whose lease lapsed and another worker claimed: the worker's warning.
                "fence_rejected": sum(int(n) for n in _FENCE_WARNING.findall(text))}


@contextlib.contextmanager
def workdir(label: str) -> Iterator[Path]:
    import tempfile

    with tempfile.TemporaryDirectory(prefix=f"bench-{label}-") as path:
        yield Path(path)


# --------------------------------------------------------------------------- an engine scenario


@dataclass
class EngineSetup:
    """What an engine scenario runs against: its database, work directory,
    statsd sink, receiver (the verifying mock, or nginx) and the database's Postgres processes."""

    db: Database
    tmp: Path
    statsd: StatsdSink
    receiver: ReceiverProcess | NginxReceiver
    pg: PostgresProcesses

    ca_file: Path | None = None  # the CA of a TLS receiver's certificate, when it serves https

    def config(self, **sections: dict[str, Any]) -> dict[str, Any]:
        """The dispatcher's config for this setup (logs in ``tmp``, metrics to the sink).  Against
        a TLS receiver it is production's policy: https required, only 127.0.0.0/8 let through,
        the test CA trusted in addition to the system's."""
        if self.ca_file is not None:
            https = {"require_https": True, "allow_private_networks": False, "allow_networks": ["127.0.0.0/8"],
                     "ca_file": str(self.ca_file)}
            sections = {**sections, "http": {**https, **sections.get("http", {})}}
        return bench_config(self.db.dsn, self.tmp / "dispatcher.log", self.statsd.port, **sections)

    def cpu_meter(self, dispatcher: DispatcherRun | Sequence[DispatcherRun],
                  **extra: Callable[[], Iterable[psutil.Process]]) -> CpuMeter:
        """A started meter over the dispatcher (every supervisor given), Postgres (by role), the
        receiver and ``extra`` groups."""
        receiver = self.receiver
        runs = [dispatcher] if isinstance(dispatcher, DispatcherRun) else list(dispatcher)
        return CpuMeter({"dispatcher": lambda: [p for run in runs for p in run.tree()], **self.pg.groups(),
                         "receiver": lambda: process_tree(receiver.pid), **extra}).start()


RECEIVERS = ("mock", "nginx")


@contextlib.contextmanager
def engine_setup(label: str, *, receiver_processes: int = 1, receiver_seed: int | None = None,
                 tls: bool = False, receiver_kind: str = "mock") -> Iterator[EngineSetup]:
    """``tls``: the receiver serves https with a certificate from a CA made here (trustme).
    ``receiver_kind``: ``mock`` (the Python receiver, verifying every signature) or ``nginx``
    (Debian's nginx answering 204, plain http, one worker; see benchmarks/nginx.py)."""
    if receiver_kind not in RECEIVERS:
        raise ValueError(f"unknown receiver {receiver_kind!r} (one of {', '.join(RECEIVERS)})")
    if receiver_kind == "nginx" and (tls or receiver_processes != 1 or receiver_seed is not None):
        raise ValueError("the nginx receiver serves plain http with its own worker count and no profiles")
    with bench_database(label) as db, workdir(label) as tmp, StatsdSink() as statsd:
        cert = key = ca_file = None
        if tls:
            ca_file, cert, key = _tls_files(tmp)
        server: contextlib.AbstractContextManager[ReceiverProcess | NginxReceiver] = (
            NginxReceiver(tmp) if receiver_kind == "nginx" else
            ReceiverProcess(secrets=[SECRET], processes=receiver_processes, seed=receiver_seed,
                            tls_cert=cert, tls_key=key))
        with server as receiver:
            pg = PostgresProcesses(db.name)
            try:
                yield EngineSetup(db, tmp, statsd, receiver, pg, ca_file)
            finally:
                pg.close()


def _tls_files(directory: Path) -> tuple[Path, Path, Path]:
    """(CA bundle, certificate chain, key) of a throw-away CA's certificate for 127.0.0.1."""
    import trustme

    ca = trustme.CA()
    issued = ca.issue_cert("127.0.0.1", "localhost")
    ca_file, cert, key = directory / "ca.pem", directory / "receiver.pem", directory / "receiver.key"
    ca.cert_pem.write_to_path(str(ca_file))
    for index, blob in enumerate(issued.cert_chain_pems):
        blob.write_to_path(str(cert), append=index > 0)
    issued.private_key_pem.write_to_path(str(key))
    return ca_file, cert, key
