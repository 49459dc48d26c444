"""Method ``distill``: the comparison row every report carries.

A shallower copy of the teacher, initialised from a subset of its layers (DistilBERT: every other
layer), trained with (1 − w)·CE(y) + w·KD(teacher, T), optionally plus β·MSE between the hidden
states of each student layer and the teacher layer it was copied from (Patient KD).

Options (``RunConfig.method_options``): :class:`~distillery.distill.options.DistillOptions`.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, replace
from typing import ClassVar

from transformers import PreTrainedModel

from distillery.training.losses import distillation_loss
import distillery.encoders as encoders
from distillery.distill import deep_cut
from distillery.errors import DistilleryError
from distillery.method import Method
from distillery.method_context import MethodContext

logger = logging.getLogger("distillery")


def select_layers(num_teacher_layers: int, student_layers: int | list[int] | None) -> list[int]:
    """Teacher layer indices the student keeps: explicit, K of them, or every other. K spread evenly from the
    bottom where at least half stay (DistilBERT's 0, 2, 4 of 6); fewer (a deep cut), the layer at the top of each
    block of L/K, the teacher's last kept (2 of 6: 2, 5), so that the head reads the layer it read in the teacher:
    copied from the bottom, a 2-of-6 student started as a constant predictor on RTE and learned half as much on
    STS-B (docs/distill.md, "Deep cuts")."""
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
    if deep_cut.is_deep_cut(k, num_teacher_layers):
        return deep_cut.uniform_layer_map(k, num_teacher_layers)
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

            # A pretrained student keeps its own layers, so of the deep-cut rule only the temperature applies: read
            # from the teacher's logits (run_pretrained, once they are computed) where the user gave none.
            opts = replace(opts, hidden_weight=opts.hidden_weight or 0.0, attention_weight=0.0,
                           augment=opts.augment or 0,
                           kd_weight=deep_cut.KD_WEIGHT if opts.kd_weight is None else opts.kd_weight)
            return run_pretrained(ctx, opts, measured=getattr(self, "measured", False))
        teacher, task_data, kind = ctx.teacher, ctx.task_data, ctx.task_data.task.kind_object
        layers = select_layers(teacher.config.num_hidden_layers, opts.student_layers)
        student = build_student(teacher, layers)
        logger.info("Student keeps teacher layers %s.", layers)

        train = task_data.train
        teacher.eval()
        whole = opts.train_examples == "all"
        augment, augment_reason = augment_choice(ctx, opts.augment, len(layers))
        extra = augment or ctx.config.data.unlabeled_file
        # the teacher's logits are read from the cache unless the loss runs the teacher (hidden_weight), and they
        # set a deep cut's temperature
        deep = deep_cut.is_deep_cut(len(layers), teacher.config.num_hidden_layers) and opts.temperature is None
        if kind.caches_teacher_outputs and (whole or extra or not opts.hidden_weight or deep):
            train = ctx.distillation_train(whole, augment)
            logger.info("Teacher logits on %d training examples, computed once (or read from the cache).", len(train))
        chosen = student_defaults(ctx, opts, layers, train, augment_reason)
        ctx.notes.append(f"Student: teacher layers {layers} of {teacher.config.num_hidden_layers}, loss "
                         f"{kind.loss_words(chosen.kd_weight, chosen.temperature)}{chosen.layer_terms('student')}.")
        ctx.notes.extend(f"Defaults for this cut: {reason}." for reason in chosen.reasons)
        loss_fn = distillation_loss(kind, teacher, chosen.kd_weight, chosen.temperature, chosen.hidden_weight,
                                    chosen.hidden_layers, chosen.attention_weight)
        return ctx.train(student, loss_fn, desc="student", train_dataset=train, **chosen.settings)


def augment_choice(ctx: MethodContext, given: int | None, kept: int) -> tuple[int, str | None]:
    """New rows per train row for a student as deep a cut as ``kept`` of the teacher's layers, and why: ``given``
    (the user's ``augment``), else the deep-cut rule's (:func:`deep_cut.default_augment`) on the run's train split."""
    if given is not None:
        return int(given), None
    return deep_cut.default_augment(kept, ctx.teacher.config.num_hidden_layers, len(ctx.task_data.train),
                                    ctx.task_data.task.kind_object.augments_by_default)


def without_hidden_term(resolved, given: float | None, width: int, teacher_width: int, deep: bool,
                        whose: str) -> list[str]:
    """Turn the hidden-state term off in ``resolved`` (what :func:`student_defaults` reads) where the student's
    ``width`` is not the teacher's (the term compares states of one width) and the user did not turn it off
    (``given``); the note that says so where the user asked for it or the rule would have (``deep``)."""
    if width == teacher_width or given == 0:
        return []
    resolved.hidden_weight = 0.0
    return [f"No hidden-state term: {whose} {width} is not the teacher's {teacher_width}."] if given or deep else []


@dataclass(frozen=True)
class Chosen:
    """The settings of one layer-drop run: the user's where given, else :func:`deep_cut.choose_defaults`'."""

    temperature: float
    hidden_weight: float
    hidden_layers: list[int]  # the teacher layer each student layer learns with hidden_weight
    settings: dict  # the trainer's settings changed for this cut (lr, max_steps, warmup_ratio)
    reasons: list[str]
    attention_weight: float = 0.0  # on the layers of hidden_layers
    kd_weight: float = deep_cut.KD_WEIGHT  # the share of the distillation term

    def layer_terms(self, layers_of: str) -> str:
        """The hidden-state and attention terms as the report's notes write them after the loss's own words
        (empty without them); ``layers_of``: whose layers learn the teacher's ("student", "sub-network")."""
        return ((f" + {self.hidden_weight:g}·hidden MSE ({layers_of} layers onto teacher layers {self.hidden_layers})"
                 if self.hidden_weight else "")
                + (f" + {self.attention_weight:g}·attention KL (the same layers)" if self.attention_weight else ""))


def student_defaults(ctx: MethodContext, opts, layers: list[int], train, augment_reason: str | None = None,
                     shallow_lr_scale: float = 1.0) -> Chosen:
    """Resolve the options left unset (kd_weight, temperature, hidden_weight, attention_weight, min_steps, lr_scale)
    by the deep-cut rule, given the teacher's logits on ``train`` and the optimizer steps the budget gives it;
    ``layers``: the teacher layer each student layer was cut from (a deep cut's are the rule's map);
    ``augment_reason``: why ``train`` holds the rule's augmented rows (:func:`deep_cut.default_augment`), which the
    student then reads :data:`deep_cut.AUGMENTED_PASSES` times (at least the rule's steps); ``shallow_lr_scale``:
    the method's own learning-rate scale where neither the rule nor the user sets one (autotinybert's further
    training: by the speed-up). Shared by distill's layer-drop students and autotinybert's further training."""
    rule_augmented = augment_reason is not None
    n, cfg = ctx.teacher.config.num_hidden_layers, ctx.config.student
    kind = ctx.task_data.task.kind_object
    beyond = len(train) > len(ctx.task_data.train)  # the whole split past the budget's limit: MethodContext.train
    passes = deep_cut.AUGMENTED_PASSES if rule_augmented else cfg.whole_split_epochs if beyond and cfg.whole_split_epochs else cfg.epochs
    budget_steps = cfg.max_steps or math.ceil(math.ceil(len(train) / (cfg.batch_size * cfg.grad_accum)) * passes)
    logits = kind.cached_predictions(train) if kind.softened_outputs and "teacher_logits" in train.column_names else None
    rule = deep_cut.choose_defaults(n, len(layers), budget_steps, logits, kind.softened_outputs)
    given = {name for name in deep_cut.RULE_OPTIONS if getattr(opts, name) is not None}
    reasons = [reason for name, reason in rule.reasons.items() if name not in given]
    reasons += [augment_reason] if rule_augmented else []
    kd_weight = rule.kd_weight if opts.kd_weight is None else float(opts.kd_weight)
    temperature = rule.temperature if opts.temperature is None else float(opts.temperature)
    hidden_weight = rule.hidden_weight if opts.hidden_weight is None else float(opts.hidden_weight)
    attention_weight = rule.attention_weight if opts.attention_weight is None else float(opts.attention_weight)
    # a deep cut's layers learn the top of the block they stand for (the rule's map); a shallow one's, the layer
    # each was copied from
    hidden_layers = rule.hidden_layers or layers
    min_steps = rule.min_steps if opts.min_steps is None else int(opts.min_steps)
    deep = deep_cut.is_deep_cut(len(layers), n)
    lr_scale = float(opts.lr_scale) if opts.lr_scale is not None else rule.lr_scale if deep else shallow_lr_scale
    settings = {"lr": cfg.lr * lr_scale} if lr_scale != 1.0 else {}
    if budget_steps < min_steps:
        settings.update(max_steps=min_steps, warmup_ratio=max(cfg.warmup_ratio, deep_cut.WARMUP))
    elif rule_augmented:
        settings.update(max_steps=budget_steps, warmup_ratio=max(cfg.warmup_ratio, deep_cut.WARMUP))
    return Chosen(temperature, hidden_weight, hidden_layers, settings, reasons, attention_weight, kd_weight)
