"""The operator's cap on a run's measuring time (``$REPLAYBENCH_MAX_RUN_S``, default 6 hours).

A run whose time budget alone passes the cap is refused before it starts
(``replaybench.params.Selection.configs``). While it runs, the cap is checked before each config:
once the configs it measured took the cap or more in all (each config from preparing to finishing,
a retry included; the shards of a sharded run together, through the store), no further config
starts. The config in progress when the cap is passed is finished and kept. The run is then stored
failed, with what it measured and the reason.
"""

from __future__ import annotations

from .params import MAX_RUN_VARIABLE, max_run_s
from .storage import Store


class CapReached(RuntimeError):
    """A run reached its measuring-time cap; the message says so, and what was not measured."""


class MeasuringCap:
    def __init__(self, store: Store, run_id: int, cap_s: float | None = None):
        self.store, self.run_id = store, run_id
        self.cap_s = max_run_s() if cap_s is None else cap_s
        self.unstored_s = 0.0  # measured here, but refused by the database (replaybench.unstored)

    def not_stored(self, result) -> None:
        """Count the time of a measurement the store refused, which the store cannot count."""
        config = getattr(result, "a", result)  # an A/B result: both variants measured it together
        self.unstored_s += config.measuring_s or 0.0

    def spent_s(self) -> float:
        return self.store.measuring_s(self.run_id) + self.unstored_s

    def check(self, left: int, what: str = "config(s)") -> None:
        """Raise ``CapReached`` where the run has measured for its cap, ``left`` ``what`` to go."""
        spent = self.spent_s()
        if spent >= self.cap_s:
            raise CapReached(f"measuring-time cap reached: the run measured for {spent:.1f} s, its cap is {self.cap_s:g} s "
                             f"(${MAX_RUN_VARIABLE}); {left} {what} not measured")
