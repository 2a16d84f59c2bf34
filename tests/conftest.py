import os
from pathlib import Path

import pytest
import torch

FAULTS = Path(__file__).resolve().parent / "fault_workloads"
CUDA = torch.cuda.is_available()

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")


def pytest_collection_modifyitems(config, items):
    if CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def db_url(tmp_path):
    return f"sqlite:///{tmp_path / 'replaybench.db'}"


@pytest.fixture
def fault_registry():
    from replaybench.workload import load_registry

    return load_registry([FAULTS])


@pytest.fixture
def quick():
    """Settings that keep a CPU measurement under a second."""
    from replaybench.results import MeasureSettings

    return MeasureSettings(time_budget_s=0.2, block_s=0.002, warmup_iters=3, min_units=6)
