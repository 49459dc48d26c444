"""Deployment: ONNX (parity-checked against torch) and int8, as folders ``load_student`` reads.

Formats (``distillery export MODEL --format F``):

``onnx``
    ``torch.onnx.export`` with the dynamo exporter (``torch.export`` + onnxscript; it handles BERT,
    RoBERTa and their heads on torch 2.13), opset ``OPSET``, dynamic batch and sequence axes, run
    by ONNX Runtime. The export fails with a DistilleryError unless ONNX Runtime reproduces torch on
    real inputs within ``FP32_ATOL`` + ``FP32_RTOL``·|torch| on every output element.
``onnx-int8``
    That fp32 graph (parity-checked first), then ``onnxruntime.quantization.quantize_dynamic``:
    int8 weights (per tensor, symmetric) for every MatMul with a constant weight, activations
    quantized per batch at run time. Embedding tables stay fp32, as in torch.
``torch-int8``
    ``torch.ao.quantization.quantize_dynamic`` on every ``nn.Linear`` (int8 weights per tensor,
    activations quantized per batch at run time).
``int8``
    Whichever int8 backend was faster on the machine we measured (``DEFAULT_INT8``; see the README's
    deployment table); both stay available by name.

An int8 model is not equal to the fp32 one, so its check is not a tolerance: the export reports
how far its outputs moved (largest and mean absolute difference, how often the predicted class
stays the same) and, given a task, its dev score and the drop from fp32. Non-finite outputs or
wrong shapes fail the export.

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

``modeling.load_model`` (and so ``distillery.load_student``) returns, for an export folder, an
object called like the Hugging Face model (``input_ids``, ``attention_mask``, ``token_type_ids`` →
``.logits`` or ``.start_logits``/``.end_logits``): the quantized HF model itself for torch-int8,
an :class:`OnnxModel` for the ONNX formats.

Quantization recovery (:func:`recover_int8`): when int8 loses more than ``RECOVER_THRESHOLD``
points on dev, a short distillation pass with fake-quantized Linear layers (``torch.ao``
FakeQuantize modules reproducing quantize_dynamic's rounding, straight-through gradients), the fp32
teacher's logits as targets, through the one Trainer and the losses of ``distill/losses.py``.

Adding a student type: its Linear layers quantize as they are; for ONNX, a model type whose inputs
or outputs are not the usual ones registers them once::

    register_onnx_export("cmow", seq_multiple=16, max_length=4096)
"""

from __future__ import annotations

import copy
import json
import logging
import math
import os
import shutil
import tempfile
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import torch
from torch import nn

from distillery.config import EXPORT_FORMATS, TrainConfig
from distillery.errors import DistilleryError
from distillery.folders import check_target, mark, replace_with, temporary_sibling
from distillery.modeling import EXPORT_MANIFEST, load_pretrained, model_folder, read_config

logger = logging.getLogger("distillery")

OPSET = 18  # ONNX Runtime has run opset 18 since 1.14; the quantizer knows all its ops
FP32_ATOL = 1e-4
FP32_RTOL = 1e-4
# The int8 backend `--format int8` picks. Measured on a 2-core AMD EPYC (AVX-512 VNNI), one thread,
# every model in one interleaved benchmark: ONNX Runtime's int8 was 1.10x (teacher) and 1.13x
# (3-layer student) faster than torch's at 1x128, 1.04x and 1.08x at 256x64, and lost less accuracy
# (SST-2 teacher -1.5 points against -3.1). benchmarks/deploy.py measures both again.
DEFAULT_INT8 = "onnx-int8"
RECOVER_THRESHOLD = 1.0  # points of the main metric (accuracy 0.01 = 1 point; SQuAD F1 is in points)
PARITY_EXAMPLES = 64
PARITY_BATCH = 16
ONNX_FILE = "model.onnx"

HEADS = {  # architecture suffix -> (head name, output fields)
    "ForSequenceClassification": ("sequence-classification", ("logits",)),
    "ForQuestionAnswering": ("question-answering", ("start_logits", "end_logits")),
}
BASE_HEAD = ("base", ("last_hidden_state",))
TOKEN_INPUTS = ("input_ids", "attention_mask", "token_type_ids")

# Short sentences of different lengths: parity inputs when no task is given (padding included).
SAMPLE_TEXTS = (
    "a good movie .",
    "the plot was boring and the actors were not very good , but the city looked great .",
    "what a film !",
    "paris is a city in france ; it was first named lutetia , and the river is the seine .",
    "not fun",
    "who was born in london in the first year of the film ?",
    "really bad",
    "the movie is great , the plot is great , the actor is great and it was fun .",
)


# --------------------------------------------------------------------------------------------
# Per-model-type ONNX settings


@dataclass(frozen=True)
class OnnxSpec:
    """How one model type goes to ONNX.

    ``inputs``: graph inputs, in order (None: the tokenizer's among input_ids, attention_mask,
    token_type_ids that the model's forward names). ``outputs``: output fields (None: the head's).
    ``dynamo``: the dynamo exporter (True) or the TorchScript one, for a model torch.export cannot
    trace. ``seq_multiple``: the graph takes sequence lengths that are a multiple of this (a model
    whose shape-dependent loop is exported as fixed steps over blocks); :class:`OnnxModel` pads
    with padding tokens (attention mask 0) and cuts per-position outputs back, so a model listing it
    must ignore masked positions exactly. ``max_length``: the longest sequence the graph computes
    right; longer inputs are refused with a sentence. ``int8``: the backend ``--format int8`` picks for
    this type when it is not ``DEFAULT_INT8``.
    """

    inputs: tuple[str, ...] | None = None
    outputs: tuple[str, ...] | None = None
    dynamo: bool = True
    seq_multiple: int = 1
    max_length: int | None = None
    int8: str | None = None  # this type's faster int8 backend where it is not DEFAULT_INT8


