"""Writing export folders: ``distillery export`` (:func:`export_model`), one model in one format
(:func:`export`), every model in every format for bench and compress (:func:`build_variants`).

Export folder (everything ``evaluation`` and ``bench`` need; no pickles)::

    distillery_export.json   the manifest: format, inputs, outputs, parity, scores, versions
    config.json, tokenizer   the model's config and tokenizer, so a folder scores and benchmarks alone
    model.onnx               onnx, onnx-int8
    model.safetensors        torch-int8: the fp32 weights. A dynamically quantized torch model is not
                             a state dict of a normal model (packed int8 weights), and torch.save of
                             the module would be a pickle; quantize_dynamic is deterministic (the
                             weight scales are the per-tensor min/max) and takes a second, so the
                             folder holds the fp32 weights and the manifest says "quantize_dynamic on
                             load". The export checks that a reload reproduces the int8 model exactly.

``distillery.runtime.load_model`` reads these folders.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch
from torch import nn

from distillery.bench import latency_ms
from distillery.config import DataConfig, RunConfig, cache_root
from distillery.data.encode import content_digest, prepare_task_data
from distillery.data.loading import task_for
from distillery.errors import DistilleryError
from distillery.evaluation import check_trained_task, score
from distillery.export.formats import resolve_format
from distillery.export.onnx import export_onnx_once, graph_inputs, graph_outputs, quantize_onnx
from distillery.export.parity import (SAMPLE_TEXTS, check_fp32_parity, check_int8, compare_outputs, dev_batches,
                                      sample_batches)
from distillery.export.recover import RECOVER_THRESHOLD, recover_int8
from distillery.folders import EXPORT_MANIFEST, atomic_folder, check_target, mark
from distillery.kinds import kind_of
from distillery.modeling import load_pretrained, load_tokenizer, model_folder, model_head, read_config
from distillery.run_record import TRAIN, read_train
from distillery.teacher import teacher_identity
from distillery.runtime import (ONNX_FILE, OnnxModel, is_export, load_export, quantize_torch, read_manifest, require_onnx,
                                torch_int8_model)
from distillery.weights import record_weights

logger = logging.getLogger("distillery")


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    import transformers

    try:  # not distillery.__version__: importing the package imports the pipeline, which imports export
        made_by = version("distillery")
    except PackageNotFoundError:  # run from a source tree that was not installed
        made_by = None
    out = {"distillery": made_by, "torch": torch.__version__, "transformers": transformers.__version__}
    for name in ("onnx", "onnxruntime", "onnxscript"):
        try:
            out[name] = __import__(name).__version__
        except ImportError:
            pass
    return out


def _points(task, drop: float) -> float:
    """A metric difference in points: SQuAD EM/F1 are already percentages, the others are in [−1, 1]."""
    return drop if task.kind_object.scores_in_percent else 100.0 * drop


def export(
    model: nn.Module,
    tokenizer,
    fmt: str,
    out_dir: str | os.PathLike,
    *,
    task_data=None,
    source_metrics: Mapping[str, float] | None = None,
    source: str | None = None,
    overwrite: bool = False,
    extra: Mapping[str, Any] | None = None,
    kind=None,
) -> Path:
    """Export an fp32 model with its tokenizer to ``out_dir`` in format ``fmt``; return the folder.

    ``task_data`` (a prepared TaskData with a dev split): parity on its first dev inputs and the
    export scored on dev (``source_metrics`` saves scoring the fp32 model again); without it,
    parity on tokenized sample sentences. The task's kind (else ``kind``, a task kind object) decides what
    is exported (``TaskKind.export_module``: an embedder with its pooling). The folder is written aside and
    moved into place only when every check passed.
    """
    if not hasattr(model, "config") or not hasattr(model, "save_pretrained"):
        raise DistilleryError(f"Only Hugging Face models export; got a {type(model).__name__}.")
    if is_export(model):
        raise DistilleryError("This model is already an export (ONNX or int8); export the fp32 model it came from.")
    fmt = resolve_format(fmt, model.config)
    if fmt != "torch-int8":
        require_onnx()
    out_dir = Path(out_dir)
    check_target(out_dir, overwrite=overwrite, inputs=[source], kind="export")
    started = time.time()
    model = copy.deepcopy(model).cpu().eval()
    inputs = graph_inputs(model, tokenizer)  # the model's own (a wrapper names every input)
    kind = task_data.task.kind_object if task_data is not None else kind
    model = kind.export_module(model) if kind is not None else model
    outputs = graph_outputs(model)
    batches, parity_inputs = _parity_batches(task_data, tokenizer, inputs)

    with atomic_folder(out_dir) as tmp:  # an existing out_dir is replaced only if distillery wrote it
        model.config.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        manifest: dict[str, Any] = {
            "format": fmt,
            "head": model_head(model).name,
            "inputs": list(inputs),
            "outputs": list(outputs),
            "model_type": getattr(model.config, "model_type", None),
            "architecture": (model.config.architectures or [type(model).__name__])[0],
            "source": source,
            "parity_inputs": parity_inputs,
        }
        write = _write_torch_int8 if fmt == "torch-int8" else _write_onnx
        exported = write(model, tmp, manifest, inputs, outputs, batches)
        if task_data is not None:
            manifest["scores"] = score_export(model, exported, task_data, source_metrics)
        manifest.update(extra or {})
        manifest["versions"] = _versions()
        manifest["seconds"] = round(time.time() - started, 1)
        (tmp / EXPORT_MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        record_weights(tmp)
        mark(tmp, "export")
    return out_dir


def _parity_batches(task_data, tokenizer, inputs: Sequence[str]) -> tuple[list[dict], str]:
    """The batches an export is checked on (the first dev inputs, else sample sentences) and their description."""
    if task_data is not None:
        batches = dev_batches(task_data, inputs)
        count = sum(len(b["input_ids"]) for b in batches)
        return batches, f"first {count} {task_data.task.name} {task_data.dev_split} inputs"
    return sample_batches(tokenizer, inputs), f"{len(SAMPLE_TEXTS)} tokenized sample sentences"


def _write_torch_int8(model: nn.Module, tmp: Path, manifest: dict[str, Any], inputs: Sequence[str],
                      outputs: Sequence[str], batches: list[dict]) -> nn.Module:
    """Write the fp32 weights that load as int8, check that a reload reproduces the quantized model, and
    fill ``manifest`` in; return the int8 model as ``load_export`` builds it."""
    model.save_pretrained(tmp)  # fp32 weights, safetensors; quantized on load
    manifest.update(backend=f"torch {torch.__version__} int8 (quantize_dynamic, {torch.backends.quantized.engine})",
                    file="model.safetensors", on_load="torch.ao.quantization.quantize_dynamic({nn.Linear}, qint8)")
    quantized = quantize_torch(model)
    reloaded = torch_int8_model(tmp, manifest["head"])  # what load_export will do with this folder
    again = compare_outputs(quantized, reloaded, batches, outputs)
    if not again.get("finite") or again["max_abs_diff"] > 1e-6:
        raise DistilleryError("The int8 model reloaded from its folder does not reproduce the quantized model.")
    manifest["quantization"] = {"tool": "torch.ao.quantization.quantize_dynamic", "modules": "nn.Linear",
                                "dtype": "qint8", "engine": torch.backends.quantized.engine}
    manifest["parity"] = {"reload_max_abs_diff": again["max_abs_diff"],
                          "int8_vs_fp32": check_int8(compare_outputs(model, quantized, batches, outputs), "torch-int8")}
    return reloaded


def _write_onnx(model: nn.Module, tmp: Path, manifest: dict[str, Any], inputs: Sequence[str],
                outputs: Sequence[str], batches: list[dict]) -> nn.Module:
    """Write the ONNX graph (fp32, or quantized from the fp32 one), check its parity, fill ``manifest`` in;
    return the exported model."""
    import onnxruntime

    fmt = manifest["format"]
    fp32_path = tmp / ONNX_FILE if fmt == "onnx" else tmp / "model.fp32.onnx"
    manifest["exporter"] = export_onnx_once(model, fp32_path, inputs, outputs)
    manifest.update({k: manifest["exporter"][k] for k in ("seq_multiple", "max_length") if k in manifest["exporter"]})
    fp32 = OnnxModel(fp32_path.read_bytes(), model.config, {**manifest, "format": "onnx"})
    manifest["parity"] = {"fp32": check_fp32_parity(compare_outputs(model, fp32, batches, outputs), "ONNX")}
    if fmt == "onnx":
        manifest["backend"] = f"onnxruntime {onnxruntime.__version__} fp32"
        exported = fp32
    else:
        manifest["quantization"] = quantize_onnx(fp32_path, tmp / ONNX_FILE)
        fp32_path.unlink()
        manifest["backend"] = f"onnxruntime {onnxruntime.__version__} int8 (dynamic)"
        exported = OnnxModel((tmp / ONNX_FILE).read_bytes(), model.config, manifest)
        manifest["parity"]["int8_vs_fp32"] = check_int8(compare_outputs(model, exported, batches, outputs), "ONNX int8")
    manifest["file"] = ONNX_FILE
    return exported


def score_export(model: nn.Module, exported: nn.Module, task_data, source_metrics: Mapping[str, float] | None = None) -> dict[str, Any]:
    """The fp32 model and its export on the task's dev split, and the drop in the main metric."""
    task = task_data.task
    main = task.main_metric
    before = dict(source_metrics) if source_metrics else score(model, task_data)
    after = score(exported, task_data)
    drop = before[main] - after[main]
    return {"task": task.name, "split": task_data.dev_split, "examples": len(task_data.dev_examples),
            "main_metric": main, "source": before, "export": after, "drop": drop, "drop_points": _points(task, drop)}


