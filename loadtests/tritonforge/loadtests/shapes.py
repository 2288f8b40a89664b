"""Load shapes: constant, ramp, step -- one Locust shape class chosen by ``--shape``.

The shape reads Locust's own ``-u/--users``, ``-r/--spawn-rate`` and ``-t/--run-time``
(``use_common_options``), so the same flags (or the same ``--config`` file keys) drive
every shape:

* ``constant`` -- ``-u`` users started at ``-r`` per second, until ``-t``;
* ``ramp`` -- up from 0 to ``-u`` over ``--ramp-seconds`` (default a quarter of ``-t``),
  hold, and down to 0 over the same time before ``-t``;
* ``step`` -- ``--step-users`` more users every ``--step-seconds`` up to ``-u``, until ``-t``.
"""

from __future__ import annotations

from typing import Any

from locust import LoadTestShape
from tritonforge.loadtests.schedule import shape_target

__all__ = ["TritonForgeShape", "shape_target"]


class TritonForgeShape(LoadTestShape):
    """The shape named by ``--shape`` (see the module docstring)."""

    use_common_options = True

    def tick(self) -> tuple[int, float] | None:
        runner: Any = self.runner
        opts = runner.environment.parsed_options
        users = int(getattr(opts, "num_users", None) or 1)
        rate = float(getattr(opts, "spawn_rate", None) or 1.0)
        run_time = getattr(opts, "run_time", None)
        shape = str(getattr(opts, "shape", "constant"))
        elapsed = float(self.get_run_time())  # type: ignore[no-untyped-call]
        target = shape_target(
            shape, elapsed, users, float(run_time) if run_time else None,
            ramp_seconds=float(getattr(opts, "ramp_seconds", 0.0) or 0.0),
            step_users=int(getattr(opts, "step_users", 1) or 1),
            step_seconds=float(getattr(opts, "step_seconds", 10.0) or 10.0),
        )
        if target is None:
            return None
        if shape == "constant":
            return target, rate
        return target, max(rate, float(users))  # the shape sets the pace, not the spawn rate