ONNX_SPECS: dict[str, OnnxSpec] = {}  # model_type -> spec; bert, roberta, ... use the default


def register_onnx_export(model_type: str, **settings: Any) -> None:
    """Declare how ``model_type`` exports (see :class:`OnnxSpec`); a method package calls it on import."""
    ONNX_SPECS[model_type] = OnnxSpec(**settings)


def _head(config) -> tuple[str, tuple[str, ...]]:
    arch = (getattr(config, "architectures", None) or [""])[0]
    return next((h for suffix, h in HEADS.items() if arch.endswith(suffix)), BASE_HEAD)


def _graph_inputs(model: nn.Module, tokenizer) -> tuple[str, ...]:
    spec = ONNX_SPECS.get(getattr(model.config, "model_type", ""), OnnxSpec())
    if spec.inputs:
        return tuple(spec.inputs)
    import inspect

    named = set(inspect.signature(model.forward).parameters)
    given = set(getattr(tokenizer, "model_input_names", None) or TOKEN_INPUTS)
    inputs = tuple(k for k in TOKEN_INPUTS if k in named and k in given)
    if "input_ids" not in inputs:
        raise DistilleryError(f"{type(model).__name__} does not take input_ids; register its ONNX inputs with register_onnx_export.")
    return inputs


def _graph_outputs(model: nn.Module) -> tuple[str, ...]:
    spec = ONNX_SPECS.get(getattr(model.config, "model_type", ""), OnnxSpec())
    return tuple(spec.outputs) if spec.outputs else _head(model.config)[1]


# --------------------------------------------------------------------------------------------
# Loading export folders


def _output_class(head: str):
    from transformers.modeling_outputs import BaseModelOutput, QuestionAnsweringModelOutput, SequenceClassifierOutput

    return {"sequence-classification": SequenceClassifierOutput, "question-answering": QuestionAnsweringModelOutput}.get(
        head, BaseModelOutput
    )


def _auto_class(head: str):
    from transformers import AutoModel, AutoModelForQuestionAnswering, AutoModelForSequenceClassification

    return {"sequence-classification": AutoModelForSequenceClassification,
            "question-answering": AutoModelForQuestionAnswering}.get(head, AutoModel)


class _ArchitectureCounts:
    """Parameters, parameters used per token and FLOPs per token of an exported model.

    They are those of its fp32 architecture: an int8 multiply-add is still one, and neither an ONNX
    graph nor torch's packed int8 weights expose parameters that ``bench.count_parameters`` could
    count. The architecture is rebuilt from config.json (random weights) once, when first asked.
    """

    def __init__(self, config, head: str, backend: str, weights_bytes: int | None):
        self.config, self.head, self.backend, self.weights_bytes = config, head, backend, weights_bytes
        self._sizes: tuple[int, int] | None = None
        self._flops: dict[int, float] = {}

    def __call__(self, seq: int) -> dict[str, Any]:
        from distillery.bench import count_parameters, flops_per_token

        if self._sizes is None or seq not in self._flops:
            with _quiet():
                model = _auto_class(self.head).from_config(self.config).eval()
            self._sizes = count_parameters(model)
            self._flops[seq] = float(flops_per_token(model, seq=seq))
        out = {"params": self._sizes[0], "effective_params": self._sizes[1], "flops_per_token": self._flops[seq],
               "backend": self.backend}
        if self.weights_bytes:
            out["weights_bytes"] = self.weights_bytes
        return out


class OnnxModel(nn.Module):
    """An ONNX graph run by ONNX Runtime, called like the Hugging Face model it came from.

    ``model(input_ids=..., attention_mask=..., token_type_ids=...)`` returns the head's output
    class with torch tensors. A missing attention mask means "no padding", missing token types are
    zeros; token types given to a graph without them are dropped when all zero (a RoBERTa takes
    none). The session uses as many threads as torch (``torch.get_num_threads()``), re-read at each
    call, so that a benchmark compares both backends at the same thread count.
    """

    def __init__(self, model_bytes: bytes, config, manifest: Mapping[str, Any]):
        super().__init__()
        self.config = config
        self.manifest = dict(manifest)
        self.input_names = tuple(manifest["inputs"])
        self.output_names = tuple(manifest["outputs"])
        self.head = manifest["head"]
        self._bytes = model_bytes
        self._session = None
        self._threads: int | None = None
        self.bench_counts = _ArchitectureCounts(config, self.head, manifest.get("backend", "onnxruntime"), len(model_bytes))

    def __getstate__(self):
        # An ONNX Runtime session cannot be copied or pickled; a copy starts its own on first call.
        state = dict(super().__getstate__())
        state["_session"], state["_threads"] = None, None
        return state

    def _get_session(self):
        threads = torch.get_num_threads()
        if self._session is None or threads != self._threads:
            self._session = _ort_session(self._bytes, threads)
            self._threads = threads
        return self._session

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, **inputs):
        given = {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids}
        given.update({k: v for k, v in inputs.items() if isinstance(v, torch.Tensor)})
        if input_ids is None:
            raise DistilleryError("An exported model needs input_ids.")
        feeds = {}
        for name in self.input_names:
            value = given.pop(name, None)
            if value is None:
                if name == "attention_mask":
                    value = torch.ones_like(input_ids)
                elif name == "token_type_ids":
                    value = torch.zeros_like(input_ids)
                else:
                    raise DistilleryError(f"This exported model needs the input {name!r}.")
            feeds[name] = value.detach().cpu().numpy().astype(np.int64, copy=False)
        for name, value in given.items():
            if value is None or (name == "token_type_ids" and not bool(value.any())):
                continue
            raise DistilleryError(
                f"This exported model takes {', '.join(self.input_names)}; it has no input {name!r}."
            )
        length = input_ids.shape[1]
        limit = self.manifest.get("max_length")
        if limit and length > limit:
            raise DistilleryError(f"This exported model takes sequences of at most {limit} tokens; got {length}.")
        extra = -length % int(self.manifest.get("seq_multiple") or 1)  # padding up to the graph's block multiple
        if extra:
            pad_id = getattr(self.config, "pad_token_id", None) or 0  # masks and token types pad with 0
            feeds = {n: np.pad(v, ((0, 0), (0, extra)), constant_values=pad_id if n == "input_ids" else 0)
                     for n, v in feeds.items()}
        outputs = self._get_session().run(list(self.output_names), feeds)
        if extra:  # per-position outputs (start/end logits, hidden states) back to the input's length
            outputs = [o[:, :length] if o.ndim >= 2 and o.shape[1] == length + extra else o for o in outputs]
        return _output_class(self.head)(**{n: torch.from_numpy(o) for n, o in zip(self.output_names, outputs)})

    def extra_repr(self) -> str:
        return f"format={self.manifest.get('format')}, inputs={self.input_names}, outputs={self.output_names}"


