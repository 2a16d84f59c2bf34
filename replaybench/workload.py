"""What is measured: workload definitions, their parameter grids, and the registry that finds them.

A workload module defines one module-level ``WORKLOAD = Workload(...)``. Its ``build`` receives the
config's parameters, a device and a dtype, and returns a :class:`Built`: the callable to time and
its static inputs. Workloads are found in three places, in this order:

1. every module of the ``workloads`` package shipped with replaybench;
2. every ``*.py`` file in the directories listed in ``REPLAYBENCH_WORKLOADS_PATH`` (``os.pathsep``
   separated);
3. every entry point of the group ``replaybench.workloads`` (the entry point names a module or a
   ``Workload`` object).

A module that fails to import or defines no valid workload is reported by name with the reason and
does not stop the others from loading.
"""

from __future__ import annotations

import importlib
import importlib.util
import itertools
import json
import os
import sys
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Callable, Sequence

DTYPES = ("float32", "float16", "bfloat16")
MAX_BATCH_SIZE = 1 << 16
ENTRY_POINT_GROUP = "replaybench.workloads"
PATH_VARIABLE = "REPLAYBENCH_WORKLOADS_PATH"


class WorkloadError(ValueError):
    """A workload name, grid or parameter that cannot be used; the message says which and why."""


@dataclass
class Built:
    """What a workload's builder returns.

    ``fn(*inputs)`` is the call that is timed, eagerly and inside a CUDA graph; it must return a
    tensor or a tuple of tensors. ``inputs`` are static: a graph replays on the same storage, so new
    data is copied into them, never rebound. ``reset``, when given, restores any state the call
    mutates (a KV cache position, say) so that eager and graph outputs are compared from one state.
    """

    fn: Callable[..., Any]
    inputs: tuple
    reset: Callable[[], None] | None = None


@dataclass
class Workload:
    name: str
    description: str
    build: Callable[[dict[str, Any], Any, Any], Built]
    grid: dict[str, Sequence[Any]]
    default_grid: dict[str, Sequence[Any]] | None = None
    capturable: bool = True
    not_capturable_reason: str = ""
    source: str = ""
    # For capture plans (``replaybench plan``): build once for batches up to ``largest`` and return
    # ``at(batch_size) -> Built``, every batch size sharing the weights and state, each size's
    # inputs batch-first views or copies that a padded batch is copied into. Without it, ``build``
    # is called once per batch size under the same seed.
    build_sizes: Callable[[dict[str, Any], Any, Any, int], Callable[[int], Built]] | None = None

    def validate(self) -> None:
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise WorkloadError(f"workload name {self.name!r} must be a Python identifier")
        if not callable(self.build):
            raise WorkloadError(f"workload {self.name!r}: build is not callable")
        for label, grid in (("grid", self.grid), ("default_grid", self.default_grid)):
            if grid is None:
                continue
            if not isinstance(grid, dict) or not grid:
                raise WorkloadError(f"workload {self.name!r}: {label} must be a non-empty dict of lists")
            for key in ("batch_size", "dtype"):
                if key not in grid:
                    raise WorkloadError(f"workload {self.name!r}: {label} has no {key!r}")
            for key, values in grid.items():
                if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or not values:
                    raise WorkloadError(
                        f"workload {self.name!r}: {label}[{key!r}] must be a non-empty list"
                    )
            for value in grid["dtype"]:
                check_dtype(value)
            for value in grid["batch_size"]:
                check_batch_size(value)
        if self.default_grid is not None:
            for key, values in self.default_grid.items():
                if key not in self.grid:
                    raise WorkloadError(
                        f"workload {self.name!r}: default_grid key {key!r} is not in its grid"
                    )

    def declared(self, key: str, values: Sequence[Any]) -> list[Any]:
        """Values of a grid key other than batch size and dtype, each as its grid declares it: they
        must be among its declared values, and a value equal to one (``128.0`` for ``128``) is taken
        as the declared one, which the workload builds with and the run's labels and history name."""
        declared = self.grid[key]
        out = []
        for value in values:
            same = [d for d in declared if d == value and isinstance(d, bool) == isinstance(value, bool)]
            if not same:
                raise WorkloadError(f"{self.name}: {key}={value!r} is not one of its values ({', '.join(map(str, declared))})")
            out.append(same[0])
        return out

    def configs(self, narrow: dict[str, Sequence[Any]] | None = None, full: bool = False):
        """The configs of this workload's default grid (or full grid), narrowed by ``narrow``.

        A narrowing value outside the workload's grid is allowed for batch size and dtype (they are
        the user's to choose) but must be of the right kind; any other key's values must be among
        those its grid declares (an ad-hoc form must not ask for ten million steps).
        """
        grid = dict(self.grid if full or self.default_grid is None else self.default_grid)
        for key, values in (narrow or {}).items():
            if not values:
                continue
            if key not in self.grid:
                continue  # a size knob of another workload: it does not narrow this one
            if key == "dtype":
                values = [check_dtype(v) for v in values]
            elif key == "batch_size":
                values = [check_batch_size(v) for v in values]
            else:
                values = self.declared(key, values)
            grid[key] = list(values)
        keys = sorted(grid)
        for combo in itertools.product(*(grid[k] for k in keys)):
            yield BenchConfig(workload=self.name, params=dict(zip(keys, combo)))


