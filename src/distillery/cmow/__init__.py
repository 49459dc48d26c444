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
register_onnx_export("cmow", seq_multiple=EXPORT_CHUNK, max_length=EXPORT_MAX_LENGTH)