def _require_onnx() -> None:
    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
    except ImportError:
        raise DistilleryError(
            "ONNX export and ONNX models need onnx and onnxruntime: pip install 'distillery[onnx]'."
        ) from None


def _ort_session(model: bytes | str, threads: int):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = int(threads)
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3
    # ORT's workers spin after each run by default, keeping cores busy: on a small CPU that starves
    # whatever runs next (the torch models interleaved with it in a benchmark, a server's other work).
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(model, sess_options=options, providers=["CPUExecutionProvider"])


def read_manifest(folder: str | os.PathLike) -> dict[str, Any]:
    path = Path(folder) / EXPORT_MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise DistilleryError(f"{path} is not a readable export manifest: {e}") from None
    if not isinstance(manifest, dict) or manifest.get("format") not in ("onnx", "onnx-int8", "torch-int8"):
        raise DistilleryError(f"{path} names no known export format (onnx, onnx-int8, torch-int8).")
    return manifest


def load_export(folder: str | os.PathLike) -> nn.Module:
    """The model of an export folder, in eval mode (see the module docstring)."""
    folder = Path(folder)
    manifest = read_manifest(folder)
    fmt = manifest["format"]
    if fmt == "torch-int8":
        return quantize_torch(load_pretrained(folder), weights_bytes=_file_size(folder / "model.safetensors"))
    _require_onnx()
    path = folder / manifest.get("file", ONNX_FILE)
    if not path.is_file():
        raise DistilleryError(f"The export folder {folder} has no {path.name}.")
    return OnnxModel(path.read_bytes(), read_config(folder), manifest).eval()


def _file_size(path: Path) -> int | None:
    return path.stat().st_size if path.is_file() else None


# --------------------------------------------------------------------------------------------
# int8 with torch


@contextmanager
def _quiet():
    """Silence torch.ao's deprecation notices and the ONNX exporter's progress lines: printed at
    every call, they would bury the lines that matter. Errors still raise."""
    loggers = [logging.getLogger(n) for n in ("torch.onnx", "torch._dynamo", "torch.export", "onnxscript", "torch._export")]
    levels = [lg.level for lg in loggers]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for lg in loggers:
            lg.setLevel(logging.ERROR)
        try:
            yield
        finally:
            for lg, level in zip(loggers, levels):
                lg.setLevel(level)


def quantize_torch(model: nn.Module, weights_bytes: int | None = None) -> nn.Module:
    """A dynamically quantized copy (int8 Linear weights) of a fp32 model, in eval mode.

    The result is the same Hugging Face class, called the same way; it carries ``bench_counts``
    (its fp32 architecture's sizes and FLOPs) because its packed weights are not parameters.
    """
    from torch.ao.quantization import quantize_dynamic

    head = _head(model.config)[0] if hasattr(model, "config") else "base"
    source = copy.deepcopy(model).cpu().eval()
    with _quiet():
        quantized = quantize_dynamic(source, {nn.Linear}, dtype=torch.qint8)
    if hasattr(quantized, "config"):
        backend = f"torch {torch.__version__} int8 (quantize_dynamic, {torch.backends.quantized.engine})"
        quantized.bench_counts = _ArchitectureCounts(quantized.config, head, backend, weights_bytes)
    return quantized.eval()


# --------------------------------------------------------------------------------------------
# Inputs and parity


def sample_batches(tokenizer, inputs: Sequence[str], max_length: int = 64, batch: int = 4) -> list[dict[str, torch.Tensor]]:
    """Tokenized SAMPLE_TEXTS in padded batches, for a parity check without a task."""
    out = []
    for i in range(0, len(SAMPLE_TEXTS), batch):
        enc = tokenizer(list(SAMPLE_TEXTS[i : i + batch]), padding=True, truncation=True, max_length=max_length,
                        return_tensors="pt")
        out.append(_select(enc, inputs))
    return out


def dev_batches(task_data, inputs: Sequence[str], n: int = PARITY_EXAMPLES, batch: int = PARITY_BATCH) -> list[dict[str, torch.Tensor]]:
    """The first ``n`` dev features of a task, padded in batches: parity on the inputs that matter."""
    dev = task_data.dev
    if dev is None or len(dev) == 0:
        raise DistilleryError(f"Task {task_data.task.name} has no dev examples to check the export on.")
    rows = [dev[i] for i in range(min(n, len(dev)))]
    return [_select(task_data.collate(rows[i : i + batch]), inputs) for i in range(0, len(rows), batch)]


