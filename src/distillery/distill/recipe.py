"""Method ``distill``: the comparison row every report carries.

A shallower copy of the teacher, initialised from a subset of its layers (DistilBERT: every other
layer), trained with (1 − w)·CE(y) + w·KD(teacher, T), optionally plus β·MSE between the hidden
states of each student layer and the teacher layer it was copied from (Patient KD).

Options (``RunConfig.method_options``): :class:`~distillery.distill.options.DistillOptions`.
"""

from __future__ import annotations

import logging
from typing import ClassVar

from transformers import PreTrainedModel

from distillery.training.losses import distillation_loss
import distillery.encoders as encoders
from distillery.errors import DistilleryError
from distillery.method import Method
from distillery.method_context import MethodContext

logger = logging.getLogger("distillery")


def select_layers(num_teacher_layers: int, student_layers: int | list[int] | None) -> list[int]:
    """Teacher layer indices the student keeps: explicit, K spread evenly from the bottom, or every other."""
    if student_layers is None:
        return list(range(0, num_teacher_layers, 2))
    if isinstance(student_layers, (list, tuple)):
        layers = [int(i) for i in student_layers]
        bad = [i for i in layers if not 0 <= i < num_teacher_layers]
        if bad or not layers or layers != sorted(set(layers)):
            raise DistilleryError(
                f"student layers {layers} must be distinct increasing indices of the teacher's "
                f"{num_teacher_layers} layers (0 to {num_teacher_layers - 1})."
            )
        return layers
    k = int(student_layers)
    if not 1 <= k <= num_teacher_layers:
        raise DistilleryError(
            f"--student-layers {k} is not possible: the teacher has {num_teacher_layers} layers "
            f"(choose 1 to {num_teacher_layers})."
        )
    return [i * num_teacher_layers // k for i in range(k)]


def build_student(teacher: PreTrainedModel, layers: list[int]) -> PreTrainedModel:
    """A new model of the teacher's class with ``len(layers)`` layers, each a copy of a teacher layer
    (ALBERT, whose layers are one shared group: ``len(layers)`` repeats of it).

    Embeddings, pooler and task head are copied too, so the student starts where the teacher is.
    """
    layout = encoders.require(teacher.config, None, "method distill")
    config = teacher.config.__class__.from_dict(teacher.config.to_dict())
    config.num_hidden_layers = len(layers)  # DistilBERT's n_layers through its attribute_map
    if isinstance(getattr(config, "layer_types", None), list):  # ModernBERT: each layer keeps its attention kind
        config.layer_types = [teacher.config.layer_types[i] for i in layers]
    student = type(teacher)(config)
    source = teacher.state_dict()
    prefix = encoders.layers_prefix(teacher) + "."
    new_index = dict(enumerate(layers))

    def teacher_key(key: str) -> str:
        if layout.shared_layers or not key.startswith(prefix):  # ALBERT's group is the same, only repeated less
            return key
        index, rest = key[len(prefix):].split(".", 1)
        return f"{prefix}{new_index[int(index)]}.{rest}"

    # Every student weight comes from the teacher; a teacher weight the student has no place for is left
    # behind (ModernBERT's first layer has no attention LayerNorm: a later layer copied there loses it).
    state = {key: source[teacher_key(key)].detach().clone() for key in student.state_dict()}
    student.load_state_dict(state, strict=True)
    return student


class Distill(Method):
    name: ClassVar[str] = "distill"

    def check(self, config, teacher_config) -> None:
        opts = self.options(config)
        if opts.student is not None:  # a pretrained student: the teacher is read only through its outputs
            from distillery.distill.pretrained import check_student, latency_shape
            from distillery.teacher import teacher_tokenizer

            self.measured = check_student(opts.student, config.data, teacher_config, latency_shape(config),
                                          teacher_tokenizer(config.teacher.name), opts.hidden_weight)
            return
        encoders.require(teacher_config, None, "method distill")
        select_layers(teacher_config.num_hidden_layers, opts.student_layers)

    def run(self, ctx: MethodContext) -> PreTrainedModel:
        opts = self.options(ctx.config)
        if opts.student is not None:
            from distillery.distill.pretrained import run_pretrained

            return run_pretrained(ctx, opts, measured=getattr(self, "measured", False))
        teacher, task_data, kind = ctx.teacher, ctx.task_data, ctx.task_data.task.kind_object
        layers = select_layers(teacher.config.num_hidden_layers, opts.student_layers)
        student = build_student(teacher, layers)
        ctx.notes.append(f"Student: teacher layers {layers} of {teacher.config.num_hidden_layers}, "
                         f"loss (1-{opts.kd_weight})·CE + {opts.kd_weight}·KD(T={opts.temperature})"
                         + (f" + {opts.hidden_weight}·hidden MSE" if opts.hidden_weight else "") + ".")
        logger.info("Student keeps teacher layers %s.", layers)

        train = task_data.train
        teacher.eval()
        whole = opts.train_examples == "all"
        extra = opts.augment or ctx.config.data.unlabeled_file
        if kind.takes_new_rows and (whole or extra or not opts.hidden_weight):  # with hidden_weight the loss runs the teacher
            train = ctx.distillation_train(whole, opts.augment)
            logger.info("Teacher logits on %d training examples, computed once (or read from the cache).", len(train))
        loss_fn = distillation_loss(kind, teacher, opts.kd_weight, opts.temperature, opts.hidden_weight, layers)
        return ctx.train(student, loss_fn, desc="student", train_dataset=train)
