"""A pretrained encoder as the student of method ``distill`` (``--student NAME|FOLDER|HUB_ID``).

Instead of a shallower copy of the teacher, the student is an encoder someone already trained (the packaged
``minilm`` or ``mpnet-base`` before any fine-tuning, a local folder, a Hub id), of any family distillery knows.
It keeps its own tokenizer: teacher and student each tokenize the raw text, and the teacher's outputs are
computed once on its own encoding and handed to the student by example (``MethodContext.student_distillation_train``),
never by token ids, so vocabularies and hidden sizes may differ. Its head is kept when it already fits the task,
else a new one is trained (with a log line). A student larger or slower than its teacher is refused: it would
compress nothing.
"""

from __future__ import annotations

import logging

from transformers import AutoConfig, PreTrainedModel

import distillery.encoders as encoders
from distillery.config import DataConfig
from distillery.data.tasks import TaskSpec
from distillery.errors import DistilleryError
from distillery.modeling import first_line, head_for_task, load_checked, load_tokenizer
from distillery.teacher import TEACHER_HUB_IDS, check_vocabulary, head_kwargs, resolve_teacher, usable_positions

logger = logging.getLogger("distillery")

# How much slower than the teacher a student may measure before it is refused: timing noise on a busy
# machine, not a student that is really slower (those are refused by their parameter count first).
SPEED_SLACK = 1.10


def origin(name: str) -> str:
    """Where the student came from, as a model card's ``base_model`` names it: the Hub id of a packaged
    encoder, else the name, folder or Hub id given."""
    return TEACHER_HUB_IDS.get(name, name)


def student_config(name: str):
    """The student's config, refused with a sentence when it is no encoder distillery knows (a decoder)
    or already one of distillery's own students (those are compressed as teachers, not distilled into)."""
    source = resolve_teacher(name, "Student")
    try:
        config = AutoConfig.from_pretrained(source)
    except (OSError, ValueError) as e:
        raise DistilleryError(f"Could not load student {name!r}: {first_line(e)}") from None
    if encoders.is_distillery_student(config):
        raise DistilleryError(f"Student {name!r} is a distillery {config.model_type!r} student; --student takes a "
                              f"pretrained encoder (give that model as --teacher to compress it further).")
    encoders.layout_of(config, f"Student {name!r}")
    return config


def student_tokenizer(name: str, config):
    """The student's own tokenizer, checked against its vocabulary (a folder without tokenizer files is
    refused with a sentence naming it)."""
    source = resolve_teacher(name, "Student")
    try:
        tokenizer = load_tokenizer(source)
    except (ValueError, TypeError) as e:  # transformers' error for a folder with no tokenizer files at all
        raise DistilleryError(f"Student {name!r} has no tokenizer ({first_line(e)}); save the tokenizer beside "
                              f"the model (tokenizer.save_pretrained).") from None
    check_vocabulary(tokenizer, config, f"student {source}")
    return tokenizer


def check_student(name: str, data: DataConfig) -> None:
    """Everything about ``--student`` that can be refused before the teacher is fine-tuned."""
    config = student_config(name)
    tokenizer = student_tokenizer(name, config)
    usable = usable_positions(config)
    if usable is not None and data.max_length > usable:
        raise DistilleryError(f"max_length {data.max_length} is longer than student {name!r} can read: it has "
                              f"{usable} positions.")
    if data.task in ("squad", "squad_v2") and not getattr(tokenizer, "is_fast", False):
        raise DistilleryError(f"SQuAD needs a fast tokenizer (character offsets); student {name!r} has a "
                              f"{type(tokenizer).__name__}.")


def load_student(name: str, task: TaskSpec) -> tuple[PreTrainedModel, object]:
    """The pretrained student with ``task``'s head and its own tokenizer. A head that already fits the task
    (its class and number of outputs) is kept; otherwise a new one is trained, which is logged."""
    config = student_config(name)
    tokenizer = student_tokenizer(name, config)
    head = head_for_task(task.kind)
    model, loading = load_checked(head.auto_class, resolve_teacher(name, "Student"), f"student {name!r}",
                                  new_head=True, **head_kwargs(task))
    new = [k for k in loading["missing_keys"] if not k.startswith(f"{model.base_model_prefix}.pooler.")]
    if new or loading["mismatched_keys"]:
        logger.info("Student %s has no %s head of the task's shape; it gets a new one, trained here.", name, task.name)
    else:
        logger.info("Student %s keeps its own %s head: it already fits the task.", name, task.name)
    return model, tokenizer