def _select(batch: Mapping[str, Any], inputs: Sequence[str]) -> dict[str, torch.Tensor]:
    missing = [k for k in inputs if k not in batch]
    if missing:
        raise DistilleryError(f"The encoded inputs lack {', '.join(missing)}, which the model takes.")
    return {k: torch.as_tensor(batch[k]) for k in inputs}


def _outputs(model: nn.Module, batch: Mapping[str, torch.Tensor], names: Sequence[str]) -> list[np.ndarray]:
    with torch.inference_mode():
        out = model(**batch)
    return [_field(out, n).detach().float().cpu().numpy() for n in names]


def _field(out, name):
    value = getattr(out, name, None)
    if value is None and isinstance(out, Mapping):
        value = out.get(name)
    if value is None:
        raise DistilleryError(f"The model output has no {name!r}.")
    return value


def compare_outputs(reference: nn.Module, candidate: nn.Module, batches: Iterable[Mapping[str, torch.Tensor]],
                    names: Sequence[str]) -> dict[str, Any]:
    """How far ``candidate``'s outputs are from ``reference``'s on the same batches.

    Returns the largest and mean absolute difference, the largest ``|d| − rtol·|ref|`` excess over
    the fp32 tolerance (``worst_excess`` ≤ FP32_ATOL means within tolerance), how often the arg-max
    (predicted class, or answer start/end) agrees, and whether every output was finite and of the
    right shape.
    """
    max_abs, total, count, agree, rows, worst = 0.0, 0.0, 0, 0, 0, -math.inf
    for batch in batches:
        ref, cand = _outputs(reference, batch, names), _outputs(candidate, batch, names)
        for r, c in zip(ref, cand):
            if r.shape != c.shape:
                return {"ok_shapes": False, "detail": f"output shape {c.shape} where torch gives {r.shape}"}
            if not np.isfinite(c).all():
                return {"ok_shapes": True, "finite": False, "detail": "the exported model gives non-finite outputs"}
            d = np.abs(r - c)
            max_abs = max(max_abs, float(d.max(initial=0.0)))
            worst = max(worst, float((d - FP32_RTOL * np.abs(r)).max(initial=-math.inf)))
            total += float(d.sum())
            count += d.size
            if r.ndim >= 2:
                agree += int((r.argmax(-1) == c.argmax(-1)).sum())
                rows += int(np.prod(r.shape[:-1]))
    return {
        "ok_shapes": True,
        "finite": True,
        "max_abs_diff": max_abs,
        "mean_abs_diff": total / max(count, 1),
        "worst_excess": worst,
        "argmax_agreement": agree / rows if rows else None,
        "elements": count,
    }


def _check_fp32_parity(result: Mapping[str, Any], what: str) -> dict[str, Any]:
    if not result.get("ok_shapes", False) or not result.get("finite", False):
        raise DistilleryError(f"The {what} export is wrong: {result.get('detail')}.")
    if result["worst_excess"] > FP32_ATOL:
        raise DistilleryError(
            f"The {what} export differs from torch by up to {result['max_abs_diff']:.2e}, beyond the tolerance "
            f"atol {FP32_ATOL:g} + rtol {FP32_RTOL:g}·|torch|; it was not written."
        )
    return {**result, "atol": FP32_ATOL, "rtol": FP32_RTOL, "passed": True}


def _check_int8(result: Mapping[str, Any], what: str) -> dict[str, Any]:
    if not result.get("ok_shapes", False) or not result.get("finite", False):
        raise DistilleryError(f"The {what} export is wrong: {result.get('detail')}.")
    out = {k: v for k, v in result.items() if k != "worst_excess"}
    out["note"] = "int8 against fp32 torch: reported, not bounded (see scores for the quality drop)"
    return out


# --------------------------------------------------------------------------------------------
# ONNX


class _Positional(nn.Module):
    """The model with positional tensor inputs and a tuple of tensor outputs, as the exporter wants."""

    def __init__(self, model: nn.Module, inputs: Sequence[str], outputs: Sequence[str]):
        super().__init__()
        self.model, self.inputs, self.outputs = model, tuple(inputs), tuple(outputs)

    def forward(self, *tensors):
        out = self.model(**dict(zip(self.inputs, tensors)), return_dict=True)
        return tuple(out[n] for n in self.outputs)


