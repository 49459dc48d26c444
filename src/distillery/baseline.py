"""Method ``distill``: the comparison row every report carries.

A shallower copy of the teacher, initialised from a subset of its layers (DistilBERT: every other
layer), trained with (1 − α)·CE(y) + α·KD(teacher, T), optionally plus β·MSE between the hidden
states of each student layer and the teacher layer it was copied from (Patient KD).

Options (``RunConfig.method_options``): ``student_layers`` (a count K or an explicit list of teacher
layer indices; default every other layer), ``alpha`` (0.5), ``temperature`` (2.0), ``hidden_weight``
β (0.0 = logits only).
"""

from __future__ import annotations

import logging
from types import SimpleNamespace

import torch
from transformers import PreTrainedModel

from distillery.data.encode import TARGETS
from distillery.distill.losses import hidden_mse, prediction_distillation, task_loss
from distillery.errors import DistilleryError
from distillery.modeling import find_encoder_layers
from distillery.recipe import MethodContext, number, read_options

logger = logging.getLogger("distillery")

DEFAULTS = {"student_layers": None, "alpha": 0.5, "temperature": 2.0, "hidden_weight": 0.0}


def _layers_option(name: str, value):
    """A count of layers, or a list of teacher layer indices; their range is checked against the teacher."""
    whole = lambda v: isinstance(v, int) and not isinstance(v, bool)  # noqa: E731
    if value is None or whole(value) or (isinstance(value, list) and value and all(whole(v) for v in value)):
        return value
    raise DistilleryError(f"Option {name} must be a number of layers or a list of teacher layer indices, got {value!r}.")


SPECS = {"student_layers": _layers_option, "alpha": number(0, 1), "temperature": number(above=0),
         "hidden_weight": number(0)}


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
    """A new model of the teacher's class with ``len(layers)`` layers, each a copy of a teacher layer.

    Embeddings, pooler and task head are copied too, so the student starts where the teacher is.
    """
    prefix, _ = find_encoder_layers(teacher)
    config = teacher.config.__class__.from_dict(teacher.config.to_dict())
    config.num_hidden_layers = len(layers)
    student = type(teacher)(config)
    new_index = {old: new for new, old in enumerate(layers)}
    state = {}
    for key, value in teacher.state_dict().items():
        if key.startswith(prefix + "."):
            old, rest = key[len(prefix) + 1 :].split(".", 1)
            if int(old) not in new_index:
                continue
            key = f"{prefix}.{new_index[int(old)]}.{rest}"
        state[key] = value.detach().clone()
    student.load_state_dict(state, strict=True)
    return student


def distillation_loss(kind: str, teacher: PreTrainedModel, alpha: float, temperature: float,
                      hidden_weight: float = 0.0, layer_map: list[int] | None = None):
    """loss_fn for the trainer: (1 − α)·task loss + α·prediction KD (+ β·hidden MSE)."""

    def loss_fn(model, batch):
        inputs = {k: v for k, v in batch.items() if k not in TARGETS}
        out = model(**inputs, output_hidden_states=hidden_weight > 0)
        if "teacher_logits" in batch:
            logits = batch["teacher_logits"]
            t_out = SimpleNamespace(logits=logits.squeeze(-1) if kind == "regression" else logits)
        else:
            with torch.no_grad():
                t_out = teacher(**inputs, output_hidden_states=hidden_weight > 0)
        ce = task_loss(kind, out, batch)
        kd = prediction_distillation(kind, out, t_out, temperature=temperature)
        loss = (1 - alpha) * ce + alpha * kd
        logs = {"ce": float(ce.detach()), "kd": float(kd.detach())}
        if hidden_weight > 0:
            # hidden_states[0] is the embedding output; student layer j was copied from teacher layer layer_map[j]
            pairs = [(0, 0)] + [(j + 1, t + 1) for j, t in enumerate(layer_map)]
            mask = inputs.get("attention_mask")
            hid = sum(hidden_mse(out.hidden_states[s], t_out.hidden_states[t], attention_mask=mask) for s, t in pairs)
            loss = loss + hidden_weight * hid
            logs["hidden"] = float(hid.detach())
        return loss, logs

    return loss_fn


def options(config) -> dict:
    return read_options("distill", config.method_options, DEFAULTS, SPECS)


def check(config, teacher_config) -> None:
    select_layers(teacher_config.num_hidden_layers, options(config)["student_layers"])


def run(ctx: MethodContext) -> PreTrainedModel:
    opts = options(ctx.config)
    teacher, task_data, kind = ctx.teacher, ctx.task_data, ctx.task_data.task.kind
    layers = select_layers(teacher.config.num_hidden_layers, opts["student_layers"])
    student = build_student(teacher, layers)
    ctx.notes.append(f"Student: teacher layers {layers} of {teacher.config.num_hidden_layers}, "
                     f"loss (1-{opts['alpha']})·CE + {opts['alpha']}·KD(T={opts['temperature']})"
                     + (f" + {opts['hidden_weight']}·hidden MSE" if opts["hidden_weight"] else "") + ".")
    logger.info("Student keeps teacher layers %s.", layers)

    train = task_data.train
    teacher.eval()
    if kind != "qa" and not opts["hidden_weight"]:
        logger.info("Teacher logits on %d training examples, computed once (or read from the cache).", len(train))
        train = ctx.train_with_teacher_logits()
    loss_fn = distillation_loss(kind, teacher, opts["alpha"], opts["temperature"], opts["hidden_weight"], layers)
    return ctx.train(student, loss_fn, desc="student", train_dataset=train)