def same_tokenizer(a, b) -> bool:
    """Whether two tokenizers turn every text into the same ids (then hidden states line up token by token)."""
    if getattr(a, "is_fast", False) and getattr(b, "is_fast", False):
        return a.backend_tokenizer.to_str() == b.backend_tokenizer.to_str()
    return type(a) is type(b) and a.get_vocab() == b.get_vocab()


def check_smaller(teacher, student, name: str, shape: tuple[int, int], runs: int = 10) -> dict[str, float]:
    """Refuse a student with more parameters than the teacher, or slower per forward pass (measured here,
    both models taking turns), with the measured numbers in the sentence. Returns the latencies (ms)."""
    from distillery.bench import count_parameters, latency_ms

    t_params, s_params = count_parameters(teacher)[0], count_parameters(student)[0]
    if s_params >= t_params:
        raise DistilleryError(f"Student {name!r} has {s_params / 1e6:.2f}M parameters, no fewer than the teacher's "
                              f"{t_params / 1e6:.2f}M: distilling into it would compress nothing. Choose a smaller "
                              f"pretrained encoder.")
    ms = latency_ms({"teacher": teacher, "student": student}, shape=shape, runs=runs, warmup=2)
    if ms["student"] > ms["teacher"] * SPEED_SLACK:
        raise DistilleryError(f"Student {name!r} is slower than the teacher: {ms['student']:.2f} ms per forward pass "
                              f"against the teacher's {ms['teacher']:.2f} ms at batch {shape[0]} x {shape[1]} tokens, "
                              f"measured here. Choose a faster pretrained encoder.")
    logger.info("Student %s: %.2fM parameters (teacher %.2fM), %.2f ms per pass (teacher %.2f ms).", name,
                s_params / 1e6, t_params / 1e6, ms["student"], ms["teacher"])
    return ms


def squad_distillation_train(ctx, whole: bool, temperature: float):
    """The student's own SQuAD training windows, each with the teacher's start and end distributions (at
    ``temperature``) carried onto its positions through character offsets (:mod:`distillery.distill.span_carry`):
    the teacher's outputs are computed on its own windows of the same examples (and cached)."""
    from dataclasses import replace

    import numpy as np

    from distillery.data.encode import squad_window_offsets
    from distillery.data.loading import load_raw
    from distillery.distill.span_carry import carry

    teacher_data = ctx.whole_split() if whole else ctx.task_data
    student_data = ctx.whole_split(ctx.student_data) if whole else ctx.student_data
    data = ctx.config.data if teacher_data is ctx.task_data else replace(ctx.config.data, train_limit=None)
    raw = load_raw(teacher_data.task, "train", data)
    windows = {name: squad_window_offsets(raw, tok, data.max_length, data.doc_stride)
               for name, tok in (("teacher", ctx.tokenizer), ("student", ctx.student_tokenizer))}
    t, s = windows["teacher"], windows["student"]
    if len(t["sample"]) != len(teacher_data.train) or len(s["sample"]) != len(student_data.train):
        raise DistilleryError("The SQuAD windows of teacher and student do not line up with their encoded train splits.")
    outputs = ctx.teacher_outputs(teacher_data).astype(np.float64)
    width = outputs.shape[1] // 2
    train = student_data.train
    for which, logits in (("start", outputs[:, :width]), ("end", outputs[:, width:])):
        logits = logits[:, : t["offsets"].shape[1]] / temperature
        # a window's padding (the teacher's logits there are whatever its batch's padding made them) gets p = 0
        logits = np.where(np.arange(logits.shape[1])[None, :] < t["lengths"][:, None], logits, -np.inf)
        probs = np.exp(logits - logits.max(axis=1, keepdims=True))
        probs /= probs.sum(axis=1, keepdims=True)
        mass, rest = carry(probs, t["offsets"], t["sample"], s["offsets"], s["sample"], t["context_lengths"], which)
        mass[np.arange(len(mass)), s["cls"]] += rest  # SQuAD's target for "not in this window"
        train = train.add_column(f"teacher_{which}", [row[:n].tolist() for row, n in zip(mass, s["lengths"])])
    return train
