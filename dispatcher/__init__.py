"""dispatcher: queue-backed webhook delivery (RFC-014).

Public names are loaded lazily (PEP 562) so that importing a submodule -- in
particular the gevent worker entry point, which must monkey-patch before
anything imports ``socket``/``ssl``/``threading`` -- pulls in nothing else.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dispatcher.version import __version__

__all__ = ["Event", "StoredEvent", "WebhookSender", "connect", "load_config", "__version__"]

if TYPE_CHECKING:
    from dispatcher.config import load_config
    from dispatcher.producer import Event, StoredEvent, WebhookSender
    from dispatcher.runtime.embedded import connect

_LAZY = {
    "Event": "dispatcher.producer",
    "StoredEvent": "dispatcher.producer",
    "WebhookSender": "dispatcher.producer",
    "load_config": "dispatcher.config",
    # Opens a connection from a config, starting the embedded server if configured (README, "Producer API").
    "connect": "dispatcher.runtime.embedded",
}


def __getattr__(name: str) -> Any:
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module 'dispatcher' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module_name), name)