def int8_speedup(model: nn.Module, tokenizer, shape: Sequence[int], runs: int) -> float:
    """How many times faster than ``model`` (fp32) its default int8 export runs here at ``shape``, the two taking
    turns in this process (the export is made in a temporary folder and dropped)."""
    with tempfile.TemporaryDirectory(prefix="distillery-int8-speedup-") as tmp:
        folder = export(model, tokenizer, "int8", Path(tmp) / "int8")
        ms = latency_ms({"fp32": model, "int8": load_export(folder)}, tuple(shape), runs=max(int(runs), 3))
    return ms["fp32"] / ms["int8"]


def export_model(
    path: str | os.PathLike,
    fmt: str,
    out_dir: str | os.PathLike | None = None,
    *,
    task: str | None = None,
    data_dir: str | None = None,
    overwrite: bool = False,
    recover: bool = False,
    recover_threshold: float = RECOVER_THRESHOLD,
    recover_steps: int = 300,
    recover_teacher: str | os.PathLike | None = None,
    task_data=None,
    source_metrics: Mapping[str, float] | None = None,
    other_task: bool = False,
    **data_options: Any,
) -> Path:
    """``distillery export``: a saved model or a run folder's student → an export folder.

    With ``task``, parity runs on real dev inputs and the export is scored on dev; the data settings
    of a run folder (max_length, SQuAD windows, ...) are reused so that its scores match
    metrics.json. A prepared ``task_data`` (see :func:`prepare_export_data`) replaces ``task`` and
    its options, and ``source_metrics`` the fp32 model's dev scores, when several exports share them.
    ``recover``: when an int8 format loses more than ``recover_threshold`` points,
    a quantization-aware distillation pass (:func:`recover_int8`) of ``recover_steps`` steps, the
    teacher being ``recover_teacher`` or the run's fp32 teacher or, for a plain model, its own fp32
    weights; the recovered weights are exported (the manifest holds both scores). A model trained for another
    task than ``task`` is refused unless ``other_task`` (:func:`distillery.evaluation.check_trained_task`).
    """
    folder, run_dir, fmt, out_dir = _export_target(path, fmt, out_dir)
    check_target(out_dir, overwrite=overwrite, inputs=[folder, recover_teacher, data_dir], kind="export")
    if recover and fmt == "onnx":
        raise DistilleryError("--recover is for int8 formats; an fp32 ONNX export loses nothing to recover.")
    if recover and not (task or task_data is not None):
        raise DistilleryError("--recover needs --task (and its data): recovery trains on the task and scores on dev.")
    model = load_pretrained(folder)  # first: damaged weights are named as such, not as a tokenizer problem
    tokenizer = load_tokenizer(str(folder))
    kind = None if task or task_data is not None else _embedder_kind(folder, model.config)
    if task_data is None and task:
        task_data = prepare_export_data(task, tokenizer, run_dir, data_dir,
                                        splits=("train", "dev") if recover else ("dev",),
                                        model=(folder, model.config), **data_options)
        check_trained_task(folder, model.config, task_data.task, other_task)
    if task_data is not None:  # computes as it is scored (an embedder's pooling, from its own files)
        task_data.task.kind_object.mark_config(model.config, task_data.data_config)
    extra: dict[str, Any] = {}
    if recover:
        from distillery.evaluation import score

        source_metrics = source_metrics or score(model, task_data)
        model, extra["recovery"] = _recovered(
            model, tokenizer, fmt, folder, out_dir, task_data, source_metrics, threshold=recover_threshold,
            steps=recover_steps, teacher=recover_teacher, run_dir=run_dir)
    out = export(model, tokenizer, fmt, out_dir, task_data=task_data, source_metrics=source_metrics,
                 source=str(folder), overwrite=overwrite, extra=extra, kind=kind)
    return out