def _example_inputs(model: nn.Module, inputs: Sequence[str], seq: int = 16) -> tuple[torch.Tensor, ...]:
    """Batch 2 x ``seq`` of ordinary ids with some padding: a size-1 axis or a mask without padding
    could let the tracer specialise on them."""
    vocab = int(model.config.vocab_size)
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(min(1000, vocab // 2), vocab, (2, seq), generator=generator)
    values = {"attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids)}
    values["attention_mask"][1, seq - 4:] = 0
    return tuple(ids if n.startswith("input_ids") else values.get(n, torch.ones_like(ids)) for n in inputs)


def export_onnx(model: nn.Module, path: str | os.PathLike, inputs: Sequence[str], outputs: Sequence[str]) -> dict[str, Any]:
    """Write ``model`` (fp32, CPU) as an ONNX graph with dynamic batch and sequence axes."""
    _require_onnx()
    spec = ONNX_SPECS.get(getattr(model.config, "model_type", ""), OnnxSpec())
    wrapper = _Positional(model, inputs, outputs).eval()
    multiple = spec.seq_multiple
    args = _example_inputs(model, inputs, seq=16 if multiple == 1 else 2 * multiple)  # two blocks: not one
    axes = {0: "batch", 1: "seq"}
    try:
        with _quiet(), torch.no_grad():
            if spec.dynamo:
                batch, seq = torch.export.Dim("batch"), torch.export.Dim("seq")
                if multiple > 1:
                    blocks = torch.export.Dim("seq_blocks", max=(spec.max_length or 2 ** 16) // multiple)
                    seq = multiple * blocks
                torch.onnx.export(wrapper, args, str(path), input_names=list(inputs), output_names=list(outputs),
                                  dynamic_shapes=(tuple({0: batch, 1: seq} for _ in inputs),), dynamo=True,
                                  opset_version=OPSET, external_data=False, verbose=False)
            else:
                torch.onnx.export(wrapper, args, str(path), input_names=list(inputs), output_names=list(outputs),
                                  dynamic_axes={n: axes for n in inputs}, dynamo=False, opset_version=OPSET)
    except DistilleryError:
        raise
    except Exception as e:  # the exporters raise many types; the first line says what failed
        cause = e
        while cause is not None and not isinstance(cause, DistilleryError):  # a model's own sentence, wrapped
            cause = cause.__cause__ or cause.__context__
        if cause is not None:
            raise cause from None
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise DistilleryError(f"torch.onnx.export could not export {type(model).__name__}: {first}") from None
    exporter = "torch.onnx.export(dynamo=True)" if spec.dynamo else "torch.onnx.export(dynamo=False, TorchScript)"
    out = {"name": exporter, "opset": OPSET, "dynamic_axes": {n: axes for n in inputs}}
    if multiple > 1:
        out["seq_multiple"] = multiple
    if spec.max_length:
        out["max_length"] = spec.max_length
    return out


def quantize_onnx(fp32_path: str | os.PathLike, int8_path: str | os.PathLike) -> dict[str, Any]:
    """ONNX Runtime dynamic quantization: int8 weights of MatMuls with constant weights."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    settings = {"weight_type": "QInt8", "per_channel": False, "reduce_range": False,
                "op_types": ["MatMul", "Gemm"], "MatMulConstBOnly": True}
    # The exporter annotates intermediate values with shapes that ONNX's own shape inference (which
    # the quantizer runs) contradicts for some nodes (Gemm of the heads); the graph is fine without
    # them, and the quantizer infers what it needs again.
    graph = onnx.load(str(fp32_path))
    graph.graph.ClearField("value_info")
    onnx.save(graph, str(fp32_path))
    # The quantizer logs a line per tensor it leaves in fp32 and suggests its pre-processing (shape
    # inference and graph optimisation; ONNX Runtime optimises the graph when the session starts
    # anyway), all on the root logger at every call: only its errors are let through.
    root = logging.getLogger()
    level = root.level
    root.setLevel(max(level, logging.ERROR))
    with _quiet():
        try:
            quantize_dynamic(str(fp32_path), str(int8_path), op_types_to_quantize=settings["op_types"],
                             per_channel=False, reduce_range=False, weight_type=QuantType.QInt8,
                             extra_options={"MatMulConstBOnly": True})
        finally:
            root.setLevel(level)
    return {"tool": "onnxruntime.quantization.quantize_dynamic", **settings}


# --------------------------------------------------------------------------------------------
# Export


def resolve_format(fmt: str, model_type: str | None = None) -> str:
    """``int8`` → the faster int8 backend (for ``model_type``); unknown formats fail with the list of known ones."""
    if fmt not in EXPORT_FORMATS:
        raise DistilleryError(f"Unknown export format {fmt!r}; choose one of {', '.join(EXPORT_FORMATS)}.")
    if fmt != "int8":
        return fmt
    return ONNX_SPECS.get(model_type or "", OnnxSpec()).int8 or DEFAULT_INT8


def _versions() -> dict[str, str]:
    import transformers

    from distillery import __version__

    out = {"distillery": __version__, "torch": torch.__version__, "transformers": transformers.__version__}
    for name in ("onnx", "onnxruntime", "onnxscript"):
        try:
            out[name] = __import__(name).__version__
        except ImportError:
            pass
    return out


def _points(task, drop: float) -> float:
    """A metric difference in points: SQuAD EM/F1 are already percentages, the others are in [−1, 1]."""
    return drop if task.kind == "qa" else 100.0 * drop


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
) -> Path:
    """Export an fp32 model with its tokenizer to ``out_dir`` in format ``fmt``; return the folder.

    ``task_data`` (a prepared TaskData with a dev split): parity on its first dev inputs and the
    export scored on dev (``source_metrics`` saves scoring the fp32 model again); without it,
    parity on tokenized sample sentences. The folder is written aside and moved into place only
    when every check passed.
    """
    if not hasattr(model, "config") or not hasattr(model, "save_pretrained"):
        raise DistilleryError(f"Only Hugging Face models export; got a {type(model).__name__}.")
    if hasattr(model, "bench_counts"):  # set on exported and quantized models only
        raise DistilleryError("This model is already an export (ONNX or int8); export the fp32 model it came from.")
    fmt = resolve_format(fmt, getattr(model.config, "model_type", None))
    if fmt != "torch-int8":
        _require_onnx()
    out_dir = Path(out_dir)
    check_target(out_dir, overwrite=overwrite, inputs=[source], kind="export")
    started = time.time()
    model = copy.deepcopy(model).cpu().eval()
    head, _ = _head(model.config)
    inputs, outputs = _graph_inputs(model, tokenizer), _graph_outputs(model)
    if task_data is not None:
        batches = dev_batches(task_data, inputs)
        parity_inputs = f"first {sum(len(b['input_ids']) for b in batches)} {task_data.task.name} {task_data.dev_split} inputs"
    else:
        batches = sample_batches(tokenizer, inputs)
        parity_inputs = f"{len(SAMPLE_TEXTS)} tokenized sample sentences"

    tmp = temporary_sibling(out_dir)
    try:
        model.config.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        manifest: dict[str, Any] = {
            "format": fmt,
            "head": head,
            "inputs": list(inputs),
            "outputs": list(outputs),
            "model_type": getattr(model.config, "model_type", None),
            "architecture": (model.config.architectures or [type(model).__name__])[0],
            "source": source,
            "parity_inputs": parity_inputs,
        }
        if fmt == "torch-int8":
            model.save_pretrained(tmp)  # fp32 weights, safetensors; quantized on load
            manifest.update(backend=f"torch {torch.__version__} int8 (quantize_dynamic, {torch.backends.quantized.engine})",
                            file="model.safetensors", on_load="torch.ao.quantization.quantize_dynamic({nn.Linear}, qint8)")
            quantized = quantize_torch(model)
            reloaded = quantize_torch(load_pretrained(tmp))  # what load_export will do with this folder
            again = compare_outputs(quantized, reloaded, batches, outputs)
            if not again.get("finite") or again["max_abs_diff"] > 1e-6:
                raise DistilleryError("The int8 model reloaded from its folder does not reproduce the quantized model.")
            manifest["quantization"] = {"tool": "torch.ao.quantization.quantize_dynamic", "modules": "nn.Linear",
                                        "dtype": "qint8", "engine": torch.backends.quantized.engine}
            manifest["parity"] = {"reload_max_abs_diff": again["max_abs_diff"],
                                  "int8_vs_fp32": _check_int8(compare_outputs(model, quantized, batches, outputs), "torch-int8")}
            exported = reloaded
        else:
            fp32_path = tmp / ONNX_FILE if fmt == "onnx" else tmp / "model.fp32.onnx"
            manifest["exporter"] = export_onnx(model, fp32_path, inputs, outputs)
            manifest.update({k: manifest["exporter"][k] for k in ("seq_multiple", "max_length") if k in manifest["exporter"]})
            fp32 = OnnxModel(fp32_path.read_bytes(), model.config, {**manifest, "format": "onnx"})
            manifest["parity"] = {"fp32": _check_fp32_parity(compare_outputs(model, fp32, batches, outputs), "ONNX")}
            import onnxruntime

            if fmt == "onnx":
                manifest["backend"] = f"onnxruntime {onnxruntime.__version__} fp32"
                exported = fp32
            else:
                manifest["quantization"] = quantize_onnx(fp32_path, tmp / ONNX_FILE)
                fp32_path.unlink()
                manifest["backend"] = f"onnxruntime {onnxruntime.__version__} int8 (dynamic)"
                exported = OnnxModel((tmp / ONNX_FILE).read_bytes(), model.config, manifest)
                manifest["parity"]["int8_vs_fp32"] = _check_int8(compare_outputs(model, exported, batches, outputs), "ONNX int8")
            manifest["file"] = ONNX_FILE
        if task_data is not None:
            manifest["scores"] = score_export(model, exported, task_data, source_metrics)
        manifest.update(extra or {})
        manifest["versions"] = _versions()
        manifest["seconds"] = round(time.time() - started, 1)
        (tmp / EXPORT_MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        mark(tmp, "export")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    replace_with(tmp, out_dir)
    return out_dir


def score_export(model: nn.Module, exported: nn.Module, task_data, source_metrics: Mapping[str, float] | None = None) -> dict[str, Any]:
    """The fp32 model and its export on the task's dev split, and the drop in the main metric."""
    from distillery.evaluation import score

    task = task_data.task
    main = task.main_metric
    before = dict(source_metrics) if source_metrics else score(model, task_data)
    after = score(exported, task_data)
    drop = before[main] - after[main]
    return {"task": task.name, "split": task_data.dev_split, "examples": len(task_data.dev_examples),
            "main_metric": main, "source": before, "export": after, "drop": drop, "drop_points": _points(task, drop)}


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
    weights; the recovered weights are exported (the manifest holds both scores).
    """
    from transformers import AutoTokenizer

    fmt = resolve_format(fmt)
    src = Path(path).expanduser()
    if src.is_dir() and (src / EXPORT_MANIFEST).is_file():
        raise DistilleryError(f"{src} is already an export ({read_manifest(src)['format']}); export the fp32 model it came from.")
    folder = model_folder(src)
    if folder != src and (folder / EXPORT_MANIFEST).is_file():
        raise DistilleryError(f"{folder} is already an export; export the fp32 model it came from.")
    run_dir = folder.parent if folder.name == "student" and (folder.parent / "config.yaml").is_file() else None
    fmt = resolve_format(fmt, read_config(folder).model_type)
    if out_dir is None:
        out_dir = (run_dir / "exports" / f"student-{fmt}") if run_dir else folder.with_name(f"{folder.name}-{fmt}")
    out_dir = Path(out_dir)
    check_target(out_dir, overwrite=overwrite, inputs=[folder, recover_teacher, data_dir], kind="export")
    if recover and fmt == "onnx":
        raise DistilleryError("--recover is for int8 formats; an fp32 ONNX export loses nothing to recover.")
    if recover and not (task or task_data is not None):
        raise DistilleryError("--recover needs --task (and its data): recovery trains on the task and scores on dev.")
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder)
    except (OSError, ValueError) as e:
        raise DistilleryError(f"Cannot load the tokenizer saved in {folder}: {e}") from None
    model = load_pretrained(folder)
    if task_data is None and task:
        task_data = prepare_export_data(task, tokenizer, run_dir, data_dir,
                                        splits=("train", "dev") if recover else ("dev",), **data_options)
    extra: dict[str, Any] = {}
    if recover:
        from distillery.evaluation import score

        source_metrics = source_metrics or score(model, task_data)

        def int8_scores(m: nn.Module) -> dict[str, Any]:
            """Dev scores of ``m`` quantized by the backend being exported (the real int8 model)."""
            if fmt == "torch-int8":
                return score_export(m, quantize_torch(m), task_data, source_metrics)
            with tempfile.TemporaryDirectory() as tmp:
                probe = export(m, tokenizer, fmt, Path(tmp) / "probe", task_data=task_data,
                               source_metrics=source_metrics, source=str(folder))
                return read_manifest(probe)["scores"]

        before = int8_scores(model)
        if before["drop_points"] > recover_threshold:
            teacher = load_pretrained(_recover_teacher_path(recover_teacher, run_dir, folder))
            recovered, info = recover_int8(model, teacher, task_data, backend=fmt, steps=recover_steps,
                                           work_dir=out_dir.with_name(out_dir.name + ".recover"))
            after = int8_scores(recovered)
            main = task_data.task.main_metric
            kept = after["export"][main] > before["export"][main]
            info.update(before=before, after=after, kept=kept,
                        gain_points=before["drop_points"] - after["drop_points"],
                        note="the pass is kept only when its int8 model scores better on dev than int8 before it")
            extra["recovery"] = info
            if kept:
                model = recovered
        else:
            extra["recovery"] = {"skipped": f"int8 lost {before['drop_points']:.2f} points, not more than "
                                            f"{recover_threshold:g}", "before": before}
    out = export(model, tokenizer, fmt, out_dir, task_data=task_data, source_metrics=source_metrics,
                 source=str(folder), overwrite=overwrite, extra=extra)
    return out


def _recover_teacher_path(given, run_dir: Path | None, folder: Path) -> Path:
    if given:
        return Path(given)
    if run_dir is not None and (run_dir / "train.json").is_file():
        teacher_path = json.loads((run_dir / "train.json").read_text()).get("teacher_path")
        if teacher_path and Path(teacher_path).is_dir():
            return Path(teacher_path)
    return folder  # a plain model is its own fp32 teacher


def prepare_export_data(task: str, tokenizer, run_dir: str | os.PathLike | None = None, data_dir: str | None = None,
                        splits: Sequence[str] = ("dev",), **options: Any):
    """The TaskData an export is checked and scored on: a run folder's data settings (so that scores
    match its metrics.json) when the task is the run's, overridden by ``options`` (DataConfig fields)."""
    from distillery.config import DataConfig, RunConfig
    from distillery.data.encode import prepare_task_data
    from distillery.data.loading import task_for

    settings: dict[str, Any] = {}
    if run_dir is not None:
        saved = RunConfig.load(Path(run_dir) / "config.yaml").data
        if saved.task == task:
            settings = {k: v for k, v in vars(saved).items() if k not in ("task", "data_dir")}
            data_dir = data_dir or saved.data_dir
    settings.update({k: v for k, v in options.items() if v is not None})
    config = DataConfig(task=task, data_dir=data_dir, **settings)
    return prepare_task_data(task_for(config), tokenizer, config, splits=splits)


# --------------------------------------------------------------------------------------------
# In-process variants (bench, compress --export)


def build_variants(
    models: Mapping[str, tuple[nn.Module, Any]],
    formats: Sequence[str],
    *,
    task_data=None,
    source_metrics: Mapping[str, Mapping[str, float]] | None = None,
    save_dir: str | os.PathLike | None = None,
    save: Sequence[str] = (),
) -> tuple[dict[str, nn.Module], dict[str, dict[str, float]], dict[str, dict[str, Any]]]:
    """Every model in every format, loaded back from its export folder, ready to be measured.

    ``models``: name → (fp32 model, tokenizer). Returns ``(variants, metrics, manifests)`` keyed
    ``"<name>-<format>"``: the loaded models, their dev metrics (with ``task_data``) and manifests.
    Models named in ``save`` keep their folders in ``save_dir/<name>-<format>``; the others are
    exported to a temporary folder and loaded into memory.
    """
    variants, metrics, manifests = {}, {}, {}
    for given in dict.fromkeys(formats):
        for name, (model, tokenizer) in models.items():
            fmt = resolve_format(given, getattr(model.config, "model_type", None))
            key = f"{name}-{fmt}"
            if key in variants:  # "int8" and the backend it names
                continue
            logger.info("Exporting %s as %s.", name, fmt)
            with tempfile.TemporaryDirectory() as tmp:
                keep = save_dir is not None and name in save
                target = Path(save_dir) / key if keep else Path(tmp) / key
                folder = export(model, tokenizer, fmt, target, task_data=task_data, overwrite=True,
                                source_metrics=(source_metrics or {}).get(name), source=name)
                manifests[key] = read_manifest(folder)
                variants[key] = load_export(folder)
            scores = manifests[key].get("scores")
            if scores:
                metrics[key] = scores["export"]
    return variants, metrics, manifests


# --------------------------------------------------------------------------------------------
# Quantization-aware recovery


class FakeQuantLinear(nn.Linear):
    """``nn.Linear`` computing what quantize_dynamic's int8 Linear computes, in fp32, trainably.

    The weight goes through a per-tensor symmetric qint8 FakeQuantize and the input through a
    per-tensor affine quint8 one, both with the range of the current tensor (a memoryless
    observer: averaging constant 1), as dynamic quantization sees them; ``reduce_range`` gives the
    input 7 bits, as torch's x86/fbgemm engine does (ONNX Runtime uses 8). Gradients pass straight through
    the rounding. It shares the wrapped Linear's weight and bias, so ``strip_fake_quant`` gives back
    a plain Linear with the trained values.
    """

    def __init__(self, linear: nn.Linear, reduce_range: bool):
        nn.Module.__init__(self)
        from torch.ao.quantization import FakeQuantize, MovingAverageMinMaxObserver

        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        with _quiet():
            self.weight_fake_quant = FakeQuantize(observer=MovingAverageMinMaxObserver, averaging_constant=1.0,
                                                  quant_min=-128, quant_max=127, dtype=torch.qint8,
                                                  qscheme=torch.per_tensor_symmetric)
            self.input_fake_quant = FakeQuantize(observer=MovingAverageMinMaxObserver, averaging_constant=1.0,
                                                 quant_min=0, quant_max=127 if reduce_range else 255,
                                                 dtype=torch.quint8, qscheme=torch.per_tensor_affine)
        self.to(linear.weight.device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(self.input_fake_quant(x), self.weight_fake_quant(self.weight), self.bias)


def prepare_fake_quant(model: nn.Module, reduce_range: bool | None = None) -> nn.Module:
    """Replace every ``nn.Linear`` of ``model`` (in place) by a :class:`FakeQuantLinear`.

    ``reduce_range``: 7-bit activations; None means torch's choice on its current engine.
    """
    if reduce_range is None:
        reduce_range = torch.backends.quantized.engine in ("fbgemm", "x86")
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear:
                setattr(parent, name, FakeQuantLinear(child, reduce_range))
    return model


def strip_fake_quant(model: nn.Module) -> nn.Module:
    """Put plain ``nn.Linear`` layers (the same trained weights) back in place of FakeQuantLinear."""
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, FakeQuantLinear):
                plain = nn.Linear(child.in_features, child.out_features, bias=child.bias is not None,
                                  device=child.weight.device)
                plain.weight, plain.bias = child.weight, child.bias
                setattr(parent, name, plain)
    return model


def recover_int8(
    model: nn.Module,
    teacher: nn.Module,
    task_data,
    *,
    backend: str = "torch-int8",
    steps: int = 300,
    lr: float = 1e-5,
    batch_size: int = 32,
    alpha: float = 0.5,
    temperature: float = 2.0,
    eval_every: int | None = None,
    work_dir: str | os.PathLike,
    seed: int = 42,
) -> tuple[nn.Module, dict[str, Any]]:
    """A short distillation pass with fake-quantized Linears, to win back what int8 loses.

    Loss ``(1 − α)·task loss + α·KD(T)`` against the fp32 ``teacher`` (the baseline's
    ``distillation_loss``), trained by the one Trainer. The fake quantization follows
    ``backend``: torch's 7-bit activations on its x86/fbgemm engine, ONNX Runtime's 8-bit ones.
    Weights are selected by dev score: of the real torch int8 model (quantize_dynamic of the
    stripped weights) for torch-int8, of the fake-quantized model (ORT's rounding, simulated) for
    onnx-int8, where exporting at every evaluation would cost more than the pass. Returns the fp32
    model (plain Linears) to quantize, and the settings and selection metrics of the pass.
    """
    from distillery.baseline import distillation_loss
    from distillery.distill.trainer import Trainer
    from distillery.evaluation import score

    backend = resolve_format(backend)
    if backend not in ("torch-int8", "onnx-int8"):
        raise DistilleryError(f"Recovery is for an int8 backend (torch-int8 or onnx-int8), not {backend!r}.")
    if task_data.train is None:
        raise DistilleryError("Recovery needs the task's training split.")
    if getattr(teacher.config, "vocab_size", None) != getattr(model.config, "vocab_size", None):
        raise DistilleryError("The recovery teacher and the model have different vocabularies; give a teacher with the model's tokenizer.")
    kind, main = task_data.task.kind, task_data.task.main_metric

    def int8_score(m: nn.Module) -> dict[str, float]:
        if backend == "onnx-int8":
            return score(m, task_data)  # FakeQuantize still rounds in eval mode
        return score(quantize_torch(strip_fake_quant(copy.deepcopy(m).cpu())), task_data)

    reduce_range = backend == "torch-int8" and torch.backends.quantized.engine in ("fbgemm", "x86")
    student = prepare_fake_quant(copy.deepcopy(model).cpu(), reduce_range=reduce_range).train()
    config = TrainConfig(epochs=1.0, max_steps=int(steps), lr=lr, batch_size=batch_size, warmup_ratio=0.0,
                         eval_every=eval_every or max(1, int(steps) // 3), select_best=True, seed=seed,
                         log_every=max(1, int(steps) // 3))
    work_dir = Path(work_dir)
    shutil.rmtree(work_dir, ignore_errors=True)
    started = time.time()
    try:
        with _quiet():
            # the baseline's loss: (1 − α)·task loss + α·KD(T), the teacher run on each batch
            loss_fn = distillation_loss(kind, teacher, alpha, temperature)
            trainer = Trainer(student, config, task_data.train, task_data.collate, loss_fn, out_dir=work_dir,
                              eval_fn=int8_score, main_metric=main, desc="int8 recovery")
            teacher.to(trainer.device).eval()
            result = trainer.train()
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
    recovered = strip_fake_quant(result.model).cpu().eval()
    info = {
        "backend": backend, "steps": int(steps), "lr": lr, "batch_size": batch_size, "alpha": alpha,
        "temperature": temperature, "reduce_range": reduce_range,
        "teacher": getattr(teacher.config, "_name_or_path", None) or type(teacher).__name__,
        "seconds": round(time.time() - started, 1),
        "selected_step": result.best_step, "selection_metrics": result.best_metrics,
    }
    return recovered, info
