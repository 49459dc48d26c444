"""What the pipeline hands to a compression method: :class:`MethodContext` (the teacher, the task's data,
the run folder, and the one trainer and the teacher's cached logits as services). The method contract
itself, :class:`~distillery.method.Method`, and the methods' options live in :mod:`distillery.method`."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from transformers import PreTrainedModel

import distillery.distributed as distributed
from distillery.config import RunConfig, cache_root
from distillery.data.augment import WordSource, augmented_rows, augmented_word_rows
from distillery.data.encode import TaskData, content_digest, prepare_task_data
from distillery.data.loading import check_new_rows, column_values, load_raw, load_unlabeled
from distillery.errors import DistilleryError
from distillery.evaluation import predict, score
from distillery.folders import atomic_file, writing
from distillery.kinds import TaskKind
from distillery.modeling import first_line, load_config, load_tokenizer
from distillery.runtime import on_device, weights_digest
from distillery.teacher import resolve_teacher
from distillery.training.trainer import Trainer

logger = logging.getLogger("distillery")


@dataclass
class MethodContext:
    config: RunConfig
    teacher: PreTrainedModel  # fine-tuned on the task, eval mode
    tokenizer: Any
    task_data: TaskData  # encoded train/dev of the task, with the teacher's tokenizer
    out_dir: Path  # the run folder; the trainer keeps its checkpoints in out_dir/"checkpoints"
    resume: bool = False
    notes: list[str] = field(default_factory=list)  # lines a method wants in the report
    student_examples: int | None = None  # what the student last trained on (:meth:`train`), for the report
    # what the student's text held (:meth:`distillation_train`): labelled, augmented and unlabeled rows,
    # the augmentation source and the teacher's labelling time, for the report and the model card
    student_text: dict[str, Any] | None = None
    # A pretrained student with its own tokenizer (distill --student): the task encoded for it. The pipeline
    # saves, scores and exports the student with these; None: the student reads the teacher's encoding.
    student_tokenizer: Any = None
    student_data: TaskData | None = None
    student_origin: str | None = None  # where the pretrained student came from (a name, folder or Hub id)

    @property
    def student_side(self) -> tuple[Any, TaskData]:
        """The tokenizer and encoded task the student reads: its own, or the teacher's."""
        if self.student_data is not None:
            return self.student_tokenizer, self.student_data
        return self.tokenizer, self.task_data

    @property
    def options(self) -> dict[str, Any]:
        return self.config.method_options

    def train(self, student: PreTrainedModel, loss_fn, *, desc: str, train_dataset=None, collate_fn=None,
              extra_parameters=(), **settings) -> PreTrainedModel:
        """Train ``student`` with the one trainer and return it: the task's train split (or
        ``train_dataset`` / ``collate_fn``), the student settings (``settings``: fields of them the
        method sets otherwise, e.g. ``lr``), ``extra_parameters`` trained beside it (a projection the loss
        uses), checkpoints in the run folder, dev scored with the task's
        main metric at each evaluation; the teacher follows the student to the trainer's device."""
        from dataclasses import replace

        passes = self.config.student.whole_split_epochs
        _, data = self.student_side
        beyond = train_dataset is not None and len(train_dataset) > len(data.train)  # the whole split
        if beyond and passes and "epochs" not in settings:
            settings["epochs"] = passes
            self.notes.append(f"Student: {passes:g} pass(es) over the whole train split "
                              "(student.whole_split_epochs; --epochs sets it).")
        cfg = replace(self.config.student, **settings)
        self.student_examples = len(data.train if train_dataset is None else train_dataset)
        trainer = Trainer(
            student,
            cfg,
            data.train if train_dataset is None else train_dataset,
            collate_fn or data.collate,
            loss_fn,
            out_dir=self.out_dir,
            eval_fn=lambda m: score(m, data, batch_size=cfg.eval_batch_size),
            main_metric=data.task.main_metric,
            resume=self.resume,
            extra_parameters=extra_parameters,
            desc=desc,
        )
        on_device(self.teacher, trainer.device)
        return trainer.train().model

    def whole_split(self, task_data: TaskData | None = None) -> TaskData:
        """The task's data with every example of its train split when the budget limited it
        (``data.train_limit``), else the run's own. The teacher, fine-tuned on the budget's examples,
        labels the rest: distillation data, as the papers' students use (CMOW's whole split, TinyBERT's
        augmented set); a student costs far less per example than the teacher's fine-tuning.
        ``task_data``: another encoding of the task (a pretrained student's own; default the run's)."""
        task_data = task_data or self.task_data
        limit = self.config.data.train_limit
        if limit is None or len(task_data.train) < limit:  # below the limit the run has them all
            return task_data
        from dataclasses import replace

        full = prepare_task_data(task_data.task, task_data.tokenizer, replace(self.config.data, train_limit=None),
                                 splits=("train",))
        if len(full.train) <= len(task_data.train):
            return task_data
        note = (f"Student data: all {len(full.train)} training examples, labelled by the teacher "
                f"(fine-tuned on {len(task_data.train)}).")
        if note not in self.notes:  # a pretrained student's own encoding of the same split says it once
            self.notes.append(note)
        return replace(task_data, train=full.train)

    def distillation_train(self, whole_split: bool, augment: int = 0, logits: bool = True):
        """The one home of the student's training text: the run's train examples (with ``whole_split``
        the task's whole train split, :meth:`whole_split`), plus ``augment`` new examples per original
        (TinyBERT's augmentation, :mod:`distillery.data.augment`) and the rows of ``data.unlabeled_file``,
        with the teacher's logits (:meth:`train_with_teacher_logits`). A new row's ``labels`` are the
        teacher's (its class, or its score), never an original's: the hard-label term of every loss then
        reads the teacher on those rows, and the gold label where there is one. ``logits=False`` (a
        method whose loss runs the teacher itself) skips the labelling pass when there are no new rows.
        What the student saw is recorded in ``student_text`` for the report."""
        task_data = self.whole_split() if whole_split else self.task_data
        new = self._new_rows(task_data, augment)
        if new is None:
            return self.train_with_teacher_logits(task_data) if logits else task_data.train
        return self._labelled_with_new_rows(task_data, new)

    def student_distillation_train(self, whole_split: bool, augment: int = 0, teacher_columns=None):
        """:meth:`distillation_train` for a pretrained student with its own tokenizer (``student_data``): its
        own encoding of the same examples (and of the same new rows), each with the teacher's logits computed
        on the teacher's encoding of that example (cached as :meth:`train_with_teacher_logits`). Targets are
        aligned by example, never by token ids (a tagger's, by word: ``TaskKind.carried_teacher_logits``): both
        encodings come from the same raw rows in the same order, checked by their labels. New rows are labelled
        from the teacher's logits so carried, as the teacher's encoding of them is. ``teacher_columns(task_data)``:
        more columns computed on the teacher's encoding of the same rows (its sentence vectors), one value a row."""
        teacher_data = self.whole_split() if whole_split else self.task_data
        student_data = self.whole_split(self.student_data) if whole_split else self.student_data
        kind, originals = teacher_data.task.kind_object, len(teacher_data.train)
        new = self._new_rows(teacher_data, augment)
        if new is None:
            student_train = student_data.train
        else:
            student_train = _joined(student_data, new)
            teacher_data = replace(teacher_data, train=_joined(teacher_data, new))
        labelled = self.train_with_teacher_logits(teacher_data)
        carried = kind.carried_teacher_logits(labelled, student_train, originals)
        if carried is None:  # never expected: one loader reads the rows for both tokenizers
            raise DistilleryError(f"The student's encoding of the train split ({len(student_train)} rows) does not "
                                  f"line up with the teacher's ({len(labelled)} rows).")
        student_train = student_train.add_column("teacher_logits", carried)
        for name, column in (teacher_columns(teacher_data) if teacher_columns else {}).items():
            student_train = student_train.add_column(name, column)
        return student_train if new is None else label_new_rows(student_train, originals, kind)

    def _new_rows(self, task_data: TaskData, augment: int):
        """The raw new rows (augmented, unlabeled) beside ``task_data``'s train split, or None; records what
        the student's text holds in ``student_text``."""
        new, facts = extra_rows(self, task_data, int(augment))
        # a second call in a run (autotinybert's further training after its super-net) reads the logits the
        # first computed: the run's labelling time is the sum
        spent = (self.student_text or {}).get("labelling_seconds", 0.0)
        self.student_text = {"labelled": len(task_data.train), **facts, "labelling_seconds": spent}
        self.notes[:] = list(dict.fromkeys(self.notes))  # a second call says the same of the same text
        return new

    def _labelled_with_new_rows(self, task_data: TaskData, new):
        """``task_data``'s train split and the raw ``new`` rows encoded beside it, all with the teacher's
        logits, the new rows labelled by the teacher (:func:`label_new_rows`)."""
        labelled = self.train_with_teacher_logits(replace(task_data, train=_joined(task_data, new)))
        return label_new_rows(labelled, len(task_data.train), task_data.task.kind_object)

    def train_with_teacher_logits(self, task_data: TaskData | None = None):
        """The train split plus a ``teacher_logits`` column (classification: logits; regression: the
        score; token classification: a list of one vector a word): :meth:`teacher_outputs` on it.
        ``task_data``: another encoding of the task to label (default the run's)."""
        task_data = task_data or self.task_data
        column = task_data.task.kind_object.teacher_logits_column(self.teacher_outputs(task_data), task_data.train)
        return task_data.train.add_column("teacher_logits", column)

    def teacher_outputs(self, task_data: TaskData, name: str = "logits", compute=None):
        """The teacher's outputs on ``task_data``'s train split, one row per train row (classification: logits;
        regression: the score; SQuAD: start then end logits, each padded to the longest window; token
        classification: the logits of each word's first sub-word: ``TaskKind.cached_rows``; or ``name``d
        others, ``compute()`` giving them: a pretrained student's sentence vectors), computed once
        per teacher and data: cached under ``$DISTILLERY_CACHE/logits`` by a hash of the teacher's weights (an
        export's graph or int8 weights: ``runtime.weights_digest``) and the encoded train split, so a second
        student of the same task (another method, an ablation, a resumed run) does not pay the teacher's passes again."""
        import hashlib
        import time

        import numpy as np

        train = task_data.train
        key = hashlib.sha256(f"{weights_digest(self.teacher)} {content_digest(train)}".encode()).hexdigest()[:16]
        kind = "" if name == "logits" else f"{name}-"  # the logits keep the names their entries always had
        path = cache_root() / "logits" / f"{task_data.task.name}-{kind}{key}.npy"
        # Under a launcher, each node's first process fills the cache and the others then read it.
        with distributed.local_main_first():
            logits = read_logits_cache(path, len(train))
            if logits is None:
                started = time.perf_counter()
                if compute is not None:
                    logits = np.asarray(compute(), dtype=np.float32).reshape(len(train), -1)
                else:
                    logits = task_data.task.kind_object.cached_rows(predict(
                        self.teacher, task_data, batch_size=self.config.student.eval_batch_size, split="train",
                        desc="teacher labels"), train)
                with writing(path, "the teacher's logits (a cache entry)"):
                    path.parent.mkdir(parents=True, exist_ok=True)
                    with atomic_file(path) as f:  # a killed run leaves no half-written cache entry
                        np.save(f, logits)
                if self.student_text is not None:
                    self.student_text["labelling_seconds"] += round(time.perf_counter() - started, 2)
        return logits


