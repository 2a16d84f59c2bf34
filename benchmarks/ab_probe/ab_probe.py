"""The probe of ``benchmarks/ab_check.py``: the seed tutorial's MLP, made slower in the variant whose
environment sets AB_PROBE=on, in one of two ways chosen by the config's ``change``:

- ``kernel``: one more small kernel per call (an in-place add of zero to the output), on the GPU
  side: replay and GPU time move, eager a little (one launch more);
- ``host``: about 10% more host work per call (a 4 us spin before the layers): eager moves, replay
  and GPU time do not (a graph replays kernels only).

Either way the outputs equal the base variant's, so the comparison is made. Both configs run in the
same A/B run as the default suite, for which the two variants are identical.
"""

import os
import time

import torch

from replaybench.workload import Built, Workload

HOST_WORK_S = 4e-6  # about 10% of the seed MLP's eager call on an H200 host (36-40 us)


def build(params, device, dtype):
    width = params["width"]
    model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, width))
    model = model.to(device=device, dtype=dtype).eval().requires_grad_(False)
    x = torch.randn(params["batch_size"], width, device=device, dtype=dtype)
    changed = os.environ.get("AB_PROBE") == "on"
    if changed and params["change"] == "kernel":
        def fn(x):
            return model(x).add_(0.0)
    elif changed and params["change"] == "host":
        def fn(x):
            end = time.perf_counter() + HOST_WORK_S
            while time.perf_counter() < end:
                pass
            return model(x)
    else:
        fn = model
    return Built(fn=fn, inputs=(x,))


WORKLOAD = Workload(
    name="ab_probe",
    description="The seed MLP; with AB_PROBE=on, one kernel more a call (change=kernel) or about 10% more host work (change=host)",
    build=build,
    grid={"batch_size": [1], "dtype": ["float32"], "width": [128], "change": ["kernel", "host"]},
)
