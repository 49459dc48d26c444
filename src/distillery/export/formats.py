"""Export format names: ``int8`` is not a backend but whichever int8 backend is faster."""

from __future__ import annotations

from distillery.config import EXPORT_FORMATS
from distillery.errors import DistilleryError
from distillery.modeling import onnx_spec

# The int8 backend `--format int8` picks. Measured on a 2-core AMD EPYC (AVX-512 VNNI), one thread,
# every model in one interleaved benchmark: ONNX Runtime's int8 was 1.10x (teacher) and 1.13x
# (3-layer student) faster than torch's at 1x128, 1.04x and 1.08x at 256x64, and lost less accuracy
# (SST-2 teacher -1.5 points against -3.1). benchmarks/deploy.py measures both again.
DEFAULT_INT8 = "onnx-int8"


def resolve_format(fmt: str, config=None) -> str:
    """``int8`` → the faster int8 backend for a model's ``config`` (or a model type's); unknown
    formats fail with the list of known ones."""
    if fmt not in EXPORT_FORMATS:
        raise DistilleryError(f"Unknown export format {fmt!r}; choose one of {', '.join(EXPORT_FORMATS)}.")
    if fmt != "int8":
        return fmt
    return onnx_spec(config).int8 or DEFAULT_INT8
