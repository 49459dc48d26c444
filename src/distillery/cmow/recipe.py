"""Method ``cmow``: a bidirectional CMOW/CBOW-Hybrid student by task-specific distillation (§2.3, §3.2).

setup:  a CMOW classifier over the teacher's vocabulary (random init, or the encoder of a general-
        distilled checkpoint with ``init``; an embedder's CBOW vectors start at the teacher's static token
        vectors, ``vectors``); DiffCat for sentence pairs, the whole sequence otherwise. Token
        classification: a CMOW tagger (``CMOWForTokenClassification``), a tag head on each position's per-token
        state (the bidirectional prefix/suffix products of the MLM pretraining), no attention. Sentence embeddings:
        a CMOW embedder (``CMOWForSentenceEmbedding``), its sentence head onto the teacher's vectors' width.
train:  L = (1 − w)·CE(y) + w·CE(softmax(teacher / T), student) (w: kd_weight) with the one trainer; the teacher's
        logits are computed once and cached (a tagger's: one vector a word, compared with the student's first
        sub-words). Regression (STS-B) is trained as classification over
        score bins (``bin_width``, 0.2 as in the paper): the targets are two-hot distributions whose
        expected value is the gold (or the teacher's) score, and the model predicts the expected score.
        An embedder: the embedding kind's distance to the teacher's cached vector of each text (its task term and
        distillation term are that one distance, so kd_weight changes nothing).
        Early stopping on dev (``student.patience`` evaluations without a new best).

Options (``RunConfig.method_options``): see CMOWOptions.
"""

from __future__ import annotations

import logging
from typing import ClassVar

import torch
from transformers import PreTrainedModel

from distillery.cmow.modeling_cmow import (TAG_HEADS, CMOWConfig, CMOWForSequenceClassification,
                                          CMOWForTokenClassification, CMOWPreTrainedModel, checked_config, two_hot)
from distillery.cmow.modeling_embedder import CMOWEmbedderConfig, CMOWForSentenceEmbedding
from distillery.cmow.options import CMOWOptions
from distillery.data.encode import model_inputs
from distillery.data.loading import kind_for
from distillery.data.tasks import get_task
from distillery.errors import DistilleryError
from distillery.kinds import TaskKind
from distillery.method import Method
from distillery.method_context import MethodContext
from distillery.modeling import BASE_HEAD, SEQUENCE_HEAD, TOKEN_HEAD, model_folder, read_config
from distillery.static.options import StaticOptions
from distillery.static.vectors import reduced_token_vectors, sif_weights
from distillery.training.losses import kd_mix, prediction_distillation, soft_cross_entropy_to, task_loss
from distillery.weights import verify_weights

logger = logging.getLogger("distillery")

# the student for each head a task kind trains (distillery.kinds): a CMOW classifier reads the sentence, a tagger
# each token, an embedder (the bare encoder's job: a sentence vector) the sentence into the teacher's vector space;
# SQuAD's span head has none
STUDENTS = {SEQUENCE_HEAD.name: CMOWForSequenceClassification, TOKEN_HEAD.name: CMOWForTokenClassification,
            BASE_HEAD.name: CMOWForSentenceEmbedding}


def _model_dir(path):
    return model_folder(path)


def init_model_config(path) -> CMOWConfig:
    """The config of an ``init`` model, which must be a CMOW encoder (``distillery cmow pretrain``)."""
    folder = _model_dir(path)
    config = read_config(folder)
    if not isinstance(config, CMOWConfig):
        raise DistilleryError(f"init={path} is a {getattr(config, 'model_type', None)!r} model ({folder / 'config.json'}), "
                              f"not a CMOW encoder: give the model folder of `distillery cmow pretrain` (its <out>/model).")
    return config


def score_bins(labels, width: float) -> list[float]:
    """Bin values from the smallest to the largest gold score in steps of ``width`` (STS-B: 0, 0.2, …, 5)."""
    lo, hi = float(min(labels)), float(max(labels))
    n = int(round((hi - lo) / width)) + 1
    return [lo + i * width for i in range(n)] if n > 1 else [lo, lo + width]


