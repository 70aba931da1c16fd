"""Schema-driven fuzzing of the API with schemathesis (issue 4, "Errors").

Every operation of the shipped OpenAPI document is called in-process (WSGI)
with generated valid (positive) and invalid (negative) requests, against a
real database seeded with rows the generated ids can hit.  Checks: no 5xx,
every status code, content type, header and body is the documented one, and
invalid input is refused with a 4xx.  Schemathesis' ``positive_data_acceptance``
is left out on purpose: schema-valid input can still be refused by design
(an expired cursor, ``since`` older than 30 days, a spent replay budget).

Bounded and deterministic: a fixed number of examples per operation and
mode, derandomised, no example database, so the run takes seconds.
"""

from __future__ import annotations

from collections import Counter
from datetime import timedelta
from typing import Any

import falcon
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error
from schemathesis.generation import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from dispatcher.api.app import create_app
from dispatcher.config import load_config
from dispatcher.contacts import token_hash
from tests.conftest import REPO
from tests.integration.test_api import World

pytestmark = pytest.mark.timeout(120)

SCHEMA = schemathesis.openapi.from_path(REPO / "dispatcher" / "api" / "openapi.json")
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_headers_conformance,
          response_schema_conformance]
EXAMPLES = {GenerationMode.POSITIVE: 40, GenerationMode.NEGATIVE: 30}


def _seed(world: World) -> tuple[str, dict[str, Any]]:
    """Low ids exist, so generated ids hit real rows as well as missing ones."""
    ws = world.workspace("acme")
    other = world.workspace("globex")
    endpoints = [world.endpoint(ws), world.endpoint(ws, active=False), world.endpoint(other)]
    world.sql("INSERT INTO endpoint_state (endpoint_id, state, consecutive_failures, open_until, last_error)"
              " VALUES (%s, 'open', 20, now() + interval '5 minutes', 'HTTP 503')", (endpoints[0],))
    for n in range(12):
        owner, endpoint = (other, endpoints[2]) if n % 5 == 4 else (ws, endpoints[n % 2])
        event = world.event(owner, f"evt_{n}")
        status = ("pending", "delivered", "dead", "failed")[n % 4]
        delivery = world.delivery(owner, endpoint, event, status, attempt=n % 4, age=timedelta(hours=n))
        world.attempt(delivery, endpoint, 1, "http_5xx", 503, error="HTTP 503", excerpt="Service Unavailable")
        world.attempt(delivery, endpoint, 2, "timeout", None, error="TimeoutError")
    # An owner contact's mailed confirmation link (migration 0019): its token, stored as its hash.
    world.sql("UPDATE workspaces SET owner_contact = 'ops@acme.example' WHERE id = %s", (ws,))
    world.sql("INSERT INTO contact_confirmations (workspace_id, address, sent_at, token_hash)"
              " VALUES (%s, 'ops@acme.example', now(), %s)", (ws, token_hash(CONFIRM_TOKEN)))
    known = {"delivery_id": world.sql("SELECT min(id) FROM webhook_deliveries WHERE workspace_id = %s", (ws,))[0][0],
             "endpoint_id": endpoints[0], "event_id": "evt_0",
             "job_id": world.sql("INSERT INTO replay_jobs (workspace_id, request_key, fingerprint, since, statuses,"
                                 " total, replay_units, max_id) VALUES (%s, 'k', 'f', now() - interval '1 hour',"
                                 " '{dead}', 0, 0, 0) RETURNING id", (ws,))[0][0]}
    return world.token(ws), known


# Valid bodies the generator would almost never write (a registrable URL).
KNOWN_BODIES = {"POST /v2/webhooks/endpoints": {"url": "https://hooks.example.test/in"}}
# Valid query strings the generator would never write: a confirmation link's token that exists.
CONFIRM_TOKEN = "fuzz-known-confirmation-token"
KNOWN_QUERIES = {f"{method} /v2/contacts/confirm": {"token": CONFIRM_TOKEN} for method in ("GET", "POST")}


def _strategy(operation: Any, mode: GenerationMode, known: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Generated requests, plus (for valid ones) the same with path ids that exist.

    Random ids and event ids almost never name a seeded row; mixing in real
    ones makes the fuzzer reach the 200 paths and their response schemas too.
    """
    generated = operation.as_strategy(generation_mode=mode)
    names = {p.name for p in operation.path_parameters}
    if mode is GenerationMode.NEGATIVE:
        return generated
    if operation.label in KNOWN_BODIES:
        return st.one_of(generated, operation.as_strategy(generation_mode=mode, body=KNOWN_BODIES[operation.label]))
    if operation.label in KNOWN_QUERIES:
        return st.one_of(generated, operation.as_strategy(generation_mode=mode, query=KNOWN_QUERIES[operation.label]))
    if not names:
        return generated
    real = operation.as_strategy(generation_mode=mode, path_parameters={k: known[k] for k in names})
    return st.one_of(generated, real)


def _run(operation: Any, mode: GenerationMode, app: falcon.App, headers: dict[str, str],
         known: dict[str, Any], seen: Counter[tuple[str, str, int]]) -> None:
    checks = CHECKS + ([negative_data_rejection] if mode is GenerationMode.NEGATIVE else [])

    @given(case=_strategy(operation, mode, known))
    @settings(max_examples=EXAMPLES[mode], derandomize=True, database=None, deadline=None,
              phases=[Phase.generate, Phase.shrink], suppress_health_check=list(HealthCheck))
    def fuzz(case: schemathesis.Case) -> None:
        response = case.call_and_validate(app=app, headers=headers, checks=checks)
        seen[(operation.label, mode.value, response.status_code)] += 1

    fuzz()


def test_fuzz_every_operation_finds_no_5xx_and_only_documented_responses(db, write_config) -> None:
    world = World(db)
    app = create_app(load_config(write_config(db), env={}), db.dsn)
    token, known = _seed(world)
    headers = {"Authorization": f"Bearer {token}"}
    failures: list[str] = []
    seen: Counter[tuple[str, str, int]] = Counter()
    operations = [result.ok() for result in SCHEMA.get_all_operations()]
    # 0019 added the contact confirmation page and its POST; 0021 bulk replay's POST and GET;
    # 0020 pause and resume.
    assert len(operations) == 26
    # Deactivating (PATCH) or deleting the seeded endpoint early would leave
    # every later operation on it a 409 or 404: those two run last.
    operations.sort(key=lambda op: ("PATCH", "DELETE").index(op.method.upper()) + 1
                    if op.method.upper() in ("PATCH", "DELETE") else 0)
    try:
        for operation in operations:
            # Negative mode needs an input to break; three operations take none.
            modes = [m for m in EXAMPLES if m is GenerationMode.POSITIVE or list(operation.iter_parameters())
                     or operation.body]
            for mode in modes:
                try:
                    _run(operation, mode, app, headers, known, seen)
                except Exception as exc:  # collect every operation's failure, then report them all
                    failures.append(f"{operation.label} [{mode.value}]: {exc}")
    finally:
        app.pool.close()
        world.conn.close()
    assert not failures, "\n\n".join(failures)
    # The run reached the database's happy paths, not only the 4xx branches.
    succeeded = {label for (label, mode, status), _ in seen.items() if mode == "positive" and status < 300}
    assert succeeded == {op.label for op in operations}, "\n".join(map(str, sorted(seen.items())))
