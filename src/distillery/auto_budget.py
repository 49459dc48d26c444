"""How ``--method auto`` spends its time budget: the teacher first, then the candidates in the order of what
they are expected to give, each started only when its estimated cost fits what is left.

A candidate's cost is estimated from the teacher's own measured training speed (its fine-tuning's seconds
per example and pass, recorded with the teacher, cached or not) times the candidate's work in teacher
passes (:attr:`distillery.auto.Candidate.cost`) over the examples its student learns from. Once a candidate
has finished, the estimates of the others are scaled by how far off the first ones were (what a run spends
besides training: scoring, exports, the free baselines, the benchmark, goes into that factor).

Pure: numbers in, numbers and sentences out.
"""

from __future__ import annotations

from statistics import median
from typing import Any, Mapping, Sequence

from distillery.markdown import fmt_seconds
from distillery.run_record import Run

# A passes' worth of training is a forward and a backward: three forward passes.
PASSES_PER_STEP = 3.0

# What a candidate is expected to keep of the teacher's main metric at the speed-up auto plans it for (its
# ``expected``) is said by its method's package (``<method>/auto.py``), from distillery's own measured students
# (benchmarks/results, built-in teacher, quick budget, the mean over SST-2, MRPC, RTE and STS-B unless a package says
# otherwise), through :func:`distillery.method.expected_at` where a method was measured at more than one size.
# Only the order matters: it decides which candidates a time budget runs first.


def pass_seconds(teacher_info: Mapping[str, Any], teacher_epochs: float) -> float | None:
    """Seconds the teacher takes for one forward pass over one example, from its fine-tuning's record
    (``seconds`` over ``train_examples`` × ``teacher_epochs`` steps of three passes); None when the
    teacher was given fine-tuned and nothing was timed."""
    seconds, examples = teacher_info.get("seconds"), teacher_info.get("train_examples")
    if not seconds or not examples or not teacher_epochs:
        return None
    return float(seconds) / (PASSES_PER_STEP * float(teacher_epochs) * float(examples))


def estimate_seconds(cost: float, per_pass: float | None, rows_read: float) -> float | None:
    """A candidate's training time: ``cost`` teacher passes a row over the ``rows_read`` of its training."""
    if per_pass is None:
        return None
    return cost * per_pass * rows_read


def calibration(finished: Sequence[tuple[float, float]]) -> float:
    """How far the estimates were off: the median of measured over estimated seconds of the candidates
    that ran (1 before any)."""
    ratios = [measured / estimated for estimated, measured in finished if estimated and estimated > 0]
    return median(ratios) if ratios else 1.0


def fits(estimate: float | None, spent: float, budget_s: float | None) -> bool:
    return budget_s is None or estimate is None or spent + estimate <= budget_s


def up_front(names: Sequence[str], estimates: Mapping[str, float | None], spent: float,
             budget_s: float | None) -> dict[str, str]:
    """The candidates that will not fit, in run order, each with the sentence saying why: those whose
    estimate exceeds what the ones before them (that fit) leave of the budget."""
    left_out, total = {}, spent
    for name in names:
        estimate = estimates.get(name)
        if fits(estimate, total, budget_s):
            total += estimate or 0.0
        else:
            left_out[name] = not_fitting(estimate, total, budget_s)
    return left_out


def not_fitting(estimate: float, spent: float, budget_s: float) -> str:
    return (f"its estimated {fmt_seconds(estimate)} (from the teacher's measured training speed) does not fit the "
            f"{fmt_seconds(max(budget_s - spent, 0.0))} left of the time budget of {fmt_seconds(budget_s)}")


def split_lines(teacher: Mapping[str, Any] | None, entries: Sequence[Mapping[str, Any]],
                runs: Mapping[str, Run]) -> list[str]:
    """The report's lines on where the time went: the teacher (its ``spent_seconds`` in this call), then each
    candidate's student training and the rest of its run (scoring, exports, the free baselines, the benchmark)
    beside its estimate."""
    lines = []
    if teacher:
        how = "read from the cache" if teacher.get("cached") else "fine-tuned in this call"
        lines.append(f"  - teacher: {fmt_seconds(teacher.get('spent_seconds') or 0.0)} ({how})")
    for entry in entries:
        run = runs.get(entry["name"])
        if run is None:
            continue
        train = run.train
        student, total = train.student_seconds, train.total_seconds
        if not isinstance(student, (int, float)) or not isinstance(total, (int, float)):
            continue
        teacher_part = train.teacher_seconds if not train.teacher_cached else 0.0
        rest = max(total - student - (teacher_part or 0.0), 0.0)
        estimate = entry.get("estimated_seconds")
        guess = f"; estimated {fmt_seconds(estimate)}" if estimate else ""
        lines.append(f"  - {entry['name']}: {fmt_seconds(total)} (student {fmt_seconds(student)}; scoring, exports, "
                     f"free baselines and benchmark {fmt_seconds(rest)}{guess})")
    return lines
