"""Defaults of a student that keeps fewer than half of its teacher's layers (a *deep cut*, issue #53), as one rule.

A student copied from 2 of MiniLM's 6 layers is not a shallower teacher: its second layer reads the output of a
layer it never followed in the teacher, and the task head reads a layer that is not the teacher's last. With the
shallow cut's defaults (T = 2, no hidden-state term, the budget's short decaying schedule) such a student learned
next to nothing on RTE (docs/distill.md, "Deep cuts"). :func:`choose_defaults` picks, from the share of layers
kept, the optimizer steps the budget gives and the teacher's own logits, what a deep cut uses where the user did
not say otherwise (a shallower student keeps the earlier defaults, whose results docs/results.md reports):

- **the teacher's outputs only** (``kd_weight`` 1, TinyBERT's task distillation) where they are logits: on rows
  held out from teacher and students (RTE, two draws, two seeds each; MRPC) the label term moved accuracy by -0.3
  to +1.0 points (mean +0.2) while the student's KL to the teacher was 2 to 38 times larger (docs/distill.md,
  "The gold-label term"). A score's or a span's term keeps :data:`KD_WEIGHT`.
- **temperature** from the teacher's logits (:func:`temperature_from_logits`): the softest of 1, 2, 4 at which
  the teacher still puts, on average, :data:`DECISIVE` of its mass on its top class. A teacher whose logits are
  close together (MiniLM fine-tuned on a small split) is already soft at T = 1; softening it further flattens
  the targets until they hardly say which class it picked.
- **hidden-state distillation** (TinyBERT, MiniLM: deep cuts need it): each student layer learns the teacher layer
  at the top of the block it stands for (spread evenly, last onto last), so the head reads what it read in the
  teacher.
- **self-attention distillation** on the same layers (MiniLM; TinyBERT's attention term): each student head learns
  the teacher head's attention distributions (a KL divergence) beside the hidden states. On STS-B (2 of 6, the
  rest of this rule, students scored on a held-out part of the train split) it took Pearson from 0.830 to 0.839
  at weight 1 and to 0.844 at weight 3 (docs/distill.md, "Deep cuts").
- **a longer, warmed-up schedule** where the budget gives few steps: at least :data:`MIN_STEPS` optimizer steps,
  the first :data:`WARMUP` of them warming up, so that layers that no longer fit together have steps to re-fit.
- **more text** where the train split is small (:func:`default_augment`): TinyBERT's augmentation, each original
  row with :data:`DEEP_CUT_AUGMENT` new ones labelled by the teacher, read :data:`AUGMENTED_PASSES` times (a second
  pass took the held-out STS-B Pearson from 0.839 to 0.844 at attention weight 1). A deep-cut student fits the few thousand rows of RTE or STS-B long before it has learned what the
  teacher does on text it has not seen; on STS-B the teacher's labels on new text took a 2-of-6 student from
  0.685 to 0.770 Pearson (docs/distill.md, "Deep cuts").

Method distill applies it (:mod:`distillery.distill.recipe`, ``student_defaults``), and so does autotinybert's
further training of a sub-network keeping fewer than half of the super-net's layers
(:mod:`distillery.autotinybert.further`: its layers are the same top-of-block teacher layers; the hidden term
only where the sub-network keeps the teacher's width, the attention term only where it keeps the teacher's head
count), and prune's fine-tuning of a model pruned past 2× (:func:`equivalent_layers`: as deep a cut as a layer-drop
student of its speed; each pruned layer learns the teacher layer it was pruned from, where the hidden dimension is
kept; no attention term, its layers keeping different numbers of heads). A pretrained student (``--student``) keeps its own layers, so only the temperature rule applies there
(:func:`temperature_choice`). MoEBERT's students keep every layer (each FFN split into experts): not a deep cut,
so the rule does not apply.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

# the softest temperature at which the teacher's mean top-1 probability stays at or above this
DECISIVE = 0.8
TEMPERATURES = (1.0, 2.0, 4.0)
# a shallow cut's, and a deep cut's without logits to read (QA's spans): Hinton's usual value, the earlier default
FALLBACK_TEMPERATURE = 2.0
DEEP_CUT_HIDDEN_WEIGHT = 1.0
KD_WEIGHT = 0.5  # the share of the distillation term of a shallow cut, and of a deep cut's without logits
DEEP_CUT_KD_WEIGHT = 1.0  # a deep cut's, where the teacher's outputs are logits: the teacher's outputs only
DEEP_CUT_ATTENTION_WEIGHT = 3.0
MIN_STEPS = 600  # optimizer steps a deep-cut student trains at least (a small split: more passes)
WARMUP = 0.1
# the budget's learning rate times this: layers that no longer fit together re-fit faster (STS-B, 2 of 6, 600 steps
# with the hidden term: Pearson 0.580 at 1e-4, 0.685 at 3e-4)
LR_SCALE = 3.0
DEEP_CUT_AUGMENT = 8  # new rows per original row on a small split
AUGMENTED_PASSES = 2  # passes over a small split and its augmented rows
# a train split with fewer rows than this is small (the quick budget's limit: a split it cut is not)
SMALL_SPLIT_ROWS = 20000
# the options through which a user overrides the rule (distill's and autotinybert's): each one given turns its choice off
RULE_OPTIONS = ("kd_weight", "temperature", "hidden_weight", "attention_weight", "min_steps", "lr_scale")


@dataclass(frozen=True)
class StudentDefaults:
    """What :func:`choose_defaults` chose, and why (one line per choice, for the report)."""

    temperature: float
    hidden_weight: float
    hidden_layers: list[int] | None  # the teacher layer each student layer learns (None: no hidden term)
    min_steps: int  # optimizer steps the student trains at least, the first WARMUP of them warming up (0: any)
    reasons: dict[str, str] = field(default_factory=dict)  # option name -> why it was chosen so
    lr_scale: float = 1.0  # the budget's learning rate times this
    attention_weight: float = 0.0  # self-attention distillation on the hidden term's layers (0: none)
    kd_weight: float = KD_WEIGHT  # the share of the distillation term (1 - kd_weight on the row's label)


def is_deep_cut(kept: int, teacher_layers: int) -> bool:
    """More than half of the teacher's layers go."""
    return 2 * kept < teacher_layers


