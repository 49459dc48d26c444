"""CMOW/CBOW-Hybrid students (bidirectional CMOW, cross-architecture distillation). Importing
registers the model with the Auto classes."""

from distillery.cmow.modeling_cmow import (  # noqa: F401
    CMOWConfig,
    CMOWForMaskedLM,
    CMOWForSequenceClassification,
    CMOWModel,
)