def student_head(kind: TaskKind, head: str | None) -> str:
    """The head option for ``kind``'s student: the one asked for, else an MLP over a sentence and a linear map at
    each token (a tagger's head runs at every position: an MLP there would cost more than the products). A head
    that reads a whole sentence is refused for a tagger."""
    head = head or ("linear" if kind.head is TOKEN_HEAD else "mlp")
    if kind.head is TOKEN_HEAD and head not in TAG_HEADS:
        raise DistilleryError(f"--option head={head} reads a whole sentence; a cmow tagger's head is one of "
                              f"{', '.join(TAG_HEADS)}, at each token.")
    return head


def student_pair_mode(kind: TaskKind, is_pair: bool, asked: str | None, task_name: str) -> str:
    """The student's pair mode: the one asked for, else DiffCat for a sentence pair. DiffCat encodes a pair's two
    sentences each alone and combines the two: a task of one text (an embedder's text, a tagger's sentence, a single
    sentence to classify) has no pair to encode so, and asking for it is refused rather than read jointly unsaid."""
    if asked == "diffcat" and not is_pair:
        reads = {BASE_HEAD.name: "a cmow embedder reads one text", TOKEN_HEAD.name: "a cmow tagger reads one sentence"}
        raise DistilleryError(f"--option pair_mode=diffcat encodes the two sentences of a pair apart, and "
                              f"{reads.get(kind.head.name, f'task {task_name} reads one sentence')}: leave pair_mode "
                              f"unset (joint).")
    return asked or ("diffcat" if is_pair else "joint")


def build_student(ctx: MethodContext, opts: CMOWOptions, train) -> CMOWPreTrainedModel:
    """The student for the task's kind (:data:`STUDENTS`), trained next on ``train``; an embedder gives vectors of the
    width of the teacher's there (cached: the teacher's config need not say it, a CMOW embedder's has no hidden size)."""
    task, tokenizer = ctx.task_data.task, ctx.tokenizer
    kind = task.kind_object
    embedder = STUDENTS[kind.head.name] is CMOWForSentenceEmbedding
    pair_mode = student_pair_mode(kind, task.is_pair, opts.pair_mode, task.name)
    bins = None
    if task.num_labels == 1:  # a score (no task has a single class), classified over bins
        bins = score_bins(ctx.task_data.train["labels"], float(opts.bin_width))
    common = dict(
        vocab_size=ctx.teacher.config.vocab_size, component=opts.component, bidirectional=bool(opts.bidirectional),
        matrix_dim=int(opts.matrix_dim), vector_dim=int(opts.vector_dim), pair_mode=pair_mode,
        head=student_head(kind, opts.head), dropout=float(opts.dropout), head_dropout=float(opts.head_dropout),
        pad_token_id=tokenizer.pad_token_id, sep_token_id=tokenizer.sep_token_id)
    if embedder:
        config = CMOWEmbedderConfig(**common, output_dim=len(train[0]["teacher_logits"]))
    else:
        config = CMOWConfig(**common, num_labels=1 if bins else ctx.teacher.config.num_labels, score_bins=bins,
                            id2label=dict(ctx.teacher.config.id2label), label2id=dict(ctx.teacher.config.label2id))
    student = STUDENTS[kind.head.name](config)
    if opts.init is not None:
        from safetensors.torch import load_file

        folder = _model_dir(opts.init)
        source = init_model_config(opts.init)
        verify_weights(folder)
        for name in ("component", "bidirectional", "matrix_dim", "vector_dim"):
            if getattr(source, name) != getattr(config, name):
                raise DistilleryError(f"--init {opts.init} has {name}={getattr(source, name)!r}, this run {getattr(config, name)!r}.")
        state = load_file(str(folder / "model.safetensors"))
        encoder = {k.split("encoder.", 1)[1]: v for k, v in state.items() if "encoder." in k}
        student.encoder.load_state_dict(encoder, strict=True)
        ctx.notes.append(f"Student encoder initialised from the general-distilled {opts.init}.")
    elif vector_start(opts, embedder, config) == "static":
        start_at_static_vectors(student.encoder.vec, ctx, train, config)
    reads = ("a tag at each word's first sub-word from its per-token state" if kind.head is TOKEN_HEAD
             else f"each text into {config.output_dim} numbers, the teacher's sentence vectors' width" if embedder
             else f"{pair_mode} encoding")
    ctx.notes.append(f"Student: {'bidirectional ' if config.bidirectional else ''}CMOW/CBOW {config.component} "
                     f"(d = {config.matrix_dim}, d_vec = {config.vector_dim}), {config.head} head, {reads}"
                     + (f", {len(bins)} score bins of {opts.bin_width}" if bins else "") + ".")
    return student


