"""CMOW/CBOW-Hybrid students (bidirectional CMOW, cross-architecture distillation). Importing
registers the model with the Auto classes."""

from distillery.cmow.modeling_cmow import (  # noqa: F401
    CMOWConfig,
    CMOWForMaskedLM,
    CMOWForSequenceClassification,
    CMOWModel,
)
from distillery.cmow.modeling_cmow import EXPORT_CHUNK, EXPORT_MAX_LENGTH
from distillery.export import register_onnx_export

# The exported graph multiplies in blocks of EXPORT_CHUNK tokens (see modeling_cmow.tree_product).
# int8: torch's. ONNX Runtime runs the many small matrix products slower than torch's batched matmul
# (SST-2 student, 2 cores: torch int8 0.8 ms at 1×128 and 8161 sentences/s at 256×64, ORT int8 1.0 ms
# and 3300/s; benchmarks/deploy.py).
register_onnx_export("cmow", seq_multiple=EXPORT_CHUNK, max_length=EXPORT_MAX_LENGTH, int8="torch-int8")