def equivalent_layers(speedup: float, teacher_layers: int) -> int:
    """The layers a layer-drop student of ``speedup``× the teacher keeps (its time is about its share of the layers):
    how deep a cut a method that removes something other than whole layers made (prune: past 2×, a deep cut)."""
    return max(1, min(teacher_layers, round(teacher_layers / max(float(speedup), 1e-9))))


def uniform_layer_map(kept: int, teacher_layers: int) -> list[int]:
    """Student layer j learns teacher layer ``(j + 1)·N/M − 1``: the top of the block of teacher layers it stands
    for, the last onto the last (TinyBERT's uniform mapping)."""
    return [(j + 1) * teacher_layers // kept - 1 for j in range(kept)]


def temperature_from_logits(logits: Sequence[Sequence[float]]) -> float:
    """The softest of :data:`TEMPERATURES` at which the teacher's mean top-1 probability over ``logits`` (one row
    per example, at least two classes) is at least :data:`DECISIVE`; 1 when none is.

    ``softmax(z / T)`` with logits spanning ±2.3 (MiniLM fine-tuned on a small split) has a mean top-1 of about
    0.85 at T = 1 and 0.66 at T = 2: at 2 the targets hardly say which class the teacher picked."""
    rows = np.asarray(logits, dtype=np.float64)
    if rows.ndim != 2 or rows.shape[0] == 0 or rows.shape[1] < 2:
        return FALLBACK_TEMPERATURE
    chosen = 1.0
    for t in TEMPERATURES:
        if mean_top1(rows, t) >= DECISIVE:
            chosen = t
    return chosen


def mean_top1(rows: np.ndarray, t: float) -> float:
    """The mean over rows of the largest probability of ``softmax(row / t)``."""
    shifted = (rows - rows.max(axis=1, keepdims=True)) / t
    return float((1.0 / np.exp(shifted).sum(axis=1)).mean())


def temperature_choice(teacher_logits: Sequence[Sequence[float]] | None) -> tuple[float, str | None]:
    """The rule's temperature and why (for the report): from ``teacher_logits`` (:func:`temperature_from_logits`),
    or without them (a kind whose term has no temperature to read: regression, QA's spans)
    :data:`FALLBACK_TEMPERATURE` and no reason."""
    if teacher_logits is None:
        return FALLBACK_TEMPERATURE, None
    temperature = temperature_from_logits(teacher_logits)
    return temperature, (f"T = {temperature:g} from the teacher's logits (the softest of "
                         f"{', '.join(f'{t:g}' for t in TEMPERATURES)} keeping its mean top-1 probability "
                         f">= {DECISIVE:g})")


def default_augment(kept: int, teacher_layers: int, train_rows: int, kind_augments: bool) -> tuple[int, str | None]:
    """New rows per train row for a student keeping ``kept`` of ``teacher_layers`` layers where the user gave none,
    and why: :data:`DEEP_CUT_AUGMENT` for a deep cut whose train split has fewer than :data:`SMALL_SPLIT_ROWS` rows
    and whose task kind takes the default augmentation (``TaskKind.augments_by_default``); else 0 (and no reason)."""
    if not (kind_augments and is_deep_cut(kept, teacher_layers) and train_rows < SMALL_SPLIT_ROWS):
        return 0, None
    return DEEP_CUT_AUGMENT, (f"{DEEP_CUT_AUGMENT} augmented rows per train row, labelled by the teacher, in "
                              f"{AUGMENTED_PASSES} pass{'es' if AUGMENTED_PASSES > 1 else ''} "
                              f"(the train split's {train_rows} rows are few for a student keeping {kept} of "
                              f"{teacher_layers} layers)")


def rows_read(kept: int, teacher_layers: int, train_rows: int, passes: float, batch_size: int,
              augment: int, rule_augmented: bool) -> float:
    """The rows a student keeping ``kept`` of ``teacher_layers`` layers reads over its training, from a train split
    of ``train_rows`` with ``augment`` new rows per row, read ``passes`` times (the budget's) or, where the rule
    added the rows (``rule_augmented``), :data:`AUGMENTED_PASSES` times; a deep cut reads at least
    :data:`MIN_STEPS` batches of ``batch_size``. What ``--method auto`` estimates a candidate's time from: on RTE,
    the rule's augmentation made a 1-of-6 student read 18 times the rows of one pass (13 min, against 2 estimated
    without it)."""
    rows = train_rows * (1 + max(int(augment), 0)) * (AUGMENTED_PASSES if rule_augmented else max(float(passes), 0.0))
    return max(rows, float(MIN_STEPS * batch_size)) if is_deep_cut(kept, teacher_layers) else rows


def choose_defaults(teacher_layers: int, kept: int, budget_steps: int,
                    teacher_logits: Sequence[Sequence[float]] | None = None, softened: bool = True,
                    ) -> StudentDefaults:
    """The defaults of a student keeping ``kept`` of ``teacher_layers`` layers whose budget trains it
    ``budget_steps`` optimizer steps; ``teacher_logits``: the teacher's logits on its train split, which set the
    temperature where the task kind's distillation term is ``softened`` by one (classification; a regression
    task's has no temperature, a QA task keeps :data:`FALLBACK_TEMPERATURE`)."""
    if not 1 <= kept <= teacher_layers:
        raise ValueError(f"a student keeps 1 to {teacher_layers} layers, got {kept}.")
    if not is_deep_cut(kept, teacher_layers):  # the earlier defaults, whose results docs/results.md reports
        return StudentDefaults(FALLBACK_TEMPERATURE, 0.0, None, 0, {})
    temperature, why = temperature_choice(teacher_logits if softened else None)
    reasons = {"temperature": why} if why else {}
    kd_weight = DEEP_CUT_KD_WEIGHT if softened else KD_WEIGHT
    if softened:
        reasons["kd_weight"] = (f"kd_weight {DEEP_CUT_KD_WEIGHT:g}: the teacher's outputs only, no term on the "
                                f"row's own label")
    hidden_layers = uniform_layer_map(kept, teacher_layers)
    reasons["hidden_weight"] = (f"{teacher_layers - kept} of {teacher_layers} layers dropped: hidden-state "
                                f"distillation (weight {DEEP_CUT_HIDDEN_WEIGHT:g}, student layers onto teacher "
                                f"layers {hidden_layers})")
    reasons["attention_weight"] = (f"self-attention distillation (weight {DEEP_CUT_ATTENTION_WEIGHT:g}, the same "
                                   f"layers' attention distributions)")
    if budget_steps < MIN_STEPS:
        reasons["min_steps"] = (f"{MIN_STEPS} optimizer steps instead of the budget's {budget_steps}, "
                                f"the first {WARMUP:.0%} warming up")
    reasons["lr_scale"] = f"the learning rate {LR_SCALE:g} times the budget's"
    return StudentDefaults(temperature, DEEP_CUT_HIDDEN_WEIGHT, hidden_layers, MIN_STEPS, reasons, LR_SCALE,
                           DEEP_CUT_ATTENTION_WEIGHT, kd_weight)
