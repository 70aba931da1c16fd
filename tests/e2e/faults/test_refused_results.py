"""A result the database refuses must not stop the worker's result writing."""

from __future__ import annotations

from pathlib import Path

import pytest

from dispatcher_devtools.kit import SECRET, Dispatcher, produce, query, seed_workspace, status_counts, wait_until
from dispatcher_devtools.receiver import ReceiverProcess

pytestmark = pytest.mark.timeout(120)

# Stands in for any value Postgres might refuse (a constraint, an encoding
# problem no scrubber foresaw): attempts of one delivery may not carry an
# excerpt.  The worker has to isolate that result and keep recording the rest.
REFUSE_EXCERPT = """
CREATE FUNCTION refuse_excerpt() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.delivery_id = %(poisoned)s AND NEW.response_excerpt IS NOT NULL THEN
        RAISE EXCEPTION 'refused excerpt' USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER refuse_excerpt BEFORE INSERT ON webhook_delivery_attempts
    FOR EACH ROW EXECUTE FUNCTION refuse_excerpt();
"""


def test_a_refused_result_is_isolated_and_the_rest_are_recorded(db, write_config, tmp_path: Path) -> None:
    with ReceiverProcess(secrets=[SECRET]) as receiver:
        seed_workspace(db.dsn, "ws", [receiver.url("ok", "a")])
        config = write_config(db, workers={"processes": 1})
        produce(config, db.dsn, "ws", 20)
        (poisoned,), = query(db.dsn, "SELECT min(id) FROM webhook_deliveries")
        query(db.dsn, REFUSE_EXCERPT.replace("%(poisoned)s", str(poisoned)))
        with Dispatcher(config, tmp_path / "d.log") as dispatcher:
            wait_until(lambda: status_counts(db.dsn).get("delivered") == 20, message="all 20 recorded")
            produce(config, db.dsn, "ws", 5)
            wait_until(lambda: status_counts(db.dsn).get("delivered") == 25, message="later results recorded too")
        assert "refused a batch" in dispatcher.log()
        assert query(db.dsn, "SELECT response_excerpt IS NULL, error FROM webhook_delivery_attempts "
                             "WHERE delivery_id = %s", (poisoned,)) == [
            (True, "the attempt's error text could not be stored")]
        assert query(db.dsn, "SELECT count(*) FROM webhook_delivery_attempts WHERE response_excerpt IS NOT NULL"
                     ) == [(24,)]
