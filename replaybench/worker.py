"""The measuring process: timing never runs in the orchestrating process.

Long-lived child processes (a pool per GPU, see MeasuringPool; their main is ``replaybench.child``)
import torch and start CUDA once, pin themselves to one core each, and measure configs sent to them
over a pipe. The parent enforces a per-config timeout (a hung kernel cannot be interrupted from
Python, so the child is killed), replaces the child after a crash or a sticky CUDA error, and
retries a crashed measurement once in a fresh process. A process may run a variant of the code
under test (``replaybench.variants``): another interpreter, workloads directory or environment.
"""

from __future__ import annotations

import atexit
import json
import multiprocessing as mp
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .analysis import Units, assemble, interim
from .results import ConfigResult, MeasureSettings, ModeResult
from .stats import StoppingRule
from .variants import Variant, VariantError
from .workload import BenchConfig

DEFAULT_TIMEOUT_S = 600.0
GPU_VARIABLE = "REPLAYBENCH_GPU"  # the host's index of the GPU this process measures on
UNITS_PER_ROUND = 2  # timed units a process runs before the next process takes its turn
STARTUP_TIMEOUT_S = 300.0


def _signal_name(exitcode: int | None) -> str:
    if exitcode is None:
        return "unknown"
    if exitcode < 0:
        try:
            return signal.Signals(-exitcode).name
        except ValueError:
            return f"signal {-exitcode}"
    return f"exit code {exitcode}"


_PACKAGE_LINKS: str | None = None
LIVE: set[subprocess.Popen] = set()  # every measuring process started here and not yet reaped


def kill_all() -> None:
    """Kill every measuring process of this process at once (a second Ctrl-C)."""
    for process in list(LIVE):
        if process.poll() is None:
            process.kill()


def package_links() -> str:
    """A directory holding only links to this replaybench and its shipped workloads: the one entry
    a measuring process needs on its path, whatever interpreter runs it."""
    global _PACKAGE_LINKS
    if _PACKAGE_LINKS is None:
        import workloads

        directory = tempfile.mkdtemp(prefix="replaybench-path-")
        atexit.register(shutil.rmtree, directory, True)
        for package in (Path(__file__).resolve().parent, Path(workloads.__file__).resolve().parent):
            os.symlink(package, os.path.join(directory, package.name))
        _PACKAGE_LINKS = directory
    return _PACKAGE_LINKS


def child_interpreter(variant: Variant | None) -> tuple[str, dict[str, str]]:
    """The interpreter a measuring process of ``variant`` runs in, and its environment."""
    python = str(variant.python) if variant and variant.python else sys.executable
    env = {**os.environ, **(variant.env if variant else {})}
    # Another interpreter brings its own packages: it gets none of this one's path.
    inherited = env.get("PYTHONPATH") if python == sys.executable else None
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_links(), inherited]))
    return python, env


PROBE_TIMEOUT_S = 120.0  # importing torch from a cold disk; a hung interpreter is not waited on for long
_PROVEN: set[tuple] = set()  # interpreters (with their variant's environment) this process has seen pass the probe


def check_interpreter(variant: Variant) -> None:
    """A variant's own interpreter, proven able to run a measuring process (replaybench's engine and
    torch import) before a run is stored; VariantError naming what it lacks. This interpreter runs
    one already, so a variant without ``python`` is not tried; one proven in this process is not
    tried again (the CLI's check, then its flow's)."""
    if variant.python is None:
        return
    python, env = child_interpreter(variant)
    proof = (python, tuple(sorted(variant.env.items())))  # not all of os.environ: the CLI adds its settings
    if proof in _PROVEN:
        return
    probe = "import replaybench.child, replaybench.engine, torch; print('torch', torch.__version__)"
    try:
        out = subprocess.run([python, "-c", probe], env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                             timeout=PROBE_TIMEOUT_S)
        lines = out.stderr.strip().splitlines()
        why = (lines[-1] if lines else f"exit status {out.returncode}") if out.returncode else (
            None if out.stdout.startswith("torch ") else "it ran, but not as a Python interpreter")
    except (OSError, subprocess.SubprocessError, UnicodeDecodeError) as exc:
        why = str(exc)
    if why:
        raise VariantError(f"variant {variant.name!r}: its python {python} cannot run a measuring process: {why[:300]}")
    _PROVEN.add(proof)