def _embedder_kind(folder: Path, model_config):
    """The embedding kind for a sentence-transformers folder (its ``modules.json``), whose export holds its pooling
    (recorded on ``model_config``, as its files say) and normalisation (a pooling it does not compute is refused);
    None for any other model."""
    if not (folder / "modules.json").is_file():
        return None
    kind = kind_of("embedding")
    data = DataConfig(task="embedding")
    kind.settle_data(f"The model {folder}", str(folder), data, model_config)
    kind.mark_config(model_config, data)
    return kind


def _export_target(path: str | os.PathLike, fmt: str, out_dir: str | os.PathLike | None,
                   ) -> tuple[Path, Path | None, str, Path]:
    """The model folder under ``path`` (refused when it is an export already), the run folder it is the
    student of (or None), the resolved format, and the export folder (by default beside the model, or
    in the run's ``exports/``)."""
    fmt = resolve_format(fmt)
    src = Path(path).expanduser()
    if src.is_dir() and (src / EXPORT_MANIFEST).is_file():
        raise DistilleryError(f"{src} is already an export ({read_manifest(src)['format']}); export the fp32 model it came from.")
    folder = model_folder(src)
    if folder != src and (folder / EXPORT_MANIFEST).is_file():
        raise DistilleryError(f"{folder} is already an export; export the fp32 model it came from.")
    run_dir = folder.parent if folder.name == "student" and (folder.parent / "config.yaml").is_file() else None
    fmt = resolve_format(fmt, read_config(folder))
    if out_dir is None:
        out_dir = (run_dir / "exports" / f"student-{fmt}") if run_dir else folder.with_name(f"{folder.name}-{fmt}")
    return folder, run_dir, fmt, Path(out_dir)


