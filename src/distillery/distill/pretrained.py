"""A pretrained encoder as the student of method ``distill`` (``--student NAME|FOLDER|HUB_ID``).

Instead of a shallower copy of the teacher, the student is an encoder someone already trained (the packaged
``minilm`` or ``mpnet-base`` before any fine-tuning, a local folder, a Hub id), of any family distillery knows.
It keeps its own tokenizer: teacher and student each tokenize the raw text, and the teacher's outputs are
computed once on its own encoding and handed to the student by example (``MethodContext.student_distillation_train``),
never by token ids, so vocabularies and hidden sizes may differ: a sentence's outputs to the same sentence, a
tagger's to the same word (its first sub-word in each encoding), SQuAD's through character offsets. Its head is kept when it already fits the task,
else a new one is trained (with a log line). A student larger or slower than its teacher is refused: it would
compress nothing.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Sequence

from transformers import PreTrainedModel

import distillery.encoders as encoders
from distillery.bench import count_parameters, latency_ms
from distillery.config import DataConfig, TEACHER_HUB_IDS
from distillery.data.encode import model_device, model_inputs, prepare_task_data, squad_window_offsets
from distillery.data.loading import kind_for, load_raw
from distillery.data.tasks import TaskSpec
from distillery.distill import deep_cut
from distillery.distill.span_carry import carry
from distillery.errors import DistilleryError
from distillery.kinds.embedding import batch_pooling, pooled
from distillery.modeling import first_line, load_checked, load_config, load_tokenizer
from distillery.teacher import check_vocabulary, resolve_teacher, usable_positions
from distillery.training.losses import HiddenProjection, pretrained_distillation_loss

logger = logging.getLogger("distillery")
PROJECTION_FIT_ROWS = 2048  # rows whose vectors fit the start of a width-changing map (a few seconds of the student)

# How much slower than the teacher a student may measure before it is refused: timing noise on a busy
# machine, not a student that is really slower (those are refused by their parameter count first).
SPEED_SLACK = 1.10
SQUAD_HIDDEN = ("Option hidden_weight with a student of another tokenizer aligns sentence vectors, which SQuAD's "
                "windows do not share; drop hidden_weight for SQuAD.")


def origin(name: str) -> str:
    """Where the student came from, as a model card's ``base_model`` names it: the Hub id of a packaged
    encoder, else the name, folder or Hub id given."""
    return TEACHER_HUB_IDS.get(name, name)


def student_config(name: str):
    """The student's config, refused with a sentence when it is no encoder distillery knows (a decoder)
    or already one of distillery's own students (those are compressed as teachers, not distilled into)."""
    config = load_config(resolve_teacher(name, "Student"), f"Could not load student {name!r}")
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


def check_student(name: str, data: DataConfig, teacher_config, shape: Sequence[int], teacher_tokenizer=None,
                  hidden_weight: float = 0.0) -> bool:
    """Everything about ``--student`` that can be refused before the teacher is fine-tuned, its size and speed
    against the teacher's architecture included (:func:`check_smaller`). False when the teacher's architecture
    cannot be built from its config alone (a distillery student as teacher): then the run measures the models.
    ``teacher_tokenizer`` and ``hidden_weight``: SQuAD's windows share no sentence vectors to align across tokenizers."""
    config = student_config(name)
    tokenizer = student_tokenizer(name, config)
    usable = usable_positions(config)
    if usable is not None and data.max_length > usable:
        raise DistilleryError(f"max_length {data.max_length} is longer than student {name!r} can read: it has "
                              f"{usable} positions.")
    kind = kind_for(data.task, data.regression)
    if kind.needs_offsets and not getattr(tokenizer, "is_fast", False):
        what = "character offsets" if kind.doc_strides else "its words' sub-words"
        raise DistilleryError(f"Task kind {kind.name} needs a fast tokenizer ({what}); student {name!r} has a "
                              f"{type(tokenizer).__name__}.")
    if hidden_weight and kind.doc_strides and not same_tokenizer(teacher_tokenizer, tokenizer):
        raise DistilleryError(SQUAD_HIDDEN)
    try:
        teacher = from_config(teacher_config)
    except (ValueError, KeyError):  # no Auto class knows this teacher's config: its loaded model is measured
        return False
    check_smaller(teacher, from_config(config), name, shape)
    return True


def load_student(name: str, task: TaskSpec) -> tuple[PreTrainedModel, object]:
    """The pretrained student with ``task``'s head and its own tokenizer. A head that already fits the task
    (its class and number of outputs) is kept; otherwise a new one is trained, which is logged."""
    config = student_config(name)
    tokenizer = student_tokenizer(name, config)
    kind = task.kind_object
    model, loading = load_checked(kind.head.auto_class, resolve_teacher(name, "Student"), f"student {name!r}",
                                  new_head=True, **kind.head_config(task))
    new = [k for k in loading["missing_keys"] if not k.startswith(f"{model.base_model_prefix}.pooler.")]
    if new or loading["mismatched_keys"]:
        logger.info("Student %s has no %s head of the task's shape; it gets a new one, trained here.", name, task.name)
    else:
        logger.info("Student %s keeps its own %s head: it already fits the task.", name, task.name)
    return model, tokenizer


