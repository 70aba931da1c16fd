"""Outbound HTTP: the transport, the outbound policy (SSRF guard, ports, pinned dial), the bounded DNS
resolver, and the flag-off producer's inline send (``legacy``)."""
