"""Variants of the code under test, for A/B runs (``replaybench ab``).

A variant is a named way to start a measuring process: another workloads directory (say, a second
checkout of your model code), another Python interpreter (another virtual environment, with another
torch), environment variables, or any of these together. Variants are declared by the operator in a
TOML file on the measuring host, and runs name them: a form or a deployment parameter picks a name,
never a path, an interpreter or a variable, so an ad-hoc run cannot be a way to run arbitrary code::

    # variants.toml
    [variants.main]                                   # no keys: this interpreter, shipped workloads
    [variants.candidate]
    workloads = "/srv/checkouts/candidate/bench"      # its workloads shadow same-named ones
    python = "/srv/venvs/torch-nightly/bin/python"    # needs torch and pydantic
    env = { TORCH_CUDNN_V8_API_LRU_CACHE_LIMIT = "0" }

The file is ``--variants FILE``, else ``$REPLAYBENCH_VARIANTS``, else ``variants.toml`` in the
current directory.
"""

from __future__ import annotations

import os
import re
import subprocess
import tomllib
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

VARIANTS_VARIABLE = "REPLAYBENCH_VARIANTS"
DEFAULT_FILE = "variants.toml"
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
VariantName = Annotated[str, Field(pattern=NAME_PATTERN, description="a variant declared in the worker's variants file")]
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
# Variables that decide which code or GPU a measuring process uses: a variant changes code through
# `python` and `workloads`, where it is recorded, and the GPU is the worker's.
_RESERVED_ENV = {"PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "CUDA_VISIBLE_DEVICES", "LD_PRELOAD", "REPLAYBENCH_WORKLOADS_PATH"}


class VariantError(ValueError):
    """A variants file or a variant name that cannot be used; the message says why in one line."""


class Variant(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=NAME_PATTERN)
    workloads: Path | None = None
    python: Path | None = None
    env: dict[str, str] = Field(default_factory=dict, max_length=64)

    @field_validator("workloads", "python", mode="before")
    @classmethod
    def _given(cls, value):
        # An empty path is the current directory: `ab` would import every module where it was started.
        if isinstance(value, str) and not value.strip():
            raise ValueError("expected a path, got an empty one")
        return value

    @field_validator("workloads")
    @classmethod
    def _directory(cls, path: Path | None) -> Path | None:
        if path is not None and not path.expanduser().is_dir():
            what = "is not a directory" if path.expanduser().exists() else "does not exist"
            raise ValueError(f"workloads directory {str(path)!r} {what}")
        return path.expanduser().resolve() if path is not None else None

    @field_validator("python")
    @classmethod
    def _interpreter(cls, path: Path | None) -> Path | None:
        if path is None:
            return None
        path = path.expanduser()
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise ValueError(f"python {str(path)!r} is not an executable file")
        return path.absolute()  # not resolved: a virtual environment's python is a link that must stay one

    @field_validator("env")
    @classmethod
    def _variables(cls, env: dict[str, str]) -> dict[str, str]:
        for key, value in env.items():
            if not _ENV_NAME.match(key):
                raise ValueError(f"environment variable name {key!r} is not a plain name")
            if key in _RESERVED_ENV:
                raise ValueError(f"environment variable {key} cannot be set by a variant (use `python` or `workloads`)")
            if len(value) > 4096:
                raise ValueError(f"environment variable {key} is longer than 4096 characters")
        return env

    def describe(self) -> dict[str, str | None]:
        """What a run records of the variant: its settings and, where they can be read, the git
        commit of its workloads directory."""
        return {
            "name": self.name,
            "workloads": str(self.workloads) if self.workloads else None,
            "workloads_commit": _git_commit(self.workloads) if self.workloads else None,
            "python": str(self.python) if self.python else None,
            "env": ", ".join(f"{k}={v}" for k, v in sorted(self.env.items())) or None,
        }


def variants_file(path: str | os.PathLike | None = None) -> Path:
    return Path(path or os.environ.get(VARIANTS_VARIABLE) or DEFAULT_FILE)


def load_variants(path: str | os.PathLike | None = None) -> dict[str, Variant]:
    """Every variant declared in the variants file, checked; VariantError says what is wrong."""
    file = variants_file(path)
    try:
        data = tomllib.loads(file.read_text())
    except FileNotFoundError:
        raise VariantError(f"no variants file {str(file)!r} (declare variants there, or name the file with "
                           f"--variants or {VARIANTS_VARIABLE})") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise VariantError(f"cannot read variants file {str(file)!r}: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise VariantError(f"variants file {str(file)!r} is not valid TOML: {exc}") from None
    table = data.get("variants")
    extra = set(data) - {"variants"}
    if not isinstance(table, dict) or extra:
        raise VariantError(f"variants file {str(file)!r}: expected only [variants.NAME] tables")
    out: dict[str, Variant] = {}
    for name, spec in table.items():
        if not isinstance(spec, dict):
            raise VariantError(f"variants file {str(file)!r}: variants.{name} is not a table")
        try:
            out[name] = Variant(name=name, **spec)
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(p) for p in err["loc"])
            message = err["msg"].removeprefix("Value error, ")  # pydantic's prefix for a validator's own words
            raise VariantError(f"variants file {str(file)!r}, variant {name!r}, {where}: {message}") from None
    return out


def pick(variants: dict[str, Variant], a: str, b: str) -> tuple[Variant, Variant]:
    """The two variants of an A/B run, by name."""
    for name in (a, b):
        if name not in variants:
            known = ", ".join(sorted(variants)) or "none"
            raise VariantError(f"unknown variant {name!r}; declared variants: {known}")
    return variants[a], variants[b]


def declared_names(path: str | os.PathLike | None = None) -> list[str]:
    """Names declared in the variants file, or none where it cannot be read (for the run form)."""
    try:
        return sorted(load_variants(path))
    except VariantError:
        return []


def _git_commit(directory: Path) -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=directory, capture_output=True, text=True, timeout=5)
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "."], cwd=directory, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0 or not out.stdout.strip():
        return None
    return out.stdout.strip() + ("+dirty" if dirty.returncode == 0 and dirty.stdout.strip() else "")
