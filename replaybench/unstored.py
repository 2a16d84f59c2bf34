"""Storing one config's measurement (or a capture plan), and keeping it where the database refuses it.

A ``DataError`` (a value too long for its column on PostgreSQL, say) is not a passing fault: no
retry stores those rows. The measurement, which may have taken minutes, is then written as JSON
beside the run's report (``<reports>/<run id>-unstored/``), the run's error says which config was
not stored, why and where it is, and the run goes on with its next config.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from pydantic import BaseModel

from .report import reports_dir
from .storage import NotStored, Store
from .workload import params_json


def store_result(store: Store, run_id: int, result: BaseModel, gpu: str | None = None, repeat: int = 0,
                 directory=None) -> str | None:
    """Store ``result`` (a ``ConfigResult``, or an A/B run's ``ABResult``) in run ``run_id``.
    Returns None once stored; where the database refuses its rows, the line that says so (for the
    log) after keeping the measurement as JSON and noting it in the run's error."""
    ab = hasattr(result, "comparisons")
    try:
        if ab:
            store.add_ab_result(run_id, result, gpu=gpu)
        else:
            store.add_result(run_id, result, gpu=gpu, repeat=repeat)
        return None
    except NotStored as exc:
        why = str(exc)
    config = result.config if ab else result
    label = f"{config.workload}({params_json(config.params)})"
    if len(label) > 200:
        label = label[:200] + "..."
    digest = hashlib.sha1(params_json(config.params).encode()).hexdigest()[:12]
    name = _safe(config.workload) + f"-{digest}" + (f"-repeat{repeat}" if repeat else "")
    body = {"run_id": run_id, "not_stored": why, "gpu": gpu, "repeat": repeat, "kind": type(result).__name__,
            "result": result.model_dump(mode="json")}
    return _kept(store, run_id, label, why, name, body, directory)


def store_plan(store: Store, run_id: int, data: dict, directory=None) -> str | None:
    """Store a capture plan's data (``replaybench.planning``) in run ``run_id``, or keep it as JSON
    beside the report where the database refuses it, as ``store_result`` does."""
    try:
        store.add_plan(run_id, data)
        return None
    except NotStored as exc:
        why = str(exc)
    name = "plan-" + _safe(data.get("workload", "workload"))
    body = {"run_id": run_id, "not_stored": why, "kind": "plan", "plan": data}
    return _kept(store, run_id, f"the capture plan of {str(data.get('label'))[:200]}", why, name, body, directory)


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:64]


def _kept(store: Store, run_id: int, label: str, why: str, name: str, body: dict, directory) -> str:
    try:
        path = keep(run_id, name, body, directory)
        line = f"{label} not stored ({why}); its measurement is kept in {path}"
    except OSError as exc:
        line = f"{label} not stored ({why}), nor written beside the report ({exc.strerror or exc})"
    store.note_not_stored(run_id, line)
    return line


def keep(run_id: int, name: str, body: dict, directory=None) -> Path:
    """Write ``body`` as JSON in ``<reports>/<run id>-unstored/<name>.json``; returns its path."""
    folder = reports_dir(directory) / f"{run_id}-unstored"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(body, indent=1), encoding="utf-8")
    tmp.replace(path)
    return path