def same_tokenizer(a, b) -> bool:
    """Whether two tokenizers turn every text into the same ids (then hidden states line up token by token)."""
    if getattr(a, "is_fast", False) and getattr(b, "is_fast", False):
        import json

        # truncation and padding are call-time state a tokenizer's last call leaves behind, not what it is
        def what(tok) -> dict:
            state = json.loads(tok.backend_tokenizer.to_str())
            return {k: v for k, v in state.items() if k not in ("truncation", "padding")}

        return what(a) == what(b)
    return type(a) is type(b) and a.get_vocab() == b.get_vocab()


def measure(teacher, student, shape: Sequence[int], runs: int) -> tuple[int, int, dict[str, float]]:
    """(teacher parameters, student parameters, {name: median ms per forward pass}), the two models taking turns
    here. Models built from configs serve as well as trained ones: weights do not change the time."""
    t_params, s_params = count_parameters(teacher)[0], count_parameters(student)[0]
    if s_params >= t_params:  # no timing needed to refuse it
        return t_params, s_params, {}
    return t_params, s_params, latency_ms({"teacher": teacher, "student": student}, tuple(shape), runs=max(int(runs), 3))


def from_config(config):
    """A randomly initialised encoder of ``config``'s architecture, to count and time (no weights are read)."""
    from transformers import AutoModel

    return AutoModel.from_config(config).eval()


def check_smaller(teacher, student, name: str, shape: Sequence[int], runs: int = 10) -> dict[str, float]:
    """Refuse a student with more parameters than the teacher, or slower per forward pass (measured here,
    both models taking turns), with the measured numbers in the sentence. Returns the latencies (ms)."""
    t_params, s_params, ms = measure(teacher, student, shape, runs)
    if s_params >= t_params:
        raise DistilleryError(f"Student {name!r} has {s_params / 1e6:.2f}M parameters, no fewer than the teacher's "
                              f"{t_params / 1e6:.2f}M: distilling into it would compress nothing. Choose a smaller "
                              f"pretrained encoder.")
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