@dataclass(frozen=True)
class BenchConfig:
    """One point of a workload's grid: what the measuring process is asked to measure."""

    workload: str
    params: dict[str, Any] = field(hash=False)

    @property
    def key(self) -> str:
        return f"{self.workload}:{params_json(self.params)}"

    @property
    def label(self) -> str:
        return f"{self.workload}(" + ", ".join(f"{k}={v}" for k, v in sorted(self.params.items())) + ")"


def params_json(params: dict[str, Any]) -> str:
    return json.dumps(params, sort_keys=True, separators=(",", ":"))


def check_dtype(value: Any) -> str:
    if value not in DTYPES:
        raise WorkloadError(f"unknown dtype {value!r}; choose from {', '.join(DTYPES)}")
    return value


def check_batch_size(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise WorkloadError(f"batch size {value!r} is not an integer")
    if value <= 0:
        raise WorkloadError(f"batch size must be at least 1, got {value}")
    if value > MAX_BATCH_SIZE:
        raise WorkloadError(f"batch size {value} is larger than the limit of {MAX_BATCH_SIZE}")
    return value


@dataclass
class Registry:
    workloads: dict[str, Workload]
    broken: dict[str, str]  # module or entry point name -> why it could not be loaded

    def get(self, name: str) -> Workload:
        try:
            return self.workloads[name]
        except KeyError:
            hint = f" ({name} failed to load: {self.broken[name]})" if name in self.broken else ""
            known = ", ".join(sorted(self.workloads)) or "none"
            others = (f"; {', '.join(sorted(self.broken))} could not be loaded (`replaybench workloads` says why)"
                      if self.broken and not hint else "")
            raise WorkloadError(f"unknown workload {name!r}{hint}; known workloads: {known}{others}") from None

    def names(self) -> list[str]:
        return sorted(self.workloads)


def _workload_from_module(module, source: str) -> Workload:
    workload = getattr(module, "WORKLOAD", None)
    if workload is None:
        raise WorkloadError("module defines no WORKLOAD")
    if not isinstance(workload, Workload):
        raise WorkloadError(f"WORKLOAD is a {type(workload).__name__}, not a replaybench Workload")
    workload.validate()
    workload.source = source
    return workload


def _load_file(path: Path):
    name = f"replaybench_user_workloads.{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _directory_candidates(directory):
    if not Path(directory).is_dir():  # a mistyped path is said where broken workloads are, not passed over
        def missing():
            raise WorkloadError(f"{str(directory)!r} is not a directory")

        yield str(directory), missing
        return
    for path in sorted(Path(directory).glob("*.py")):
        if not path.name.startswith("_"):
            yield path.stem, lambda p=path: _load_file(p)


def _candidates(extra_paths: Sequence[str | os.PathLike] = ()):
    """(label, loader) pairs for every place a workload may come from."""
    import workloads as builtin

    for path in sorted(Path(builtin.__file__).parent.glob("*.py")):
        if not path.name.startswith("_"):
            yield path.stem, lambda p=path: importlib.import_module(f"workloads.{p.stem}")
    dirs = [*extra_paths, *filter(None, os.environ.get(PATH_VARIABLE, "").split(os.pathsep))]
    for directory in dirs:
        yield from _directory_candidates(directory)
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        yield ep.name, ep.load


def load_registry(extra_paths: Sequence[str | os.PathLike] = (), shadowing: Sequence[str | os.PathLike] = ()) -> Registry:
    """Every workload found (see the module's docstring), and those that failed to load. Workloads
    in the ``shadowing`` directories (an A/B variant's) come first and replace same-named ones."""
    workloads: dict[str, Workload] = {}
    broken: dict[str, str] = {}
    shadowed: set[str] = set()
    sources = [(True, c) for d in shadowing for c in _directory_candidates(d)] + [(False, c) for c in _candidates(extra_paths)]
    for shadows, (label, load) in sources:
        if not shadows and label in broken and label in shadowed:
            continue  # the variant's own module of that name failed: never fall back to another
        try:
            loaded = load()
            source = getattr(loaded, "__name__", label)
            workload = loaded if isinstance(loaded, Workload) else _workload_from_module(loaded, source)
            workload.validate()
        except Exception as exc:  # a broken user module must not stop the others
            broken[label] = f"{type(exc).__name__}: {exc}"
            if shadows:
                shadowed.add(label)
            continue
        if workload.name in shadowed:
            continue
        if workload.name in workloads:
            broken[label] = f"duplicate workload name {workload.name!r} (also in {workloads[workload.name].source})"
            continue
        workloads[workload.name] = workload
        if shadows:
            shadowed.add(workload.name)
    return Registry(workloads, broken)


def expand(
    registry: Registry,
    names: Sequence[str] | None = None,
    narrow: dict[str, Sequence[Any]] | None = None,
    full: bool = False,
) -> list[BenchConfig]:
    """Every config to measure; raises WorkloadError before any measuring for bad input."""
    selected = [registry.get(n) for n in names] if names else [registry.workloads[n] for n in registry.names()]
    narrow = {k: v for k, v in (narrow or {}).items() if v}
    known_keys = {k for w in selected for k in w.grid}
    unknown = sorted(set(narrow) - known_keys)
    if unknown:
        raise WorkloadError(
            f"unknown parameter(s) {', '.join(unknown)} for the selected workloads; "
            f"known: {', '.join(sorted(known_keys))}"
        )
    # A workload or value named twice is one config, measured once.
    configs = list({(c.workload, c.key): c for w in selected for c in w.configs(narrow, full=full)}.values())
    if not configs:
        raise WorkloadError("the selection holds no config to measure")
    return configs