def _join(process: subprocess.Popen | None, timeout_s: float) -> None:
    try:
        if process is not None:
            process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        pass


class MeasuringProcess:
    """Parent-side handle; use as a context manager. With a ``variant``, the process runs its
    interpreter, its workloads (shadowing same-named ones) and its environment variables."""

    def __init__(
        self,
        core: int | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        extra_workload_paths: list[str] | None = None,
        variant: Variant | None = None,
    ):
        self.core = core
        self.timeout_s = timeout_s
        self.extra_paths = [str(p) for p in extra_workload_paths or []]
        self.variant = variant
        self.process: subprocess.Popen | None = None
        self.conn = None
        self.environment: dict[str, Any] = {}
        self.starts = 0

    def __enter__(self) -> "MeasuringProcess":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> dict[str, Any]:
        self.launch()
        return self.wait_ready()

    def launch(self) -> None:
        """Start the process (a fresh interpreter: never fork one that may hold a CUDA context)."""
        self.conn, child = mp.Pipe()
        self.trace_path = os.path.join(tempfile.mkdtemp(prefix="replaybench-"), "stack.txt")
        variant = self.variant
        python, env = child_interpreter(variant)
        settings = {
            "fd": child.fileno(), "core": self.core, "workload_paths": self.extra_paths,
            "shadowing": [str(variant.workloads)] if variant and variant.workloads else [],
            "trace_path": self.trace_path, "parent": os.getpid(),
        }
        try:
            self.process = subprocess.Popen([python, "-m", "replaybench.child", json.dumps(settings)],
                                            pass_fds=(child.fileno(),), env=env)
        finally:
            child.close()
        LIVE.add(self.process)
        self.starts += 1

    def wait_ready(self) -> dict[str, Any]:
        if not self.conn.poll(STARTUP_TIMEOUT_S):
            self.kill()
            raise RuntimeError(f"the measuring process did not start within {STARTUP_TIMEOUT_S:.0f} s")
        try:
            _, self.environment = self.conn.recv()
        except (EOFError, ConnectionResetError):
            _join(self.process, 5)
            code = self.process.returncode
            python = self.variant.python if self.variant and self.variant.python else sys.executable
            raise RuntimeError(f"the measuring process ({python}) died while starting ({_signal_name(code)})") from None
        return self.environment

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def where_stuck(self) -> str:
        """', stuck in FUNCTION (FILE:LINE)' from the child's own stack, or '' if it cannot say."""
        if not (self.alive and hasattr(signal, "SIGUSR1")):
            return ""
        os.kill(self.process.pid, signal.SIGUSR1)
        deadline = time.monotonic() + 2
        frames: list[str] = []
        while time.monotonic() < deadline and not frames:
            time.sleep(0.1)
            try:
                with open(self.trace_path) as f:
                    frames = [ln.strip() for ln in f if ln.strip().startswith("File ")]
            except OSError:
                pass
        if not frames:
            return ""
        # 'File "/x/y.py", line 17 in forward' -> 'forward (y.py:17)'
        m = re.match(r'File "(.+)", line (\d+) in (.+)', frames[0])
        return f", stuck in {m.group(3)} ({os.path.basename(m.group(1))}:{m.group(2)})" if m else ""

    def kill(self) -> None:
        if self.alive:
            self.process.kill()
            _join(self.process, 10)
        LIVE.discard(self.process)
        if self.conn is not None:
            self.conn.close()
        if getattr(self, "trace_path", None):
            shutil.rmtree(os.path.dirname(self.trace_path), ignore_errors=True)
        self.process = self.conn = None

    def close(self) -> None:
        self.ask_to_exit()
        if self.alive:
            _join(self.process, 10)
        self.kill()

    def ask_to_exit(self) -> None:
        if self.alive:
            try:
                self.conn.send(None)
            except (OSError, BrokenPipeError):
                pass

    def request(self, message: tuple, deadline: float) -> dict[str, Any]:
        """Send one request and wait for its reply until ``deadline`` (time.monotonic()). A process
        that does not answer in time is killed (``Stuck``); one that dies is ``Died``."""
        if not self.alive:
            self.start()
        started = time.monotonic()
        self.conn.send(message)
        if not self.conn.poll(max(deadline - time.monotonic(), 0)):
            where = self.where_stuck()
            self.kill()
            raise Stuck(where)
        try:
            reply = self.conn.recv()
        except (EOFError, ConnectionResetError, OSError):
            _join(self.process, 10)
            code = self.process.returncode
            self.kill()
            raise Died(f"the measuring process died ({_signal_name(code)}) after {time.monotonic() - started:.1f} s") from None
        if reply.get("process_unusable"):
            _join(self.process, 30)
            self.kill()
        return reply

    def measure(self, config: BenchConfig, settings: MeasureSettings, timeout_s: float | None = None) -> ConfigResult:
        """Measure one config in this process alone."""
        return measure_in([self], config, settings, self.timeout_s if timeout_s is None else timeout_s)


