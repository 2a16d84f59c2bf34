"""The measuring process: isolation, timeouts, crashes and retries (real child processes)."""

import os

import pytest

from replaybench.worker import MeasuringProcess, gpu_slot, measuring_cores
from replaybench.workload import BenchConfig

from .conftest import FAULTS

pytestmark = pytest.mark.slow

ONE = {"batch_size": 1, "dtype": "float32"}
SEED = BenchConfig("seed_mlp", {**ONE, "width": 128})


@pytest.fixture
def process():
    with MeasuringProcess(timeout_s=60, extra_workload_paths=[FAULTS]) as p:
        yield p


def test_measures_in_a_pinned_child_process(process, quick):
    assert process.process.pid != os.getpid()
    assert process.environment["torch"]
    result = process.measure(SEED, quick)
    assert result.mode("eager").status == "ok"
    if hasattr(os, "sched_setaffinity"):
        assert result.cpu_core == process.environment["cpu_core"] == max(os.sched_getaffinity(0))
    # The same process serves the next config: torch import and start-up are paid once.
    pid = process.process.pid
    assert process.measure(SEED, quick).mode("eager").status == "ok"
    assert process.process.pid == pid and process.starts == 1


def test_a_hang_is_killed_at_the_timeout_and_the_next_config_still_measures(process, quick):
    result = process.measure(BenchConfig("fault_hang", ONE), quick, timeout_s=3)
    assert {m.status for m in result.modes} == {"crashed"}
    assert "timed out: no result within 3 s" in result.modes[0].reason
    assert "stuck in forward (fault_hang.py:" in result.modes[0].reason
    assert process.measure(SEED, quick).mode("eager").status == "ok"
    assert process.starts == 2


@pytest.mark.parametrize("name, signal", [("fault_kill", "SIGKILL"), ("fault_segfault", "SIGSEGV")])
def test_a_crash_is_retried_once_then_recorded(process, quick, name, signal):
    result = process.measure(BenchConfig(name, ONE), quick)
    assert result.attempts == 2
    assert {m.status for m in result.modes} == {"crashed"}
    assert f"the measuring process died ({signal})" in result.modes[0].reason
    assert "retried once" in result.modes[0].reason
    assert process.measure(SEED, quick).mode("eager").status == "ok"


def test_a_pool_times_each_config_in_every_process_in_turn(quick):
    from replaybench.worker import MeasuringPool

    with MeasuringPool(2, timeout_s=60, extra_workload_paths=[FAULTS]) as pool:
        assert len({m.process.pid for m in pool.members}) == 2
        result = pool.measure(SEED, quick)
        eager = result.mode("eager")
        assert eager.status == "ok"
        assert len(eager.throughput.per_process) == 2
        t = eager.throughput
        assert sum(t.per_process) == len(t.blocks) == len(t.kept) and t.n == sum(t.kept)
        # Timed in turn: each process's units, bracketed by the host reference, in its own part.
        assert t.per_process[0] == t.per_process[1] and [len(b) for b in result.host.before] == t.per_process
        assert len(result.cpu_cores) == 2
        # A deterministic failure is not repeated in the second process.
        failed = pool.measure(BenchConfig("fault_forward_error", ONE), quick)
        assert {m.status for m in failed.modes} == {"failed"} and len(failed.cpu_cores) == 1


def test_workers_of_different_gpus_measure_on_different_cores(monkeypatch):
    monkeypatch.delenv("REPLAYBENCH_GPU", raising=False)
    cores = list(range(16))
    assert measuring_cores(cores, 3) == [15, 14, 13]
    assert measuring_cores(cores, 3, slot=1) == [12, 11, 10]
    assert measuring_cores([0, 1], 3) == [1, 0, 1]  # fewer cores than processes: shared, in turn
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2")
    assert gpu_slot() == 2
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    assert gpu_slot() == 0
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert gpu_slot() == 0
    # A container sees its one GPU as device 0: the host's index, set by `replaybench worker`, decides.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monkeypatch.setenv("REPLAYBENCH_GPU", "3")
    assert gpu_slot() == 3


ORPHANED = """
import sys, time
from replaybench.worker import MeasuringProcess
from replaybench.workload import BenchConfig
from replaybench.results import MeasureSettings

process = MeasuringProcess(timeout_s=600, extra_workload_paths=[sys.argv[1]])
process.start()
print(process.process.pid, flush=True)
process.measure(BenchConfig("fault_hang", {"batch_size": 1, "dtype": "float32"}), MeasureSettings())
"""


def test_a_measuring_process_ends_with_its_orchestrating_process_when_that_is_killed(tmp_path):
    # SIGKILL leaves the orchestrating process no way to kill its measuring process, which was busy
    # in a hung forward and ignores SIGINT and SIGTERM: it must end by itself, not at its timeout.
    import signal
    import subprocess
    import sys
    import time

    from flows.supervise import alive

    parent = subprocess.Popen([sys.executable, "-c", ORPHANED, FAULTS], stdout=subprocess.PIPE, text=True,
                              cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    child = int(parent.stdout.readline())
    time.sleep(3)  # into the hung forward
    assert alive(child)
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 10
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    still = alive(child)
    if still:
        os.kill(child, signal.SIGKILL)
    assert not still, "the measuring process outlived its orchestrating process"