def layer_map_for(student_layers: int, teacher_layers: int, given: list[int] | None) -> list[int]:
    """The teacher layer each student layer learns from: ``given`` (checked), else spread evenly with the last
    student layer on the teacher's last."""
    if given is None:
        return [(j + 1) * teacher_layers // student_layers - 1 for j in range(student_layers)]
    if len(given) != student_layers or not all(0 <= t < teacher_layers for t in given):
        raise DistilleryError(f"Option layer_map {given} must name one teacher layer (0 to {teacher_layers - 1}) for "
                              f"each of the student's {student_layers} layers.")
    return list(given)


def teacher_pooled(ctx, task_data):
    """The teacher's sentence vector (its last layer mean-pooled over the tokens) for each train row of
    ``task_data``, as an array: one batched pass without gradients, cached as the teacher's logits are."""
    return ctx.teacher_outputs(task_data, "pooled", lambda: _pooled_pass(ctx, task_data))


def _pooled_pass(ctx, task_data):
    return pooled_vectors(ctx.teacher, task_data.train, task_data.collate, ctx.config.student.eval_batch_size).numpy()


def pooled_vectors(model, rows, collate, batch_size: int):
    """``model``'s last hidden states pooled over each of ``rows``' tokens (their mean, or as an embedder's run
    pools), (N, d) float32 on the CPU: one batched pass without gradients, in eval mode (its mode restored after)."""
    import torch
    from torch.utils.data import DataLoader

    out, was_training = [], model.training
    model.eval()
    with torch.inference_mode():
        for batch in DataLoader(rows, batch_size=batch_size, collate_fn=collate):
            hidden = model(**model_inputs(batch, model), output_hidden_states=True).hidden_states[-1]
            mask = batch.get("attention_mask")
            mask = None if mask is None else mask.to(model_device(model))
            out.append(pooled(hidden, mask, batch_pooling(batch)).float().cpu())  # as the run pools (an embedder's)
    model.train(was_training)
    return torch.cat(out)


def pooled_and_targets(student, train, collate, rows: int = PROJECTION_FIT_ROWS):
    """The student's mean-pooled last hidden states and the teacher's cached vectors (unit length) of the first
    ``rows`` training rows: where an embedder of another width learns through a map onto the teacher's vectors, the
    map starts at their least-squares fit (:meth:`HiddenProjection.start_at_least_squares`). On a lent H200,
    all-MiniLM-L6-v2 taught all-mpnet-base-v2's vectors through a random map for one pass over 16,000 sentences ended
    at STS-B 0.812 against its own 0.867 (docs/embedding.md, "A pretrained student of another width")."""
    import numpy as np
    import torch
    import torch.nn.functional as F

    sample = train.select(range(min(int(rows), len(train))))
    targets = torch.as_tensor(np.asarray(sample["teacher_logits"], dtype=np.float32))
    return pooled_vectors(student, sample, collate, 64), F.normalize(targets, dim=-1)


def latency_shape(config) -> tuple[int, int]:
    """The run's latency shape (``bench.latency_shape``), at which a student's speed is compared."""
    return tuple(config.bench.get("latency_shape", (1, 128)))


def run_pretrained(ctx, opts, measured: bool = True) -> PreTrainedModel:
    """Method distill with ``--student``: the pretrained encoder learns the teacher's outputs, aligned by example
    (SQuAD: carried through character offsets), and with ``hidden_weight`` its hidden states (per layer where the
    tokenizers match, else sentence vectors) through a learned projection onto the teacher's width. ``measured``:
    :func:`check_student` already compared its size and speed with the teacher's."""
    task = ctx.task_data.task
    student, tokenizer = load_student(opts.student, task)
    if not measured:
        check_smaller(ctx.teacher, student, opts.student, latency_shape(ctx.config))
    ctx.student_tokenizer, ctx.student_origin = tokenizer, origin(opts.student)
    ctx.student_data = prepare_task_data(task, tokenizer, ctx.config.data, pair_mode=ctx.task_data.pair_mode)
    ctx.teacher.eval()
    whole = opts.train_examples == "all"
    matched = same_tokenizer(ctx.tokenizer, tokenizer)
    # the teacher's sentence vectors, on its own encoding of the student's rows (new rows too), where they are aligned
    vectors = bool(opts.hidden_weight) and not matched and not task.kind_object.doc_strides
    pooled = (lambda data: {"teacher_pooled": teacher_pooled(ctx, data).tolist()}) if vectors else None
    kind = task.kind_object
    train = ctx.student_distillation_train(whole, opts.augment, pooled) if kind.caches_teacher_outputs \
        else squad_distillation_train(ctx, whole, opts.temperature or deep_cut.FALLBACK_TEMPERATURE)
    if opts.temperature is None:  # it keeps its own layers: of the deep-cut rule, only the temperature applies
        read = kind.softened_outputs and "teacher_logits" in train.column_names
        temperature, why = deep_cut.temperature_choice(kind.cached_predictions(train) if read else None)
        opts = replace(opts, temperature=temperature)
        ctx.notes.extend([f"Defaults for this student: {why}."] if why else [])
    layer_map, projection, hidden = None, None, ""
    width, wanted = student.config.hidden_size, ctx.teacher.config.hidden_size
    # an embedder of another width: its vectors are compared with the teacher's through a learned map, in the loss only
    onto_teacher = HiddenProjection(width, wanted) if task.kind_object.projects_width and width != wanted else None
    if onto_teacher is not None:
        onto_teacher.start_at_least_squares(*pooled_and_targets(student, train, ctx.student_data.collate))
    if opts.hidden_weight:
        projection = HiddenProjection(width, wanted)
        if matched:
            layer_map = layer_map_for(student.config.num_hidden_layers, ctx.teacher.config.num_hidden_layers,
                                      opts.layer_map)
            hidden = f" + {opts.hidden_weight}·hidden MSE (student layers onto teacher layers {layer_map})"
        elif task.kind_object.doc_strides:  # windows of a document: no sentence vector to compare across tokenizers
            raise DistilleryError(SQUAD_HIDDEN)
        else:
            hidden = f" + {opts.hidden_weight}·MSE of the mean-pooled sentence vectors (the tokenizers differ)"
    words = "the teacher's" if matched else "its own"
    ctx.notes.append(f"Student: the pretrained encoder {ctx.student_origin} ({student.config.model_type}, "
                     f"{student.config.num_hidden_layers} layers, {words} tokenizer), loss "
                     f"{task.kind_object.loss_words(opts.kd_weight, opts.temperature)} on the "
                     f"teacher's outputs{hidden}" + (f", through a learned projection of its {width} dimensions onto "
                                                    f"the teacher's {wanted} (in the loss only)" if onto_teacher else "")
                     + ".")
    logger.info("Teacher outputs on %d training examples, computed once on the teacher's own encoding.", len(train))
    loss_fn = pretrained_distillation_loss(task.kind_object, ctx.teacher, opts.kd_weight, opts.temperature,
                                           opts.hidden_weight, projection, layer_map, onto_teacher)
    return ctx.train(student, loss_fn, desc="student", train_dataset=train,
                     extra_parameters=[p for p in (projection, onto_teacher) if p is not None])