def vector_start(opts: CMOWOptions, embedder: bool, config: CMOWConfig) -> str | None:
    """Where the CBOW vectors start (``vectors``; None: the student has none): the teacher's static vectors by
    default for an embedder only. An embedder's target is the teacher's mean-pooled vector, which the mean of its
    static token vectors already approaches (method static's table before fine-tuning), while a random table must
    learn every token's meaning from the run's text; a classifier's defaults are the paper's."""
    if not config.uses_vectors:
        return None
    return opts.vectors or ("static" if embedder else "random")


@torch.no_grad()
def start_at_static_vectors(table: torch.nn.Embedding, ctx: MethodContext, train, config: CMOWConfig) -> None:
    """The CBOW table's first min(H, vector_dim) columns set to the teacher's static token vectors (method static's
    recipe: each vocabulary token through the teacher, PCA to vector_dim where the teacher is wider, SIF weights
    counted on ``train``), rescaled to the random start's mean row norm on those columns: the learning rate and
    the head's start were set for that scale. The other columns, the special tokens' rows and the padding row keep
    their start (the specials are no words; the padding row is zero)."""
    if not isinstance(ctx.teacher, torch.nn.Module):
        raise DistilleryError("--option vectors=static runs the teacher on every vocabulary token, and this teacher "
                              "is an export that gives its outputs only: use vectors=random, or the teacher's "
                              "model folder.")
    reduced, _, counted = reduced_token_vectors(ctx.teacher, ctx.tokenizer, config.vector_dim, ctx.config.student.seed,
                                                batch_size=max(ctx.config.student.eval_batch_size, 256))
    if len(reduced) != table.num_embeddings:
        raise DistilleryError(f"The teacher gives {len(reduced)} token vectors and the student has "
                              f"{table.num_embeddings} tokens: CMOW students share the teacher's vocabulary.")
    width = reduced.shape[1]  # min(the teacher's width, vector_dim)
    counted = counted.bool()
    counted[config.pad_token_id] = False
    target = table.weight[counted, :width].norm(dim=1).mean()
    reduced = reduced * (target / reduced[counted].norm(dim=1).mean())
    reduced = reduced * sif_weights(train, counted.float(), StaticOptions.sif)[:, None]
    table.weight[counted, :width] = reduced[counted].to(table.weight.dtype)
    ctx.notes.append(f"CBOW vectors start at the teacher's static token vectors ({width} of {config.vector_dim} "
                     f"columns; PCA, SIF a = {StaticOptions.sif:g} on the run's text).")


