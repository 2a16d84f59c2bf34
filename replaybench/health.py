"""Host and GPU facts recorded with every run and measurement, so that a slow host or a throttled
GPU can be told from slow code. Nothing here imports Prefect; torch is imported only where needed.
"""

from __future__ import annotations

import os
import platform
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

# NVML clock-event reasons that mean the GPU ran slower than it could (idle and application-clock
# settings are not throttling).
_THROTTLE_REASONS = {
    0x4: "software power cap",
    0x8: "hardware slowdown",
    0x20: "software thermal slowdown",
    0x40: "hardware thermal slowdown",
    0x80: "power brake",
}


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def current_core() -> int | None:
    """The core this process is pinned to, or None when it may run on several."""
    if hasattr(os, "sched_getaffinity"):
        cores = os.sched_getaffinity(0)
        if len(cores) == 1:
            return next(iter(cores))
    return None


def pin_to_core(core: int | None) -> int | None:
    """Pin this process to ``core`` (default: the last core it may use). Returns the core, or None
    where the OS does not allow pinning."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    allowed = sorted(os.sched_getaffinity(0))
    chosen = allowed[-1] if core is None else core
    try:
        os.sched_setaffinity(0, {chosen})
    except OSError:
        return None
    return chosen


def git_commit() -> str | None:
    if os.environ.get("REPLAYBENCH_GIT_COMMIT"):
        return os.environ["REPLAYBENCH_GIT_COMMIT"]
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=5,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def host_facts() -> dict[str, Any]:
    from . import __version__

    return {
        "host": socket.gethostname(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "package_version": __version__,
        "git_commit": git_commit(),
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "executable": sys.executable,
    }


def torch_facts() -> dict[str, Any]:
    """Facts only the measuring process can know cheaply (it has torch and the GPU)."""
    import torch

    facts: dict[str, Any] = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
        "gpu_name": None,
        "gpu_driver": None,
        "gpu_count": 0,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }
    if torch.cuda.is_available():
        facts["gpu_name"] = torch.cuda.get_device_name()
        facts["gpu_count"] = torch.cuda.device_count()
        facts["gpu_driver"] = _nvml(lambda nv, h: nv.nvmlSystemGetDriverVersion())
        facts["gpu_uuid"] = _uuid()
    return facts


def _uuid() -> str | None:
    import torch

    uuid = getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "uuid", None)
    return f"GPU-{uuid}" if uuid else None


def _nvml(read, default=None):
    """Run ``read(pynvml, handle)`` for the GPU torch uses; ``default`` when NVML is unavailable."""
    try:
        import pynvml as nv

        nv.nvmlInit()
        try:
            uuid = _uuid()
            handle = nv.nvmlDeviceGetHandleByUUID(uuid) if uuid else nv.nvmlDeviceGetHandleByIndex(0)
            value = read(nv, handle)
            return value.decode() if isinstance(value, bytes) else value
        finally:
            nv.nvmlShutdown()
    except Exception:
        return default


def gpu_health() -> dict[str, Any] | None:
    """Clocks, temperature, power and throttle reasons of the GPU in use, through NVML."""

    def read(nv, h):
        try:
            reasons = nv.nvmlDeviceGetCurrentClocksEventReasons(h)
        except AttributeError:
            reasons = nv.nvmlDeviceGetCurrentClocksThrottleReasons(h)
        names = [name for bit, name in _THROTTLE_REASONS.items() if reasons & bit]
        return {
            "sm_clock_mhz": nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
            "mem_clock_mhz": nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM),
            "temperature_c": nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU),
            "power_w": nv.nvmlDeviceGetPowerUsage(h) / 1000,
            "clock_event_reasons": int(reasons),
            "throttle_reasons": names,
            "throttled": bool(names),
        }

    return _nvml(read, default={"nvml": "unavailable"})
