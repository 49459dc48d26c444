"""Is a timing trustworthy? The spread of a model's repeated passes, and the load of the machine.

On a shared machine one burst of other work can make a model look many times slower or faster than it is
(a teacher once timed at 2,982 ms against its usual 28 ms, making its int8 copy "52× faster"). As pyperf does,
a measurement is checked rather than taken at face value:

- **spread**: (p90 − median) / median of one model's timed passes (those of :data:`MIN_JUDGED_MS` or more);
  above :data:`MAX_SPREAD` its median is not a steady figure;
- **load**: the machine's 1-minute load average before and after the measurement; above
  :data:`MAX_LOAD_PER_CPU` × the CPUs this process may use, other work was competing for them.

An unstable latency measurement is repeated, up to :data:`ROUNDS` rounds in all, and the steadiest round is
kept; what is still unstable is flagged in bench.json (``noise``), which the report, the model card and
``--method auto`` read (:func:`distillery.run_record.noise_warning`). Pure apart from :func:`machine_load`, which reads the operating system's figure.
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Sequence

import numpy as np

MAX_SPREAD = 0.15  # a quiet 2-core machine gives 0.01-0.06 at 1×128 over 30 passes
# Below this median a pass is too short for its spread to say anything about the machine: the timer and the
# scheduler's jitter alone give a 0.4 ms static-embedding model or a 1.4 ms int8 CMOW 20-30 % on a quiet machine
# (their medians still stand). The larger models timed beside them, interleaved, show a burst of load.
MIN_JUDGED_MS = 2.0
MAX_LOAD_PER_CPU = 1.5  # the run itself keeps the load near the CPUs it uses; half as much again is others' work
ROUNDS = 3  # latency timed at most this many times while a model's spread stays above MAX_SPREAD


def spread(seconds: Sequence[float]) -> float:
    """(p90 − median) / median of one model's timed passes: 0 for a steady model."""
    values = np.asarray(seconds, dtype=float)
    median = float(np.median(values))
    return float((np.percentile(values, 90) - median) / median) if median > 0 else 0.0


def spreads(times: Mapping[str, Sequence[float]]) -> dict[str, float]:
    """The spread of every model whose median pass takes at least :data:`MIN_JUDGED_MS` (times in seconds)."""
    return {name: spread(t) for name, t in times.items()
            if len(t) and float(np.median(np.asarray(t, dtype=float))) * 1000.0 >= MIN_JUDGED_MS}


def machine_load() -> float | None:
    """The 1-minute load average, or None where the system does not tell it."""
    try:
        return float(os.getloadavg()[0])
    except (AttributeError, OSError):
        return None


def noise_record(spread_by_model: Mapping[str, float], rounds: int, load_start: float | None,
                 load_end: float | None, usable_cpus: int | None) -> dict[str, Any]:
    """bench.json's ``noise`` entry: ``stable`` and, when not, ``reasons`` in words."""
    reasons = [f"{name}'s latency varied by {100 * s:.0f} % (p90 over median) after {rounds} round(s)"
               for name, s in spread_by_model.items() if s > MAX_SPREAD]
    limit = MAX_LOAD_PER_CPU * usable_cpus if usable_cpus else None
    busy = [f"{when} {load:.1f}" for when, load in (("before", load_start), ("after", load_end))
            if limit is not None and load is not None and load > limit]
    if busy:
        reasons.append(f"the machine's load average was above {limit:g} ({MAX_LOAD_PER_CPU:g} × {usable_cpus} "
                       f"usable CPUs): {', '.join(busy)}")
    return {"stable": not reasons, "reasons": reasons, "rounds": rounds,
            "spread": {name: round(s, 4) for name, s in spread_by_model.items()},
            "load": {"before": load_start, "after": load_end, "usable_cpus": usable_cpus},
            "max_spread": MAX_SPREAD, "max_load_per_cpu": MAX_LOAD_PER_CPU}