def cmow_loss(kind: TaskKind, kd_weight: float, temperature: float):
    """loss_fn for the trainer: (1 − kd_weight)·CE(label) + kd_weight·soft CE(teacher), :func:`kd_mix` (the label:
    gold on the task's rows, the teacher's class or score on augmented and unlabeled rows). Binned regression: both
    targets are two-hot distributions over the bins (gold score, teacher's score); else the task ``kind``'s loss and
    distillation term, given the batch (a tagger's compares each word's first sub-word with the teacher's cached
    logits of that word)."""

    def loss_fn(model, batch):
        out = model(**model_inputs(batch, model))
        teacher = batch["teacher_logits"]
        if getattr(out, "bin_logits", None) is not None:
            bins = model.bin_values
            ce = soft_cross_entropy_to(out.bin_logits, two_hot(batch["labels"].float(), bins))
            kd = soft_cross_entropy_to(out.bin_logits, two_hot(teacher.squeeze(-1), bins))
        else:
            ce = task_loss(kind, out, batch)
            kd = prediction_distillation(kind, out, kind.cached_teacher_outputs(teacher), temperature=temperature,
                                         batch=batch)
        return kd_mix(ce, kd, kd_weight), {"ce": float(ce.detach()), "kd": float(kd.detach())}

    return loss_fn


class CMOW(Method):
    name: ClassVar[str] = "cmow"
    # The student learns from the teacher's logits alone (computed once, before training) and its vocabulary:
    # any teacher that computes them will do, an ONNX or int8 export included (see distillery.teacher).
    teacher_outputs_only: ClassVar[bool] = True

    def check(self, config, teacher_config) -> None:
        opts = self.options(config)
        kind = kind_for(config.data.task, config.data.regression)
        if kind.head.name not in STUDENTS:
            raise DistilleryError(f"cmow has no {kind.head.name} student: it classifies sentences, tags words or "
                                  "embeds sentences, and has no span head for SQuAD.")
        head = student_head(kind, opts.head)  # a custom token file's kind is known once it is read: build_student
        if config.data.task != "custom":  # whether custom data holds pairs is known once it is read: build_student
            student_pair_mode(kind, get_task(config.data.task).is_pair, opts.pair_mode, config.data.task)
        # the student's own checks (its size among them) before the teacher is fine-tuned
        checked_config(vocab_size=teacher_config.vocab_size, component=opts.component, bidirectional=bool(opts.bidirectional),
                       matrix_dim=int(opts.matrix_dim), vector_dim=int(opts.vector_dim), head=head)
        if opts.vectors == "static" and opts.component == "cmow":
            raise DistilleryError("--option vectors=static starts the CBOW vectors, and component=cmow has none: "
                                  "leave vectors unset, or use component=hybrid or cbow.")
        if opts.vectors is not None and opts.init is not None:
            raise DistilleryError(f"--option vectors={opts.vectors} and init={opts.init} both say where the CBOW "
                                  "vectors start: give one.")
        if opts.init is not None:
            init_config = init_model_config(opts.init)
            if init_config.vocab_size != teacher_config.vocab_size:
                raise DistilleryError(f"--init {opts.init} has a vocabulary of {init_config.vocab_size} tokens, the teacher "
                                      f"{teacher_config.vocab_size}: CMOW students share the teacher's tokenizer.")

    def run(self, ctx: MethodContext) -> PreTrainedModel:
        opts = self.options(ctx.config)
        ctx.teacher.eval()
        kind = ctx.task_data.task.kind_object
        # the student's initialisation draws from the run's seed as it was, whatever preparing the text drew (the
        # teacher runs only where its outputs are not cached yet); the trainer seeds its own draws
        with torch.random.fork_rng(devices=[]):
            train = ctx.distillation_train(opts.train_examples == "all", opts.augment)
        student = build_student(ctx, opts, train)
        kd_weight, t = float(opts.kd_weight), float(opts.temperature)
        if isinstance(student, CMOWForSentenceEmbedding):  # the task term and the distillation term are one distance
            ctx.notes.append(f"Loss: {kind.loss_words(kd_weight, t)}; the teacher's vectors computed once and cached.")
        else:
            ctx.notes.append(f"Loss: {1 - kd_weight}·CE(label) + {kd_weight}·soft CE(teacher, T = {t}) (label: gold, or "
                             "the teacher's on augmented and unlabeled rows); teacher outputs computed once and cached.")
        return ctx.train(student, cmow_loss(kind, kd_weight, t), desc="cmow", train_dataset=train)
