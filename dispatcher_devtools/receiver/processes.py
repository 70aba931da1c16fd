"""Process supervision: one serving process, or a supervisor forking
``--processes N`` children that share the port and are driven over socketpairs."""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import pickle
import random
import resource
import signal
import socket
import ssl
import struct
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any, Final

import gevent
import gevent.os
from gevent.event import AsyncResult, Event
from gevent.lock import Semaphore
from gevent.server import StreamServer

from dispatcher_devtools.receiver.counters import InFlight, State, merge_rows, merge_stats, write_ids
from dispatcher_devtools.receiver.profiles import Profile
from dispatcher_devtools.receiver.server import LocalLink, Server

CALL_TIMEOUT: Final = 120.0           # a /_stats over 10^6 ids across processes takes seconds
EXPORT_TIMEOUT: Final = 30.0          # at shutdown: long enough for 10^6 ids, short enough not to hang a stop

_FRAME: Final = struct.Struct("!Q")


class Channel:
    """Length-prefixed pickle frames over a socketpair between supervisor and child."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._send_lock = Semaphore()  # frames from several greenlets must not interleave

    def send(self, message: tuple[Any, ...]) -> None:
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        with self._send_lock:
            self._sock.sendall(_FRAME.pack(len(data)))
            self._sock.sendall(data)

    def recv(self) -> tuple[Any, ...] | None:
        header = self._recv_exactly(_FRAME.size)
        if header is None:
            return None
        data = self._recv_exactly(_FRAME.unpack(header)[0])
        return None if data is None else pickle.loads(data)

    def _recv_exactly(self, size: int) -> bytearray | None:
        data = bytearray(size)
        view = memoryview(data)
        got = 0
        while got < size:
            n = self._sock.recv_into(view[got:])
            if n == 0:
                return None
            got += n
        return data

    def close(self) -> None:
        self._sock.close()


class ChildLink:
    """A forked serving process: control operations go through the supervisor."""

    def __init__(self, channel: Channel, state: State) -> None:
        self._channel = channel
        self._state = state
        self._pending: dict[int, AsyncResult] = {}
        self._ids = itertools.count()

    def call(self, op: str, arg: Any) -> Any:
        request = next(self._ids)
        result = self._pending[request] = AsyncResult()
        try:
            self._channel.send(("call", request, op, arg))
            ok, value = result.get(timeout=CALL_TIMEOUT)
        finally:
            self._pending.pop(request, None)
        if not ok:
            raise RuntimeError(value)
        return value

    def slot(self, key: str) -> int:
        return int(self.call("slot", key))

    def run(self) -> None:
        """Serve the supervisor until it goes away (then the caller exits)."""
        while (message := self._channel.recv()) is not None:
            if message[0] == "do":
                _, token, op, arg = message
                self._channel.send(("done", token, self._state.apply(op, arg)))
            elif message[0] == "result":
                _, request, ok, value = message
                waiter = self._pending.get(request)
                if waiter is not None:
                    waiter.set((ok, value))

# --------------------------------------------------------------------------- processes


def _listen_socket(host: str, port: int, *, reuse_port: bool, listen: bool = True) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    if listen:
        sock.listen(4096)
    return sock


def _announce(host: str, port: int, ready_file: str | None, processes: int) -> None:
    if ready_file:
        document = {"host": host, "port": port, "pid": os.getpid(), "processes": processes}
        partial = f"{ready_file}.{os.getpid()}.tmp"
        with open(partial, "w", encoding="utf-8") as handle:
            json.dump(document, handle)
        os.replace(partial, ready_file)  # readers never see a half-written file
    print(f"LISTENING {host}:{port}", flush=True)


def _stop_on_signals_and_stdin(stop: Event, watch_stdin: bool) -> None:
    gevent.signal_handler(signal.SIGTERM, stop.set)
    gevent.signal_handler(signal.SIGINT, stop.set)
    if watch_stdin:
        gevent.spawn(_wait_for_stdin_eof, stop)


def _wait_for_stdin_eof(stop: Event) -> None:
    # The parent holds our stdin open; EOF means it died, even by SIGKILL.
    fd = sys.stdin.fileno()
    gevent.os.make_nonblocking(fd)
    try:
        while gevent.os.nb_read(fd, 4096):
            pass
    except OSError:
        pass
    stop.set()


def _new_rng(seed: int | None, row: int) -> random.Random:
    return random.Random(None if seed is None else seed * 1000 + row)


def run_single(options: argparse.Namespace, keys: Sequence[bytes], profiles: Mapping[str, Profile],
               tls: ssl.SSLContext | None = None) -> int:
    started = time.time()
    state = State(InFlight(1, options.max_endpoints), profiles)
    server = Server(state, LocalLink(state, started), keys, _new_rng(options.seed, 0),
                    export_path=options.export_ids, tls=tls)
    host, port = options.listen
    listener = _listen_socket(host, port, reuse_port=False)
    stream = StreamServer(listener, server.handle)
    stream.start()
    stop = Event()
    _stop_on_signals_and_stdin(stop, options.watch_stdin)
    _announce(host, listener.getsockname()[1], options.ready_file, 1)
    stop.wait()
    stream.stop(timeout=1)
    if options.export_ids:
        server.export_ids()  # the final list, once no request is being served any more
    return 0


def _run_child(
    options: argparse.Namespace, row: int, channel: Channel, gauge: InFlight,
    keys: Sequence[bytes], profiles: Mapping[str, Profile], port: int, tls: ssl.SSLContext | None,
) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # the supervisor handles ^C
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    gauge.adopt_row(row)
    state = State(gauge, profiles)
    link = ChildLink(channel, state)
    state.allocate = link.slot
    server = Server(state, link, keys, _new_rng(options.seed, row), export_path=options.export_ids, tls=tls)
    # One SO_REUSEPORT socket per child: the kernel spreads connections evenly,
    # where a single shared socket lets whichever process wakes first take a burst.
    listener = _listen_socket(options.listen[0], port, reuse_port=True)
    StreamServer(listener, server.handle).start()
    channel.send(("ready", os.getpid()))
    link.run()


class _Supervisor:
    """Parent of --processes N children: fans control operations out and merges."""

    def __init__(self, channels: Sequence[Channel], pids: Sequence[int], gauge: InFlight) -> None:
        self._channels = list(channels)
        self._pids = list(pids)
        self._gauge = gauge
        self._capacity = gauge.slots
        self._slots: dict[str, int] = {}
        self._waiting: dict[int, list[AsyncResult]] = {}
        self._tokens = itertools.count()
        self._ready = 0
        self._all_ready = Event()
        self._stop = Event()
        self._stopping = False
        self._failed = False
        self._started = time.time()

    def run(self, options: argparse.Namespace, port: int) -> int:
        for row, channel in enumerate(self._channels):
            gevent.spawn(self._read, row, channel)
        _stop_on_signals_and_stdin(self._stop, options.watch_stdin)
        gevent.wait([self._all_ready, self._stop], count=1, timeout=30)
        if self._all_ready.is_set() and not self._stop.is_set():
            _announce(options.listen[0], port, options.ready_file, len(self._pids))
            self._stop.wait()
        else:
            self._failed = True
        self._stopping = True
        if options.export_ids and not self._failed:
            self._export_at_shutdown(options.export_ids)
        healthy = self._terminate()
        return 0 if healthy and not self._failed else 1

    def _export_at_shutdown(self, path: str) -> None:
        """Ask the children for their ids before stopping them.  A group-wide
        SIGTERM may have killed them already: then there is nothing to ask, and
        ReceiverProcess exports over the control route before it signals."""
        try:
            with gevent.Timeout(EXPORT_TIMEOUT):
                write_ids(path, self._fan_out("ids", None))
        except (OSError, gevent.Timeout) as exc:
            print(f"receiver: ids not exported at shutdown: {exc!r}", file=sys.stderr)

    def _read(self, row: int, channel: Channel) -> None:
        while (message := channel.recv()) is not None:
            kind = message[0]
            if kind == "ready":
                self._ready += 1
                if self._ready == len(self._channels):
                    self._all_ready.set()
            elif kind == "call":
                gevent.spawn(self._serve_call, channel, *message[1:])
            elif kind == "done":
                waits = self._waiting.get(message[1])
                if waits is not None:
                    waits[row].set(message[2])
        if not self._stopping:
            self._stop.set()  # a child is gone: _terminate tells a crash from a group SIGTERM

    def _serve_call(self, origin: Channel, request: int, op: str, arg: Any) -> None:
        try:
            value = self._slot(arg) if op == "slot" else self._fan_out(op, arg)
        except Exception as exc:  # reported to the calling child, which answers 500
            origin.send(("result", request, False, repr(exc)))
        else:
            origin.send(("result", request, True, value))

    def _slot(self, key: str) -> int:
        slot = self._slots.get(key)
        if slot is None:
            if len(self._slots) >= self._capacity:
                return -1
            slot = self._slots[key] = len(self._slots)
        return slot

    def _fan_out(self, op: str, arg: Any) -> Any:
        levels = {key: self._gauge.level(slot) for key, slot in self._slots.items()}  # see merge_stats
        token = next(self._tokens)
        waits = self._waiting[token] = [AsyncResult() for _ in self._channels]
        try:
            for channel in self._channels:
                channel.send(("do", token, op, arg))
            results = [wait.get(timeout=CALL_TIMEOUT) for wait in waits]
        finally:
            del self._waiting[token]
        if op == "stats":
            usage = resource.getrusage(resource.RUSAGE_SELF)
            return merge_stats(results, self._started, (usage.ru_utime, usage.ru_stime), levels)
        if op == "deliveries":
            return merge_rows(results)
        if op == "ids":
            return results  # one blob per child; write_ids merges them
        return None

    def _terminate(self) -> bool:
        """Stop and reap every child; False if one of them had died on its own."""
        for pid in self._pids:
            _signal_quietly(pid, signal.SIGTERM)
        deadline = time.monotonic() + 5.0
        healthy = True
        for pid in self._pids:
            expected = {signal.SIGTERM}  # ours, or a group-wide one (ReceiverProcess, timeout(1))
            while (status := os.waitpid(pid, os.WNOHANG)) == (0, 0):
                if time.monotonic() > deadline:
                    _signal_quietly(pid, signal.SIGKILL)
                    expected.add(signal.SIGKILL)
                    status = os.waitpid(pid, 0)
                    break
                gevent.sleep(0.02)
            code = status[1]
            if code != 0 and not (os.WIFSIGNALED(code) and os.WTERMSIG(code) in expected):
                print(f"receiver: child {pid} failed (wait status {code})", file=sys.stderr)
                healthy = False
        return healthy


def _signal_quietly(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signum)


def run_supervisor(options: argparse.Namespace, keys: Sequence[bytes], profiles: Mapping[str, Profile],
                   tls: ssl.SSLContext | None = None) -> int:
    host, port = options.listen
    # Bound but never listening: it reserves the port (port 0 picks it) and, not
    # being in the accept group, never receives a connection itself.
    reservation = _listen_socket(host, port, reuse_port=True, listen=False)
    port = reservation.getsockname()[1]
    gauge = InFlight(options.processes, options.max_endpoints)
    pairs = [socket.socketpair() for _ in range(options.processes)]
    pids: list[int] = []
    for row in range(options.processes):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                reservation.close()
                for other, (parent_end, child_end) in enumerate(pairs):
                    parent_end.close()
                    if other != row:
                        child_end.close()
                _run_child(options, row, Channel(pairs[row][1]), gauge, keys, profiles, port, tls)
                code = 0  # the supervisor went away
            except BaseException:  # a child must never return into the supervisor's code
                import traceback

                traceback.print_exc()
            finally:
                os._exit(code)
        pids.append(pid)
    for _, child_end in pairs:
        child_end.close()
    supervisor = _Supervisor([Channel(parent_end) for parent_end, _ in pairs], pids, gauge)
    return supervisor.run(options, port)

