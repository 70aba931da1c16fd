"""Requests in flight per workspace, in one API process (issue 23 item 2).

The process has ``api.pool_size`` database connections for every tenant.  One
workspace asking for its largest pages from many clients at once would hold
them all, and every other tenant's request would queue behind it.  So a
request counts against its workspace from the moment its work takes a
connection (``resources.base``: right after the token check, or after a
body is read, so a slow upload holds no slot) until its answer is done,
and one over ``api.requests_in_flight_per_workspace``
is refused at once with 429 -- it never waits, and never holds a connection
while waiting.  Unauthenticated routes (``/healthz``, the console page,
contact confirmation) are never counted: no workspace is known for them.

The count is per process and in memory: a refusal costs no database round
trip, and a restart forgets nothing that matters.
"""

from __future__ import annotations

import threading

import falcon

from dispatcher.api.problems import Problem

# Where a request admitted by ``WorkspaceInFlight.admit`` remembers its workspace, for the release.
_CONTEXT_KEY = "in_flight_workspace"


class WorkspaceInFlight:
    """The count of requests in flight per workspace, capped at ``cap``."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self._counts: dict[str, int] = {}
        self._lock = threading.Lock()  # held without I/O (a gevent-patched lock in the server)

    def admit(self, req: falcon.Request, workspace_id: str) -> None:
        """Count ``req`` against ``workspace_id``, or raise 429 if the workspace is at its cap.

        A request is counted once, however often it authenticates.
        """
        if req.context.get(_CONTEXT_KEY) is not None:
            return
        with self._lock:
            held = self._counts.get(workspace_id, 0)
            if held >= self.cap:
                raise Problem(429, "too-many-requests-in-flight", "Too many requests in flight",
                              f"this workspace already has {held} requests in flight in this API process, "
                              f"the most it may (api.requests_in_flight_per_workspace: {self.cap} requests); "
                              "retry once one is answered", headers={"Retry-After": "1"})
            self._counts[workspace_id] = held + 1
        req.context[_CONTEXT_KEY] = workspace_id

    def release(self, req: falcon.Request) -> None:
        """Give back ``req``'s count, if it was counted (idempotent)."""
        workspace_id = req.context.get(_CONTEXT_KEY)
        if workspace_id is None:
            return
        req.context[_CONTEXT_KEY] = None
        with self._lock:
            left = self._counts.get(workspace_id, 0) - 1
            if left > 0:
                self._counts[workspace_id] = left
            else:
                self._counts.pop(workspace_id, None)  # idle workspaces cost no memory

    def held(self, workspace_id: str) -> int:
        with self._lock:
            return self._counts.get(workspace_id, 0)


class ReleaseInFlight:
    """Falcon middleware: gives a request's count back when its answer is done.

    ``process_response`` runs for every request that ``process_request`` saw --
    also when the responder raised, after the error handlers rendered the problem.
    """

    def __init__(self, in_flight: WorkspaceInFlight) -> None:
        self._in_flight = in_flight

    def process_response(self, req: falcon.Request, resp: falcon.Response, resource: object,
                         req_succeeded: bool) -> None:
        self._in_flight.release(req)
