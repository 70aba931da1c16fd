"""``tls``: the throughput drain over HTTPS, against the same drain over plain HTTP in the same run.

1,000 endpoints (100 workspaces x 10), 100,000 deliveries, every feature on,
the receiver verifying every signature.  The TLS half runs with production's
outbound policy (``require_https``, only 127.0.0.0/8 let through) and a
certificate from a CA made for the run (``http.ca_file``).  The receiver counts
the TLS handshakes it completes: with keep-alive holding, they stay near one
per connection the pools keep, far below one per delivery.
"""

from __future__ import annotations

from typing import Any

from benchmarks.throughput import drain

TARGET_RATIO = 0.7  # of the plain-HTTP figure measured in the same run


def run(tiny: bool = False, client: str | None = None, processes: int = 2) -> dict[str, Any]:
    events = 50 if tiny else 10_000
    workspaces = 10 if tiny else 100
    plain = drain(events=events, workspaces=workspaces, client=client, processes=processes, label="tls_plain")
    tls = drain(events=events, workspaces=workspaces, client=client, processes=processes, label="tls", tls=True)
    plain_rate, tls_rate = plain["deliveries_per_s"] or 0.0, tls["deliveries_per_s"] or 0.0
    ratio = round(tls_rate / plain_rate, 3) if plain_rate else None
    handshakes = tls["tls_handshakes"]
    endpoints = tls["endpoints"]
    result: dict[str, Any] = {
        "deliveries": tls["deliveries"],
        "endpoints": endpoints,
        "deliveries_per_s": tls_rate,
        "plain_deliveries_per_s": plain_rate,
        "ratio_to_plain": ratio,
        "target_ratio": TARGET_RATIO,
        "tls_handshakes": handshakes,
        "tls_resumed": tls["tls_resumed"],
        "handshakes_per_endpoint": round(handshakes / endpoints, 3) if endpoints else None,
        "deliveries_per_handshake": round(tls["deliveries"] / handshakes, 1) if handshakes else None,
        "cpu_ms_per_delivery": tls["cpu_ms_per_delivery"],
        "plain_cpu_ms_per_delivery": plain["cpu_ms_per_delivery"],
        "lost": tls["lost"] + plain["lost"],
        "tls_run": tls,
        "plain_run": plain,
    }
    result["met"] = ratio is not None and ratio >= TARGET_RATIO and result["lost"] == 0
    split, plain_split = tls["cpu_ms_per_delivery"], plain["cpu_ms_per_delivery"]
    result["table"] = [
        ("deliveries/s over TLS", tls_rate, "report"),
        ("ratio to plain HTTP, same run", ratio, f">= {TARGET_RATIO}"),
        ("TLS handshakes (per endpoint)", f"{handshakes} ({result['handshakes_per_endpoint']})", "~1 per pool slot"),
        ("CPU ms/delivery dispatcher TLS / plain", f"{split['dispatcher']} / {plain_split['dispatcher']}", "report"),
        ("CPU ms/delivery receiver TLS / plain", f"{split['receiver']} / {plain_split['receiver']}", "report"),
        ("lost", result["lost"], "0"),
    ]
    return result
