"""A fast local mock webhook receiver for the demo, the tests and the benchmarks.

Run it as ``python -m dispatcher_devtools.receiver --listen 127.0.0.1:0 [--secret S ...]
[--profiles FILE.yaml] [--processes N] [--ready-file PATH] [--seed N] [--export-ids FILE]
[--tls-cert FILE --tls-key FILE]``, or from
Python through :class:`ReceiverProcess`.

Delivery URLs are ``/<profile>/<endpoint-key>?<params>``.  The profile name gives
the defaults (see ``BASE_PROFILES``) and the query string overrides them:

* ``/ok/k``                                   instant 200
* ``/latency/k?ms=80``                        fixed delay
* ``/latency/k?median_ms=80&sigma=0.5``       log-normal delay
* ``/latency/k?median_ms=120&p99=2000``       log-normal delay given by its median and p99
* ``/error/k?rate=0.02&status=500``           random errors (combine with delays)
* ``/ratelimit/k?retry_after=2``              429 with Retry-After
* ``/unavailable/k?retry_after=2``            503 with Retry-After
* ``/hang/k``                                 never answers; held until the client leaves
* ``/slow/k?ms=4800``                         200 after 4.8 s
* ``/drip/k?drip=1000``                       200, sent one byte a second (slow-drip)
* ``/redirect/k?to=URL&code=302``             redirect
* ``/status/k?code=404``                      fixed status

Query names: ``ms`` (latency_ms), ``median_ms``, ``sigma``, ``rate`` (error_rate),
``status`` (error_status), ``code`` (status), ``to`` (location), ``retry_after``,
``body`` (body_bytes, a response body of that many bytes), ``p99`` (p99_ms),
``drip`` (drip_ms), ``hang``, and the
canonical :class:`Profile` field names except ``status``.  A "down" endpoint is
a closed port, not a route: see :func:`closed_port_url`.

Profiles in ``--profiles FILE`` (``key: {latency_ms: 80, error_rate: 0.1}``,
optionally ``profile: <base name>``) and those posted to ``/_profile/<key>``
replace the URL's profile for that key; runtime ones win over the file.

Control routes (never counted): ``GET /_healthz``, ``GET /_stats[?fast=1]``,
``POST /_reset[?profiles=1]``, ``GET /_deliveries`` (CSV),
``GET|POST|DELETE /_profile/<key>``, and ``POST /_export_ids``.

``--export-ids FILE`` writes the distinct ``webhook-id`` values (the event ids,
which the ``Idempotency-Key`` repeats) of every verified delivery received, on
any endpoint and whatever the answer, one per line and sorted: at shutdown and
on ``POST /_export_ids``.  A rollout gate compares the file with the database.

With ``--tls-cert``/``--tls-key`` it serves HTTPS (every process, every route)
with that certificate, for tests of the dispatcher's certificate checks.

Every delivery must carry a Standard Webhooks signature that verifies against
one of the ``--secret`` values (401 otherwise); without secrets nothing is
verified but ``webhook-id`` is still required (400 otherwise).

The package is split by concern: ``wire`` (HTTP parsing and responses),
``profiles``, ``counters`` (shared-memory gauge, per-process counters,
merging, CSV), ``server`` (the connection handler), ``processes`` (single
process or pre-fork supervisor), ``cli`` and ``client`` (:class:`ReceiverProcess`).

The names below are loaded lazily: ``python -m dispatcher_devtools.receiver``
imports this package *before* ``__main__`` can monkey-patch, so importing the
package itself must not import socket, ssl or gevent.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dispatcher_devtools.receiver.cli import main
    from dispatcher_devtools.receiver.client import Delivery, ReceiverProcess, closed_port_url, signed_headers
    from dispatcher_devtools.receiver.counters import merge_rows, merge_stats
    from dispatcher_devtools.receiver.profiles import BASE_PROFILES, Profile, build_profile, profile_from_mapping

_HOMES = {
    "BASE_PROFILES": "profiles", "Profile": "profiles", "build_profile": "profiles",
    "profile_from_mapping": "profiles", "merge_stats": "counters", "merge_rows": "counters",
    "Delivery": "client", "ReceiverProcess": "client", "closed_port_url": "client",
    "signed_headers": "client", "main": "cli",
}

__all__ = [
    "BASE_PROFILES", "Delivery", "Profile", "ReceiverProcess", "build_profile", "closed_port_url", "main",
    "merge_rows", "merge_stats", "profile_from_mapping", "signed_headers",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value  # later look-ups skip this hook
    return value
