"""Any saved folder distillery wrote, as a model called like the Hugging Face model it came from.

:func:`load_model` (and so ``distillery.load_student``) takes a ``save_pretrained`` folder (or a
run folder, whose ``student/`` it loads) and returns the Hugging Face model with its head, or an
export folder (marked by its ``distillery_export.json``; written by ``distillery.export``) and
returns an object called the same way (``input_ids``, ``attention_mask``, ``token_type_ids`` →
``.logits`` or ``.start_logits``/``.end_logits``): the quantized HF model itself for torch-int8,
an :class:`OnnxModel` for the ONNX formats.

A torch-int8 export folder holds the fp32 weights and is quantized on load (:func:`quantize_torch`;
see ``distillery.export`` for why).
"""

from __future__ import annotations

import copy
import json
import logging
import os
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import torch
from torch import nn

from distillery.errors import DistilleryError
from distillery.folders import EXPORT_MANIFEST
from distillery.kinds.embedding import PooledEncoder
from distillery.modeling import SENTENCE_HEAD, head_named, load_pretrained, model_folder, model_head, read_config
from distillery.weights import verify_weights

ONNX_FILE = "model.onnx"


def load_model(path: str | Path) -> nn.Module:
    """The model saved in ``path`` with its task head, in eval mode; an export folder's model
    (ONNX Runtime or torch int8), called like the Hugging Face model it came from."""
    folder = model_folder(path)
    if (folder / EXPORT_MANIFEST).is_file():
        return load_export(folder)
    return load_pretrained(folder)


def is_export(model) -> bool:
    """Whether ``model`` is an export (an :class:`OnnxModel`, or a torch model quantized to int8): it computes
    outputs, on the CPU, and has no fp32 weights to train or export again."""
    return hasattr(model, "exported_architecture")  # set on exported and quantized models only


def on_device(model: nn.Module, device) -> nn.Module:
    """``model`` moved to ``device``; an export stays on the CPU, where it runs (ONNX Runtime's CPU
    provider, torch's int8 kernels), and its inputs follow it (evaluation sends them to the model's device)."""
    return model if is_export(model) else model.to(device)


def weights_digest(model: nn.Module, leave_out: tuple[str, ...] = ()) -> str:
    """sha256 of what decides ``model``'s outputs: an ONNX graph's bytes, or each tensor of its state by name
    (a quantized model's int8 weights with their scales, as the dequantized values), less the tensors whose
    names start with one of ``leave_out``."""
    import hashlib

    digest = hashlib.sha256()
    if isinstance(model, OnnxModel):
        digest.update(model._bytes)
        return digest.hexdigest()
    for name, value in sorted(model.state_dict().items()):
        if name.startswith(leave_out):
            continue
        digest.update(name.encode())
        for tensor in value if isinstance(value, tuple) else (value,):  # int8 Linear: (packed weight, bias)
            if not isinstance(tensor, torch.Tensor):  # the packed parameters' dtype
                digest.update(repr(tensor).encode())
                continue
            tensor = tensor.dequantize() if tensor.is_quantized else tensor
            digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


@contextmanager
def quiet():
    """Silence torch.ao's deprecation notices and the ONNX exporter's progress lines: printed at
    every call, they would bury the lines that matter. Errors still raise."""
    names = ("torch.onnx", "torch._dynamo", "torch.export", "torch._export", "onnxscript", "onnx_ir")
    loggers = [logging.getLogger(n) for n in names]
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


class ExportedArchitecture:
    """What ``bench`` reports for an exported model instead of counting it: its fp32 architecture
    (whose parameters and FLOPs per token it has), its backend and the size of its weights.

    An int8 multiply-add is still one, and neither an ONNX graph nor torch's packed int8 weights
    expose parameters that ``bench.count_parameters`` could count. The architecture is rebuilt from
    config.json (random weights) when asked.
    """

    def __init__(self, config, head: str, backend: str, weights_bytes: int | None):
        self.config, self.head, self.backend, self.weights_bytes = config, head, backend, weights_bytes

    def fp32_model(self) -> nn.Module:
        with quiet():
            return head_named(self.head).auto_class.from_config(self.config).eval()


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
        self.exported_architecture = ExportedArchitecture(config, self.head, manifest.get("backend", "onnxruntime"),
                                                          len(model_bytes))

    def __getstate__(self):
        # An ONNX Runtime session cannot be copied or pickled; a copy starts its own on first call.
        state = dict(super().__getstate__())
        state["_session"], state["_threads"] = None, None
        return state

    def _get_session(self):
        threads = torch.get_num_threads()
        if self._session is None or threads != self._threads:
            self._session = ort_session(self._bytes, threads)
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
        head = head_named(self.head)
        if extra and head.per_position:  # per-token outputs (start/end logits, hidden states) cut to the input's length
            outputs = [o[:, :length] if o.ndim >= 2 and o.shape[1] == length + extra else o for o in outputs]
        return head.output_class(**{n: torch.from_numpy(o) for n, o in zip(self.output_names, outputs)})

    def extra_repr(self) -> str:
        return f"format={self.manifest.get('format')}, inputs={self.input_names}, outputs={self.output_names}"


def require_onnx() -> None:
    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
    except ImportError:
        raise DistilleryError(
            "ONNX export and ONNX models need onnx and onnxruntime: pip install 'distillery[onnx]'."
        ) from None


def ort_session(model: bytes | str, threads: int):
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
        return torch_int8_model(folder, manifest.get("head"), weights_bytes=_file_size(folder / "model.safetensors"))
    require_onnx()
    path = folder / manifest.get("file", ONNX_FILE)
    if not path.is_file():
        raise DistilleryError(f"The export folder {folder} has no {path.name}.")
    verify_weights(folder)  # (torch-int8: load_pretrained verifies)
    return OnnxModel(path.read_bytes(), read_config(folder), manifest).eval()


def torch_int8_model(folder: str | os.PathLike, head: str | None, weights_bytes: int | None = None) -> nn.Module:
    """The int8 model of a torch-int8 export folder (its fp32 weights quantized), as the export computed it: an
    embedder's (manifest head ``sentence-embedding``) with its pooling and normalisation."""
    model = load_pretrained(folder)
    return quantize_torch(PooledEncoder(model) if head == SENTENCE_HEAD.name else model, weights_bytes=weights_bytes)


def _file_size(path: Path) -> int | None:
    return path.stat().st_size if path.is_file() else None


def quantize_torch(model: nn.Module, weights_bytes: int | None = None) -> nn.Module:
    """A dynamically quantized copy (int8 Linear weights) of a fp32 model, in eval mode.

    The result is the same Hugging Face class, called the same way; it carries
    ``exported_architecture`` (its fp32 architecture, for bench) because its packed weights are not
    parameters.
    """
    from torch.ao.quantization import quantize_dynamic

    head = model_head(model).name if hasattr(model, "config") else "base"
    source = copy.deepcopy(model).cpu().eval()
    with quiet():
        quantized = quantize_dynamic(source, {nn.Linear}, dtype=torch.qint8)
    if hasattr(quantized, "config"):
        backend = f"torch {torch.__version__} int8 (quantize_dynamic, {torch.backends.quantized.engine})"
        quantized.exported_architecture = ExportedArchitecture(quantized.config, head, backend, weights_bytes)
    return quantized.eval()
