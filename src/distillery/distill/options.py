"""Options of method ``distill`` (the layer-drop baseline, :mod:`distillery.distill.recipe`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from distillery.errors import DistilleryError
from distillery.method import MethodOptions, augment_option, number, one_of, option, text


@dataclass(frozen=True)
class Layers:
    """A count of layers, or a list of teacher layer indices (only the list where ``count`` is off); their range
    is checked against the teacher (and a pretrained student) at the run."""

    optional: bool = True
    count: bool = True
    kind: ClassVar[type] = int

    def accepts(self) -> str:
        return "whole number, or a list of teacher layer indices" if self.count else "a list of teacher layer indices"

    def __call__(self, name: str, value: Any) -> Any:
        whole = lambda v: isinstance(v, int) and not isinstance(v, bool)  # noqa: E731
        listed = isinstance(value, list) and value and all(whole(v) for v in value)
        if value is None or (self.count and whole(value)) or listed:
            return value
        wanted = "a number of layers or a list of teacher layer indices" if self.count else \
            "a list of teacher layer indices (e.g. [1,3,5])"
        raise DistilleryError(f"Option {name} must be {wanted}, got {value!r}.")


@dataclass
class DistillOptions(MethodOptions):
    METHOD: ClassVar[str] = "distill"
    student_layers: int | list[int] | None = option(
        None, Layers(), "number of teacher layers the student keeps (spread evenly from the bottom; fewer than "
        "half: the top layer of each block, the last kept), or with --option student_layers=[1,5] the teacher "
        "layer indices", default_text="every other layer", flag=True)
    student: str | None = option(
        None, text(optional=True), "a pretrained encoder as the student instead of a copy of teacher layers: minilm or "
        "mpnet-base (the packaged encoders before fine-tuning), a model folder or a Hub id; it keeps its own "
        "tokenizer and learns from the teacher's outputs", default_text="teacher layers", flag=True)
    kd_weight: float | None = option(
        None, number(0, 1, optional=True), "weight of the KD term (1 - kd_weight on the task's own loss)", flag=True,
        default_text="0.5; 1 when more than half of the teacher's layers go and the teacher's outputs are logits "
        "(the teacher's outputs only)")
    temperature: float | None = option(
        None, number(above=0, optional=True), "softmax temperature of the KD loss", flag=True,
        default_text="2.0; when more than half of the teacher's layers go, and for a pretrained student (--student), "
        "from the teacher's logits: the softest of 1, 2, 4 at which its mean top-1 probability stays >= 0.8")
    hidden_weight: float | None = option(
        None, number(0, optional=True), "weight of hidden-state MSE (Patient KD); 0 = off. A layer-drop student "
        "keeping fewer than half the layers learns the teacher layer at the top of each block (last onto last), "
        "else the layer it was copied from. With --student: per layer through a learned projection where the "
        "tokenizers match, else between sentence vectors (mean-pooled last layer)", paper="β", flag=True,
        default_text="1.0 when more than half of the teacher's layers go, else 0")
    attention_weight: float | None = option(
        None, number(0, optional=True), "weight of self-attention distillation (MiniLM): the KL divergence of each "
        "student head's attention distributions from the teacher's, on the layers hidden_weight pairs; 0 = off. "
        "A layer-drop student only", paper="attention",
        default_text="3.0 when more than half of the teacher's layers go, else 0")
    min_steps: int | None = option(
        None, number(0, whole=True, optional=True), "optimizer steps a layer-drop student trains at least (more "
        "passes over a small split), the first 10 % warming up; 0 = the budget's schedule as it is",
        default_text="600 when more than half of the teacher's layers go, else 0")
    lr_scale: float | None = option(
        None, number(above=0, optional=True), "the student's learning rate (--lr, the budget's) times this for a "
        "layer-drop student", default_text="3 when more than half of the teacher's layers go, else 1")
    layer_map: list[int] | None = option(
        None, Layers(count=False), "with --student and hidden_weight, the teacher layer each student layer learns from, "
        "e.g. [1,3,5] (where the tokenizers match)", default_text="spread evenly, last to last")
    augment: int | None = augment_option(
        default_text="0; when more than half of the teacher's layers go and the train split has fewer than 20,000 "
        "rows, 8 (read twice)")
    train_examples: str = option(
        "all", one_of("all", "budget"), "all: the whole train split, the examples past the budget's limit labelled "
        "by the teacher (a student costs far less per example than the teacher's fine-tuning); budget: the run's "
        "examples only (--train-limit)")

    def check(self) -> None:
        if self.layer_map is not None and (self.student is None or not self.hidden_weight):
            raise DistilleryError("Option layer_map maps a pretrained student's layers (--student) onto the "
                                  "teacher's for hidden_weight; give both, or drop layer_map.")
        if self.student is not None and self.attention_weight:
            raise DistilleryError("Option attention_weight is for a student copied from the teacher's layers; a "
                                  "pretrained student (--student) learns from the teacher's outputs and hidden states.")
        if self.student is not None and self.student_layers is not None:
            raise DistilleryError("Options student and student_layers exclude each other: a pretrained student "
                                  "(--student) keeps its own layers.")


Options = DistillOptions
