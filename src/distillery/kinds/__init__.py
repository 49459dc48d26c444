"""The task kinds: one module a kind (``classification``, ``regression``, ``qa``, ``token_classification``,
``embedding``), each an object that owns every
decision depending on what the model predicts (:class:`distillery.kinds.base.TaskKind`).

Adding a kind is adding its module and one line in :data:`KINDS`; everything else asks the kind object
(``spec.kind_object`` for a task, :func:`kind_of` for a kind's name).
"""

from __future__ import annotations

import importlib
from functools import cache

from distillery.errors import DistilleryError
from distillery.kinds.base import TaskKind
from distillery.modeling import Head, head_of

# name -> "module:Class"; a kind's module is imported when the kind is first asked for.
KINDS: dict[str, str] = {
    "classification": "distillery.kinds.classification:Classification",
    "regression": "distillery.kinds.regression:Regression",
    "qa": "distillery.kinds.qa:QuestionAnswering",
    "token_classification": "distillery.kinds.token_classification:TokenClassification",
    "embedding": "distillery.kinds.embedding:Embedding",
}


@cache
def _instance(entry: str) -> TaskKind:
    module, _, cls = entry.partition(":")
    return getattr(importlib.import_module(module), cls)()


def kind_of(kind) -> TaskKind:
    """The kind object of a kind's name (a task's ``kind``) or of a task (a ``TaskSpec``); a kind object as it is."""
    if isinstance(kind, TaskKind):
        return kind
    name = getattr(kind, "kind", kind)
    if name not in KINDS:
        raise DistilleryError(f"Unknown task kind {name!r}; choose one of {', '.join(KINDS)}.")
    return _instance(KINDS[name])


def kind_for_head(head: Head, outputs: int) -> TaskKind | None:
    """The kind a task head of ``outputs`` outputs is trained for (a model known by its head alone: a teacher's
    class, a saved super-net's head): the first kind with that head that takes that many outputs
    (:meth:`TaskKind.takes_outputs`: a sequence head of one output is a regressor); None for no kind's head."""
    return next((kind for kind in map(_instance, KINDS.values()) if kind.head is head and kind.takes_outputs(outputs)),
                None)


def pipeline_tag_of(config) -> str | None:
    """The Hub's pipeline tag of a model (its ``config``'s head): that of the first kind trained with that head; a
    bare encoder has none."""
    head = head_of(config)
    return next((kind.pipeline_tag for kind in map(_instance, KINDS.values()) if kind.head is head), None)


__all__ = ["KINDS", "TaskKind", "kind_for_head", "kind_of", "pipeline_tag_of"]