class Stuck(Exception):
    """A measuring process gave no reply in time and was killed; the message says where it was."""


class Died(Exception):
    """A measuring process died while measuring; the message says how."""


def measure_in(members: list[MeasuringProcess], config: BenchConfig, settings: MeasureSettings, timeout_s: float) -> ConfigResult:
    """Measure one config with these measuring processes, within ``timeout_s``: a process that
    dies is replaced and the config measured again from the start, once. The result's
    ``measuring_s`` is the whole time it took, a retry or a timeout included."""
    began = time.monotonic()
    result = _measure_twice(members, config, settings, timeout_s)
    result.measuring_s = time.monotonic() - began
    return result


def _measure_twice(members, config, settings, timeout_s) -> ConfigResult:
    reason = ""
    for attempt in (1, 2):
        deadline = time.monotonic() + timeout_s
        try:
            result = _measure_once(members, config, settings, deadline)
            result.attempts = attempt
            return result
        except Stuck as exc:
            _release(members)
            return crashed(config, settings, f"timed out: no result within {timeout_s:g} s; the measuring process was killed{exc}", attempt)
        except Died as exc:
            _release(members)
            reason = str(exc)
    return crashed(config, settings, reason + "; retried once in a fresh process, which died too", 2)


def _measure_once(members, config, settings, deadline) -> ConfigResult:
    """Prepare the config in each process (stopping at the first that fails a mode: a failure is
    deterministic and not repeated), time rounds in each process in turn until the stopping rule
    over the reported figures is met, then finish in each."""
    started = time.monotonic()
    prepared, reports = prepare_in(members, config, settings, deadline)
    timed = [m for m in settings.modes if all(m in r["timed"] for r in reports)]
    units, completed = time_rounds(prepared, timed, settings, deadline, reports, lambda units: interim(units, timed),
                                   settle=True)
    finishes = finish_in(prepared, timed if completed else [], deadline)
    return assemble(config, settings, reports, units, finishes, cpu_cores=[m.core for m in prepared],
                    measuring_s=time.monotonic() - started)


def prepare_in(members, config, settings, deadline, options: dict | None = None, whole: bool = False) -> tuple[list, list[dict]]:
    """Prepare the config in each process until one fails a mode (a failure is deterministic: not
    repeated), or with ``whole`` until one can time nothing; returns the processes prepared and
    their reports. ``options`` are handed to the first process's session (``engine.Session``)."""
    prepared, reports = [], []
    for i, member in enumerate(members):
        message = ("prepare", config, settings, options) if options and i == 0 else ("prepare", config, settings)
        report = member.request(message, deadline)
        prepared.append(member)
        reports.append(report)
        if (report["failed"] and not whole) or report["process_unusable"] or not report["timed"]:
            break
    return prepared, reports


def time_rounds(members, timed, settings, deadline, reports: list[dict], estimates, order=None,
                settle: bool = False) -> tuple[list[Units], bool]:
    """Rounds of timed units in each process in turn until ``settings``' stopping rule is met over
    ``estimates(units)`` (the reported estimates and each process's kept units); and whether they
    completed. ``order(r)``, if given, lists the members' indices in the order they time round r;
    ``settle`` is the rule's (``replaybench.stats.StoppingRule``).
    A process whose timing fails appends its reply to ``reports`` and ends the rounds."""
    units = [Units() for _ in members]
    rule = StoppingRule(settings.precision, settings.min_units, settings.time_budget_s, settle)
    started = time.monotonic()
    r = 0
    while timed:
        for i in order(r) if order else range(len(members)):
            reply = members[i].request(("round", UNITS_PER_ROUND, timed), deadline)
            if "units" not in reply:  # timing failed in that process: its modes say why
                reports.append(reply)
                return units, False
            units[i].add(reply["units"])
        r += 1
        if rule.done(*estimates(units), time.monotonic() - started):
            break
    return units, True


