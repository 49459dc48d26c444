"""The fields a report reads from a run's metrics.json, bench.json and train.json, and their types: a file
damaged or edited by hand is refused with a sentence naming the file and the field (:func:`check_shape`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from distillery.errors import DistilleryError

# What a report reads from a run's files, field by field ("*": every key of a mapping or item of a list):
# a value of another type (a score written as a string, hardware as a sentence) is refused with a sentence
# naming the file and the field, not met as a traceback or silently left out of the tables.
NUMBER = "a number"
SCORES = {"": dict, "*": NUMBER}
SHAPES: dict[str, dict[str, Any]] = {
    "metrics.json": {
        "task": str, "split": str, "main_metric": str, "retention": NUMBER,
        **{f"{model}{'.' + k if k else ''}": v for model in ("teacher", "student") for k, v in SCORES.items()},
        **{f"{group}{'.' + k if k else ''}": v for group in ("others", "baselines")
           for k, v in {"": dict, "*": dict, "*.*": NUMBER}.items()},
        "other_splits": dict, "other_splits.*": dict, "other_splits.*.*": dict, "other_splits.*.*.*": NUMBER,
        "baseline_notes": list, "baseline_notes.*": str, "chain": list,
    },
    "bench.json": {
        "hardware": dict, "models": dict, "models.*": dict,
        **{f"models.*.{k}": NUMBER for k in ("params", "effective_params", "flops_per_token")},
        "models.*.latency_ms": dict, "models.*.latency_ms.median": NUMBER, "models.*.latency_ms.p90": NUMBER,
        "models.*.throughput": dict, "models.*.throughput.sentences_per_s": NUMBER,
        "speedup": dict, "speedup.latency": NUMBER, "speedup.throughput": NUMBER,
        "speedups": dict, "speedups.*": dict, "settings": dict, "sweep": list, "sweep.*": dict,
    },
    "train.json": {
        **{k: NUMBER for k in ("teacher_seconds", "student_seconds", "total_seconds", "train_examples",
                               "teacher_train_examples")},
        "teacher_cached": bool, "teacher_path": str, "notes": list, "notes.*": str,
        "student_text": dict, "student_text.augment_source": str,
        **{f"student_text.{k}": NUMBER for k in ("labelled", "augmented", "unlabeled", "labelling_seconds")},
    },
}
_TYPE_WORDS = {dict: "a mapping", list: "a list", str: "a string", bool: "true or false", NUMBER: NUMBER}


def _kind_of(value: Any) -> str:
    if isinstance(value, bool):
        return f"{str(value).lower()}"
    if isinstance(value, (int, float)):
        return f"the number {value}"
    if isinstance(value, str):
        return f"the string {value[:40]!r}"
    return {dict: "a mapping", list: "a list"}.get(type(value), type(value).__name__)


def check_shape(path: Path, value: Any, shape: Mapping[str, Any]) -> None:
    """Refuse ``value`` (the JSON of ``path``) when a field named in ``shape`` holds another type. None
    (JSON null) passes where a field may be missing; NaN is a number here."""
    if not isinstance(value, dict):
        raise DistilleryError(f"{path} must hold a JSON object, not {_kind_of(value)}.")

    def walk(node: Any, pattern: list[str], where: list[str], expected: Any) -> None:
        if not pattern:
            ok = (node is None or (isinstance(node, (int, float)) and not isinstance(node, bool)) if expected is NUMBER
                  else node is None or isinstance(node, expected))
            if not ok:
                raise DistilleryError(f"{path}: {'.'.join(where)} holds {_kind_of(node)}, where a report reads "
                                      f"{_TYPE_WORDS[expected]}; the file was damaged or edited by hand.")
            return
        head, rest = pattern[0], pattern[1:]
        if isinstance(node, dict):
            items = node.items() if head == "*" else ([(head, node[head])] if head in node else [])
        elif isinstance(node, list) and head == "*":
            items = [(str(i), item) for i, item in enumerate(node)]
        else:
            return  # the parent's own type is checked by its own entry
        for key, child in items:
            walk(child, rest, [*where, str(key)], expected)

    for field, expected in shape.items():
        if field:
            walk(value, field.split("."), [], expected)
