"""ONNX graphs: ``torch.onnx.export`` with dynamic batch and sequence axes, and ONNX Runtime's
dynamic int8 quantization of them.

A model type whose inputs or outputs are not the usual ones, or whose graph needs other settings,
says so in its config class (``onnx_export``, a :class:`distillery.modeling.OnnxSpec`)::

    class CMOWConfig(PreTrainedConfig):
        onnx_export = OnnxSpec(seq_multiple=16, max_length=4096)
"""

from __future__ import annotations

import atexit
import hashlib
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Sequence

import torch
from torch import nn

from distillery.data.encode import taken_inputs
from distillery.errors import DistilleryError
from distillery.modeling import model_head, onnx_spec
from distillery.runtime import quiet, require_onnx, weights_digest

OPSET = 18  # ONNX Runtime has run opset 18 since 1.14; the quantizer knows all its ops
TOKEN_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def graph_inputs(model: nn.Module, tokenizer) -> tuple[str, ...]:
    spec = onnx_spec(model.config)
    if spec.inputs:
        return tuple(spec.inputs)
    given = set(getattr(tokenizer, "model_input_names", None) or TOKEN_INPUTS)
    inputs = tuple(k for k in taken_inputs(model) if k in TOKEN_INPUTS and k in given)
    if "input_ids" not in inputs:
        raise DistilleryError(f"{type(model).__name__} does not take input_ids; declare its ONNX inputs in its "
                              "config class's onnx_export.")
    return inputs


def graph_outputs(model: nn.Module) -> tuple[str, ...]:
    spec = onnx_spec(model.config)
    return tuple(spec.outputs) if spec.outputs and not hasattr(model, "export_head") else model_head(model).outputs


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
    require_onnx()
    spec = onnx_spec(model.config)
    wrapper = _Positional(model, inputs, outputs).eval()
    multiple = spec.seq_multiple
    args = _example_inputs(model, inputs, seq=16 if multiple == 1 else 2 * multiple)  # two blocks: not one
    axes = {0: "batch", 1: "seq"}
    try:
        with quiet(), torch.no_grad():
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


# The fp32 graphs traced in this process, by what decides them (class, config, inputs, outputs, weights): a
# model exported to several formats (--export onnx beside the default int8 export; auto's int8 teacher baseline,
# once per candidate) is traced once, the costliest step of an export. Kept in a temporary folder (a base-size
# graph is 440 MB), removed when the process ends.
_TRACED: dict[str, tuple[Path, dict[str, Any]]] = {}
_TRACE_FOLDER: list[Path] = []


def export_onnx_once(model: nn.Module, path: str | os.PathLike, inputs: Sequence[str],
                     outputs: Sequence[str]) -> dict[str, Any]:
    """:func:`export_onnx`, or a copy of the graph it wrote for the same model earlier in this process."""
    key = hashlib.sha256("\n".join([type(model).__name__, model.config.to_json_string(), ",".join(inputs),
                                     ",".join(outputs), str(OPSET), weights_digest(model)]).encode()).hexdigest()
    if key in _TRACED and _TRACED[key][0].is_file():
        shutil.copyfile(_TRACED[key][0], path)
        return dict(_TRACED[key][1])
    exporter = export_onnx(model, path, inputs, outputs)
    if not _TRACE_FOLDER:
        _TRACE_FOLDER.append(Path(tempfile.mkdtemp(prefix="distillery-traced-")))
        atexit.register(shutil.rmtree, _TRACE_FOLDER[0], True)
    kept = _TRACE_FOLDER[0] / f"{key}.onnx"
    shutil.copyfile(path, kept)
    _TRACED[key] = (kept, dict(exporter))
    return exporter


def per_channel_int8(weight_shapes) -> bool:
    """Whether :func:`quantize_onnx` gives MatMul weights of these shapes one int8 scale per output channel.
    ONNX Runtime's int8 MatMul takes one scale per column of a 2-D weight only: a graph with stacked weights
    (MoEBERT's experts, one batched MatMul) is quantized per tensor, all of it."""
    return all(len(shape) <= 2 for shape in weight_shapes)


def quantize_onnx(fp32_path: str | os.PathLike, int8_path: str | os.PathLike) -> dict[str, Any]:
    """ONNX Runtime dynamic quantization: int8 weights of MatMuls with constant weights, one scale per output
    channel (per tensor, a base-size student lost 1.7 points of SST-2 dev, per channel it lost none, at the
    same speed: docs/results.md)."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    settings = {"weight_type": "QInt8", "per_channel": True, "reduce_range": False,
                "op_types": ["MatMul", "Gemm"], "MatMulConstBOnly": True}
    # The exporter annotates intermediate values with shapes that ONNX's own shape inference (which
    # the quantizer runs) contradicts for some nodes (Gemm of the heads); the graph is fine without
    # them, and the quantizer infers what it needs again.
    graph = onnx.load(str(fp32_path))
    graph.graph.ClearField("value_info")
    onnx.save(graph, str(fp32_path))
    weights = {n.input[1] for n in graph.graph.node if n.op_type == "MatMul" and len(n.input) > 1}
    settings["per_channel"] = per_channel_int8(t.dims for t in graph.graph.initializer if t.name in weights)
    # The quantizer logs a line per tensor it leaves in fp32 and suggests its pre-processing (shape
    # inference and graph optimisation; ONNX Runtime optimises the graph when the session starts
    # anyway), all on the root logger at every call: only its errors are let through.
    root = logging.getLogger()
    level = root.level
    root.setLevel(max(level, logging.ERROR))
    with quiet():
        try:
            quantize_dynamic(str(fp32_path), str(int8_path), op_types_to_quantize=settings["op_types"],
                             per_channel=settings["per_channel"], reduce_range=False, weight_type=QuantType.QInt8,
                             extra_options={"MatMulConstBOnly": True})
        finally:
            root.setLevel(level)
    return {"tool": "onnxruntime.quantization.quantize_dynamic", **settings}
