"""AutoTinyBERT (Yin et al., ACL 2021): sub-architectures of a one-shot super-network. Importing
registers the standalone models with the Auto classes."""

from distillery.autotinybert.modeling_autotinybert import (  # noqa: F401
    AutoTinyBertConfig,
    AutoTinyBertForQuestionAnswering,
    AutoTinyBertForSequenceClassification,
    AutoTinyBertModel,
)
