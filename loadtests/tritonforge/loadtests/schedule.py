"""The load shapes as plain arithmetic: users wanted at a time into the run (no Locust)."""

from __future__ import annotations

import math

__all__ = ["shape_target"]


def shape_target(shape: str, t: float, users: int, run_time: float | None, *,
                 ramp_seconds: float = 0.0, step_users: int = 1,
                 step_seconds: float = 10.0) -> int | None:
    """Users wanted ``t`` seconds into the run (``None``: the run is over)."""
    if run_time and t >= run_time:
        return None
    if shape == "ramp":
        ramp = ramp_seconds or ((run_time / 4) if run_time else 30.0)
        if run_time and t >= run_time - ramp:
            frac = (run_time - t) / ramp
        else:
            frac = min(1.0, t / ramp) if ramp > 0 else 1.0
        return max(1, min(users, math.ceil(users * frac)))
    if shape == "step":
        return min(users, step_users * (1 + int(t // step_seconds)))
    return users
