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
    Whichever int8 backend was faster on the machine we measured (``DEFAULT_INT8``; see the table in
    docs/deployment.md), or the one a model type's config names; both stay available by name.

An int8 model is not equal to the fp32 one, so its check is not a tolerance: the export reports
how far its outputs moved (largest and mean absolute difference, how often the predicted class
stays the same) and, given a task, its dev score and the drop from fp32. Non-finite outputs or
wrong shapes fail the export.

Modules: ``onnx`` (graphs and their quantization), ``parity`` (the checks), ``recover``
(quantization-aware recovery), ``write`` (export folders and the manifest), ``formats``. Loading an
export folder is ``distillery.runtime``'s.

Adding a student type: its Linear layers quantize as they are; for ONNX, a model type whose inputs
or outputs are not the usual ones says so in its config class (``onnx_export``, see
:class:`distillery.modeling.OnnxSpec`).
"""

from distillery.export.formats import DEFAULT_INT8, resolve_format
from distillery.export.onnx import OPSET, export_onnx, quantize_onnx
from distillery.export.parity import FP32_ATOL, FP32_RTOL, compare_outputs, dev_batches, sample_batches
from distillery.export.recover import (
    RECOVER_THRESHOLD,
    FakeQuantLinear,
    prepare_fake_quant,
    recover_int8,
    strip_fake_quant,
)
from distillery.export.write import (build_variants, export, export_model, int8_speedup, kept_exports_folder,
                                     prepare_export_data, score_export)
from distillery.modeling import OnnxSpec
from distillery.runtime import OnnxModel, load_export, quantize_torch, read_manifest

__all__ = [
    "DEFAULT_INT8", "FP32_ATOL", "FP32_RTOL", "OPSET", "RECOVER_THRESHOLD", "FakeQuantLinear", "OnnxModel", "OnnxSpec",
    "build_variants", "compare_outputs", "dev_batches", "export", "export_model", "export_onnx", "kept_exports_folder", "load_export",
    "prepare_export_data", "prepare_fake_quant", "quantize_onnx", "quantize_torch", "read_manifest",
    "recover_int8", "resolve_format", "sample_batches", "score_export", "strip_fake_quant",
]