def finish_in(members, timed, deadline) -> list[dict]:
    return [member.request(("finish", timed), deadline) for member in members if member.alive]


def _release(members: list[MeasuringProcess]) -> None:
    """After a process died or was killed mid-config, free the config in the others."""
    for member in members:
        if member.alive:
            try:
                member.request(("release",), time.monotonic() + 30)
            except (Stuck, Died):
                pass


class ProcessGroup:
    """Measuring processes started in parallel (each pays torch's import and CUDA's start-up at
    once) and closed together; ``members`` are set by the subclass."""

    members: list[MeasuringProcess]

    def __enter__(self):
        for m in self.members:
            m.launch()
        try:
            for m in self.members:
                m.wait_ready()
        except BaseException:
            self.kill()  # still starting, deaf to signals: no use waiting for them
            raise
        return self

    def __exit__(self, exc_type, *exc) -> None:
        if exc_type is not None:  # interrupted, or failing: no use waiting for a graceful end
            self.kill()
        self.close()

    def kill(self) -> None:
        for m in self.members:
            m.kill()

    def close(self) -> None:
        close_all(self.members)


class MeasuringPool(ProcessGroup):
    """The measuring processes of one GPU: each pinned to its own core, started in parallel once
    per run, timing in turn, never at once.

    A config is prepared in every process and timed in short rounds, one process after the other,
    until the stopping rule over the reported figures is met (``replaybench.stats.StoppingRule``):
    each config's figures rest on several host states (cores, times), and the spread between
    processes is part of every interval. A config that fails a mode in one process is not repeated
    in the others.
    """

    def __init__(
        self,
        processes: int = 1,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        extra_workload_paths: list[str] | None = None,
    ):
        if processes < 1:
            raise ValueError("at least one measuring process")
        cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [None]
        chosen = measuring_cores(cores, processes, gpu_slot())
        self.members = [MeasuringProcess(c, timeout_s, extra_workload_paths) for c in chosen]
        self.timeout_s = timeout_s

    @property
    def environment(self) -> dict[str, Any]:
        return {**self.members[0].environment, "cpu_cores": [m.core for m in self.members], "processes": len(self.members)}

    def measure(self, config: BenchConfig, settings: MeasureSettings, timeout_s: float | None = None) -> ConfigResult:
        return measure_in(self.members, config, settings, self.timeout_s if timeout_s is None else timeout_s)


def close_all(members: list[MeasuringProcess]) -> None:
    """Ask every process to exit, then wait: they tear CUDA down at once, not one after another."""
    for m in members:
        m.ask_to_exit()
    for m in members:
        m.close()


def gpu_slot() -> int:
    """Which GPU of the host this process measures on: $REPLAYBENCH_GPU, the host's index of it (as
    `replaybench worker --gpu N` sets it: in a container that sees one GPU, that GPU is device 0
    whatever its index on the host), else the index in CUDA_VISIBLE_DEVICES when it names one GPU
    by number, else 0."""
    for variable in (GPU_VARIABLE, "CUDA_VISIBLE_DEVICES"):
        value = os.environ.get(variable, "").strip()
        if value.isdigit():
            return int(value)
    return 0


def measuring_cores(cores: list, processes: int, slot: int = 0) -> list:
    """Cores for the measuring processes of GPU ``slot``, counted from the last core down, so that
    the workers of several GPUs on one host do not share cores, and the low cores, where the OS
    and the orchestrating processes tend to run, are the last to be used."""
    return [cores[-1 - (slot * processes + i) % len(cores)] for i in range(processes)]


def crashed(config: BenchConfig, settings: MeasureSettings, reason: str, attempts: int) -> ConfigResult:
    return ConfigResult(
        workload=config.workload,
        params=config.params,
        device="unknown",
        modes=[ModeResult(mode=m, status="crashed", phase="process", reason=reason) for m in settings.modes],
        attempts=attempts,
    )
