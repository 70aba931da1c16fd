"""Bulk replay jobs (issue 24, section 3), run by the region's upkeep leader.

A job is made by the API or the CLI (``store.replays.create_job``: counted,
paid and audited); this loop queues its rows, one batch per transaction,
pausing between batches (``rules.bulk_replay.BulkReplayPolicy``) so a large
job never floods the outbox or holds the workspace's replay lock for long.
Each batch moves the job's cursor in the transaction that queues its rows:
a batch cut short by a crash is rolled back whole and run again from the
same cursor, so no row is queued twice.  Jobs run one at a time, oldest
first.
"""

from __future__ import annotations

import logging

from dispatcher.rules.bulk_replay import BulkReplayPolicy
from dispatcher.store.replays import ReplayJobStore

log = logging.getLogger("dispatcher.replay")


class BulkReplayer:
    def __init__(self, store: ReplayJobStore, policy: BulkReplayPolicy) -> None:
        self._store = store
        self._policy = policy

    @property
    def policy(self) -> BulkReplayPolicy:
        return self._policy

    def run_once(self) -> bool:
        """Run one batch of the oldest running job; True if a job may have more to queue
        (the caller pauses ``policy.pause`` before the next), False when none is running."""
        job_id = self._store.next_job()
        if job_id is None:
            return False
        batch = self._store.run_batch(job_id, self._policy.batch_rows)
        if batch is None:
            return True  # finished by another process meanwhile: look for the next job
        if batch.done:
            log.info("bulk replay job %d done (%d rows queued by its last batch)", job_id, batch.queued)
        return True
