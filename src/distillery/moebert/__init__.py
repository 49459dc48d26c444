"""MoEBERT (Zuo et al., NAACL 2022): the teacher's FFNs cut into experts by neuron importance,
one expert per token, recovered by layer-wise distillation. Importing registers the model with
the Auto classes."""

from distillery.moebert.modeling_moebert import (  # noqa: F401
    MoEBertConfig,
    MoEBertForQuestionAnswering,
    MoEBertForSequenceClassification,
    MoEBertModel,
)