def _recovered(model: nn.Module, tokenizer, fmt: str, folder: Path, out_dir: Path, task_data,
               source_metrics: Mapping[str, float], *, threshold: float, steps: int,
               teacher: str | os.PathLike | None, run_dir: Path | None) -> tuple[nn.Module, dict[str, Any]]:
    """The model to export after int8 recovery, and the manifest's ``recovery`` record: a pass of
    :func:`recover_int8` when int8 loses more than ``threshold`` points, kept only when it helps."""

    def int8_scores(m: nn.Module) -> dict[str, Any]:
        """Dev scores of ``m`` quantized by the backend being exported (the real int8 model)."""
        if fmt == "torch-int8":
            return score_export(m, quantize_torch(m), task_data, source_metrics)
        with tempfile.TemporaryDirectory() as tmp:
            probe = export(m, tokenizer, fmt, Path(tmp) / "probe", task_data=task_data,
                           source_metrics=source_metrics, source=str(folder))
            return read_manifest(probe)["scores"]

    before = int8_scores(model)
    if before["drop_points"] <= threshold:
        return model, {"skipped": f"int8 lost {before['drop_points']:.2f} points, not more than {threshold:g}",
                       "before": before}
    fp32_teacher = load_pretrained(_recover_teacher_path(teacher, run_dir, folder))
    recovered, info = recover_int8(model, fp32_teacher, task_data, backend=fmt, steps=steps,
                                   work_dir=out_dir.with_name(out_dir.name + ".recover"))
    after = int8_scores(recovered)
    main = task_data.task.main_metric
    kept = after["export"][main] > before["export"][main]
    info.update(before=before, after=after, kept=kept, gain_points=before["drop_points"] - after["drop_points"],
                note="the pass is kept only when its int8 model scores better on dev than int8 before it")
    return (recovered if kept else model), info


def _recover_teacher_path(given, run_dir: Path | None, folder: Path) -> Path:
    if given:
        return Path(given)
    if run_dir is not None and (run_dir / TRAIN).is_file():
        teacher_path = read_train(run_dir).teacher_path
        if teacher_path and Path(teacher_path).is_dir():
            return Path(teacher_path)
    return folder  # a plain model is its own fp32 teacher


def prepare_export_data(task: str, tokenizer, run_dir: str | os.PathLike | None = None, data_dir: str | None = None,
                        splits: Sequence[str] = ("dev",), model: tuple[Path, Any] | None = None, **options: Any):
    """The TaskData an export is checked and scored on: a run folder's data settings (so that scores
    match its metrics.json) when the task is the run's, overridden by ``options`` (DataConfig fields), and what the
    model (its folder and loaded config) decides of them (an embedder's pooling, from its own files)."""
    settings: dict[str, Any] = {}
    if run_dir is not None:
        saved = RunConfig.load(Path(run_dir) / "config.yaml").data
        if saved.task == task:
            settings = {k: v for k, v in vars(saved).items() if k not in ("task", "data_dir")}
            data_dir = data_dir or saved.data_dir
    settings.update({k: v for k, v in options.items() if v is not None})
    config = DataConfig(task=task, data_dir=data_dir, **settings)
    spec = task_for(config)
    if model is not None:
        folder, model_config = model
        spec.kind_object.settle_data(f"The model {folder}", str(folder), config, model_config)
    return prepare_task_data(spec, tokenizer, config, splits=splits)


