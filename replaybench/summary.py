"""One-line summaries of a measured config, for logs and the terminal."""

from __future__ import annotations

from .results import ConfigResult


def one_line(result: ConfigResult) -> str:
    label = result.workload + "(" + ", ".join(f"{k}={v}" for k, v in sorted(result.params.items())) + ")"
    parts = []
    for m in result.modes:
        if m.status == "ok" and m.throughput:
            text = f"{m.mode} {m.throughput.value * 1e6:.1f} us"
            if m.speedup is not None:
                text += f" ({m.speedup:.2f}x [{m.speedup_ci_low:.2f}, {m.speedup_ci_high:.2f}])"
            parts.append(text)
        else:
            parts.append(f"{m.mode} {m.status}: {m.reason}")
    return f"{label}: " + "; ".join(parts)
