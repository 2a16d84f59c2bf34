"""Several processes storing results into one SQLite file at once: no lost rows, no lock errors."""

import multiprocessing as mp
import os
import time

import pytest

from replaybench.storage import Store

pytestmark = pytest.mark.slow

SECONDS = float(os.environ.get("REPLAYBENCH_CONCURRENCY_SECONDS", "60"))


def writer(url: str, run_id: int, seconds: float, queue) -> None:
    from tests.helpers import known_result

    store = Store(url, migrate=False)
    stored, errors = 0, []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            stored += len(store.add_result(run_id, known_result()))
        except Exception as exc:  # counted, and the test fails on any
            errors.append(f"{type(exc).__name__}: {exc}")
    queue.put((stored, errors))


def test_four_processes_writing_for_a_minute_lose_nothing(db_url):
    store = Store(db_url)
    run_id = store.create_run("cli", {})
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=writer, args=(db_url, run_id, SECONDS, queue)) for _ in range(4)]
    for p in procs:
        p.start()
    reports = [queue.get(timeout=SECONDS + 120) for _ in procs]
    for p in procs:
        p.join(30)
    errors = [e for _, errs in reports for e in errs]
    assert errors == []
    stored = sum(n for n, _ in reports)
    assert all(n > 0 for n, _ in reports)
    assert len(store.run(run_id).results) == stored