def kept_exports_folder(model_folder: str | os.PathLike | None, task_data) -> Path | None:
    """Where the exports of the model saved in ``model_folder``, scored on ``task_data``'s dev split, are kept for
    later runs (in the cache, :func:`distillery.config.cache_root`), keyed by the model's files' content and the dev
    rows: every candidate of ``--method auto`` compares the same teacher's int8 copy, exported and scored once.
    None for a model that is no local folder (nothing to key it by)."""
    if not model_folder or not Path(model_folder).is_dir():
        return None
    dev = content_digest(task_data.dev, task_data.dev_examples) if task_data is not None else None
    blob = json.dumps({"model": teacher_identity(str(model_folder)), "dev": dev}, sort_keys=True)
    return cache_root() / "exports" / hashlib.sha256(blob.encode()).hexdigest()[:16]


def _load_kept(folder: Path, key: str, variants: dict, manifests: dict) -> bool:
    """Load the kept export in ``folder`` into ``variants``/``manifests`` under ``key``; False where there is none
    or it does not load."""
    if not (folder / EXPORT_MANIFEST).is_file():
        return False
    try:
        manifests[key], variants[key] = read_manifest(folder), load_export(folder)
        return True
    except (OSError, ValueError, KeyError, DistilleryError) as e:
        logger.warning("The kept export in %s does not load (%s): exporting again, without keeping it.", folder, e)
        manifests.pop(key, None)
        return False


def build_variants(
    models: Mapping[str, tuple[nn.Module, Any]],
    formats: Sequence[str],
    *,
    task_data=None,
    source_metrics: Mapping[str, Mapping[str, float]] | None = None,
    save_dir: str | os.PathLike | None = None,
    save: Sequence[str] = (),
    sources: Mapping[str, str | None] | None = None,
    kept: Mapping[str, Path | None] | None = None,
) -> tuple[dict[str, nn.Module], dict[str, dict[str, float]], dict[str, dict[str, Any]]]:
    """Every model in every format, loaded back from its export folder, ready to be measured.

    ``models``: name → (fp32 model, tokenizer). Returns ``(variants, metrics, manifests)`` keyed
    ``"<name>-<format>"``: the loaded models, their dev metrics (with ``task_data``) and manifests.
    Models named in ``save`` keep their folders in ``save_dir/<name>-<format>``; the others are
    exported to a temporary folder and loaded into memory. ``sources``: the folder each model is saved in,
    recorded as its exports' source (default: the model's name), so that a kept export names where it came from.
    ``kept``: name → a cache folder (:func:`kept_exports_folder`) whose ``<name>-<format>`` export is loaded where
    it is there, and made there where it is not (a later run of the same model on the same dev rows reuses it; one
    that does not load is left alone and the export made as without the cache).
    """
    variants, metrics, manifests = {}, {}, {}
    for given in dict.fromkeys(formats):
        for name, (model, tokenizer) in models.items():
            fmt = resolve_format(given, model.config)
            key = f"{name}-{fmt}"
            if key in variants:  # "int8" and the backend it names
                continue
            cache = (kept or {}).get(name)
            if cache is not None and _load_kept(cache / key, key, variants, manifests):
                logger.info("Reusing %s exported as %s earlier: %s.", name, fmt, cache / key)
            else:
                logger.info("Exporting %s as %s.", name, fmt)
                with tempfile.TemporaryDirectory() as tmp:
                    keep = save_dir is not None and name in save
                    # a kept folder that would not load is left as it is (distillery replaces only files it wrote
                    # unchanged): this export then goes where it would without the cache
                    fresh = cache is not None and not (cache / key).exists()
                    target = cache / key if fresh else Path(save_dir) / key if keep else Path(tmp) / key
                    folder = export(model, tokenizer, fmt, target, task_data=task_data, overwrite=True,
                                    source_metrics=(source_metrics or {}).get(name),
                                    source=(sources or {}).get(name) or name)
                    manifests[key] = read_manifest(folder)
                    variants[key] = load_export(folder)
            scores = manifests[key].get("scores")
            if scores:
                metrics[key] = scores["export"]
    return variants, metrics, manifests