def read_logits_cache(path: Path, rows: int):
    """The teacher logits cached in ``path`` (float32, ``rows`` rows), or None when there are none or
    the file cannot be trusted (truncated, an object array, another shape): then it is deleted, with
    a warning naming it, to be computed again. Never unpickled."""
    import numpy as np

    if not path.is_file():
        return None
    try:
        logits = np.load(path, allow_pickle=False)
        if logits.dtype != np.float32 or logits.ndim != 2 or logits.shape[0] != rows:
            raise ValueError(f"a {logits.dtype} array of shape {logits.shape}, not {rows} rows of float32")
    except (ValueError, EOFError, OSError) as e:  # numpy's errors on truncated, pickled or garbled files
        logger.warning("The cached teacher logits %s are damaged (%s); they are deleted and computed again.",
                       path, str(e).splitlines()[0] if str(e) else type(e).__name__)
        path.unlink(missing_ok=True)
        return None
    return logits


# At most this many augmented rows: N is lowered for a large train split (SST-2's 67k at N = 20 would be
# 1.3M rows; TinyBERT's small tasks, which gain most, stay whole: MRPC 3.7k, RTE 2.5k, STS-B 5.7k).
AUGMENT_MAX_ROWS = 200_000


def extra_rows(ctx: MethodContext, task_data: TaskData, augment: int):
    """The student's new rows besides ``task_data``'s train split, raw (``text``, ``text_pair``) with placeholder
    labels, or None; and what they are (counts and the augmentation source) for the report."""
    import datasets

    task, data = task_data.task, ctx.config.data
    kind = task.kind_object
    facts: dict[str, Any] = {"augmented": 0, "unlabeled": 0, "augment_source": None}
    check_new_rows(task, augment, data.unlabeled_file)
    parts = []
    if augment:
        from dataclasses import replace

        limit = None if len(task_data.train) > len(ctx.task_data.train) else data.train_limit
        raw = load_raw(task, "train", replace(data, train_limit=limit))
        n = max(1, min(int(augment), AUGMENT_MAX_ROWS // max(1, len(raw))))
        if n < augment:
            ctx.notes.append(f"Augmentation: {n} new examples per original, not {augment}, so that the "
                             f"{len(raw)} originals make at most {AUGMENT_MAX_ROWS} new rows.")
        source = augment_source(ctx)
        pairs = column_values(raw, "text_pair") if task.is_pair else None
        with distributed.local_main_first():  # under a launcher one process per node augments, the others read
            if kind.word_labels:  # a sentence of words: one word for one word, so each keeps its place
                columns = augmented_word_rows(column_values(raw, "tokens"), source, n, ctx.config.student.seed,
                                              cache_root() / "augment")
            else:
                columns = augmented_rows(column_values(raw, "text"), pairs, source, n, ctx.config.student.seed,
                                         cache_root() / "augment")
        parts.append(datasets.Dataset.from_dict(columns))
        facts.update(augmented=len(parts[-1]), augment_source=source.name)
        ctx.notes.append(f"Augmentation (TinyBERT): {n} new examples per train example from {source.name}, "
                         f"{len(parts[-1])} in all, labelled by the teacher.")
    if data.unlabeled_file:
        parts.append(load_unlabeled(data.unlabeled_file, task))
        facts["unlabeled"] = len(parts[-1])
        ctx.notes.append(f"Unlabeled text: {len(parts[-1])} rows of {data.unlabeled_file}, labelled by the teacher.")
    if not parts:
        return None, facts
    return kind.unlabelled(datasets.concatenate_datasets(parts)), facts


def _joined(task_data: TaskData, new):
    """``task_data``'s train split followed by the raw ``new`` rows, encoded with its tokenizer as the rows
    they join are (a DiffCat student's split holds each side on its own; a tagger's new words are labelled on
    their first sub-words, which the teacher's tags then fill)."""
    import datasets

    pair_mode = "separate" if "input_ids_b" in task_data.train.column_names else "joint"
    encoded = task_data.task.kind_object.encode(task_data.task, new, task_data.tokenizer, task_data.data_config,
                                                pair_mode, "new", train=False)
    return datasets.concatenate_datasets([task_data.train, encoded.select_columns(task_data.train.column_names)])


def augment_source(ctx: MethodContext):
    """Where augmentation's candidates come from: ``--augment-model``, else the teacher checkpoint's own
    MLM head, else nearest neighbours in the teacher's input embeddings."""
    from transformers import AutoModelForMaskedLM

    name = ctx.config.data.augment_model
    if name:
        try:
            # its config.json checked before any of it is loaded
            load_config(name, f"--augment-model {name} is not a masked language model that transformers can load")
            mlm = AutoModelForMaskedLM.from_pretrained(name, trust_remote_code=False).eval().to(_mlm_device())
            tokenizer = load_tokenizer(name)
        except (OSError, ValueError) as e:
            raise DistilleryError(f"--augment-model {name} is not a masked language model that transformers can "
                                  f"load ({first_line(e)}).") from None
        if tokenizer.mask_token is None:
            raise DistilleryError(f"--augment-model {name}: its tokenizer has no mask token.")
        return WordSource(f"the masked LM {name}", tokenizer, mlm.get_input_embeddings().weight, mlm)
    try:  # the teacher checkpoint's own head, when it was saved with one (its architectures say so)
        path = resolve_teacher(ctx.config.teacher.name)
        saved = getattr(load_config(path, f"Teacher {path}"), "architectures", None) or []
        if ctx.tokenizer.mask_token is not None and any("MaskedLM" in a or "ForPreTraining" in a for a in saved):
            mlm, info = AutoModelForMaskedLM.from_pretrained(path, output_loading_info=True, trust_remote_code=False)
            if not info["missing_keys"]:
                return WordSource("the teacher's own MLM head", ctx.tokenizer, mlm.get_input_embeddings().weight,
                                  mlm.eval().to(_mlm_device()))
    except (OSError, ValueError, KeyError, DistilleryError):
        pass  # an export, a fine-tuned head only, a family without an MLM class: the embeddings serve
    return WordSource("nearest neighbours in the teacher's input embeddings", ctx.tokenizer,
                      ctx.teacher.get_input_embeddings().weight)


def _mlm_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"  # the MLM's batched passes are most of augmentation's time


def label_new_rows(train, originals: int, kind: TaskKind):
    """``train`` with the rows past ``originals`` labelled by their ``teacher_logits`` (class, score or a tag a
    word, as the task's ``kind`` labels them: ``TaskKind.new_row_labels``)."""
    import datasets

    new = train.select(range(originals, len(train)))
    new = new.remove_columns("labels").add_column("labels", kind.new_row_labels(new)) \
        .cast_column("labels", train.features["labels"]).select_columns(train.column_names)
    return datasets.concatenate_datasets([train.select(range(originals)), new]) if originals else new
