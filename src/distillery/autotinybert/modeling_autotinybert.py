"""AutoTinyBERT's standalone models: BERT whose attention width ``qkv_size`` is its own dimension.

A sub-architecture α = (l, d_m, d_f, h, d_qkv) found in the super-network is extracted into one of
these (``hidden_size`` = d_m, ``intermediate_size`` = d_f, ``num_attention_heads`` = h,
``qkv_size`` = d_qkv): what ships is an ordinary dense model, with no slicing left. Embeddings and the
pooler are Hugging Face's BERT modules; the layer is written out because BERT's ties the attention
width to the hidden size. Attention runs through ``F.scaled_dot_product_attention``, as BERT's sdpa
path does, so latency comparisons with a BERT teacher compare like with like.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from huggingface_hub.dataclasses import strict
from torch import Tensor, nn
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForQuestionAnswering,
    AutoModelForSequenceClassification,
    BertConfig,
    PreTrainedModel,
)
from transformers.activations import ACT2FN
from transformers.modeling_outputs import ModelOutput
from transformers.models.bert.modeling_bert import BertEmbeddings, BertPooler


@strict
class AutoTinyBertConfig(BertConfig):
    """BertConfig plus ``qkv_size`` (d_qkv: the width of Q, K and V, split over the heads)."""

    model_type = "autotinybert"

    qkv_size: int | None = None  # None: hidden_size

    def __post_init__(self, **kwargs):
        if self.qkv_size is None:
            self.qkv_size = self.hidden_size
        super().__post_init__(**kwargs)

    def validate_architecture(self):
        super().validate_architecture()
        for name in ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads", "qkv_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"AutoTinyBERT {name} must be at least 1, got {getattr(self, name)}.")
        if self.qkv_size % self.num_attention_heads:
            raise ValueError(f"qkv_size {self.qkv_size} does not split into {self.num_attention_heads} heads of equal size.")


def split_heads(x: Tensor, heads: int) -> Tensor:
    """(B, T, d_qkv) -> (B, h, T, d_qkv / h)."""
    bsz, seq, width = x.shape
    return x.view(bsz, seq, heads, width // heads).transpose(1, 2)


def attention(q: Tensor, k: Tensor, v: Tensor, heads: int, mask: Tensor | None, dropout: float) -> Tensor:
    """(B, T, d_qkv) each -> (B, T, d_qkv): scaled dot-product attention over ``heads`` heads.
    ``mask``: additive (B, 1, 1, T) or None."""
    out = F.scaled_dot_product_attention(split_heads(q, heads), split_heads(k, heads), split_heads(v, heads),
                                         attn_mask=mask, dropout_p=dropout)
    return out.transpose(1, 2).reshape(q.shape)


def additive_mask(attention_mask: Tensor | None, dtype: torch.dtype) -> Tensor | None:
    """(B, T) 1/0 -> (B, 1, 1, T) additive mask (0 or the dtype's minimum); None when all tokens are real."""
    if attention_mask is None or (not torch.compiler.is_exporting() and bool(attention_mask.all())):
        return None  # (an exported graph cannot branch on the data: it always applies the mask)
    return (1.0 - attention_mask[:, None, None, :].to(dtype)) * torch.finfo(dtype).min


class AutoTinyBertLayer(nn.Module):
    """A BERT layer with BERT's parameter names (attention.self.query … output.LayerNorm)."""

    def __init__(self, config: AutoTinyBertConfig):
        super().__init__()
        d, qkv, eps = config.hidden_size, config.qkv_size, config.layer_norm_eps
        self.heads = config.num_attention_heads
        self.attention = nn.Module()
        self.attention.self = nn.Module()
        self.attention.self.query, self.attention.self.key, self.attention.self.value = (nn.Linear(d, qkv) for _ in range(3))
        self.attention.output = nn.Module()
        self.attention.output.dense = nn.Linear(qkv, d)
        self.attention.output.LayerNorm = nn.LayerNorm(d, eps=eps)
        self.intermediate = nn.Module()
        self.intermediate.dense = nn.Linear(d, config.intermediate_size)
        self.output = nn.Module()
        self.output.dense = nn.Linear(config.intermediate_size, d)
        self.output.LayerNorm = nn.LayerNorm(d, eps=eps)
        self.act = ACT2FN[config.hidden_act]
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.attention_dropout = config.attention_probs_dropout_prob

    def forward(self, x: Tensor, mask: Tensor | None) -> Tensor:
        s = self.attention.self
        a = attention(s.query(x), s.key(x), s.value(x), self.heads, mask, self.attention_dropout if self.training else 0.0)
        x = self.attention.output.LayerNorm(self.dropout(self.attention.output.dense(a)) + x)
        h = self.output.dense(self.act(self.intermediate.dense(x)))
        return self.output.LayerNorm(self.dropout(h) + x)


@dataclass
class AutoTinyBertOutput(ModelOutput):
    last_hidden_state: Tensor | None = None
    pooler_output: Tensor | None = None
    hidden_states: tuple[Tensor, ...] | None = None


@dataclass
class AutoTinyBertClassifierOutput(ModelOutput):
    loss: Tensor | None = None
    logits: Tensor | None = None
    hidden_states: tuple[Tensor, ...] | None = None


@dataclass
class AutoTinyBertQAOutput(ModelOutput):
    loss: Tensor | None = None
    start_logits: Tensor | None = None
    end_logits: Tensor | None = None
    hidden_states: tuple[Tensor, ...] | None = None


class AutoTinyBertPreTrainedModel(PreTrainedModel):
    config_class = AutoTinyBertConfig
    config: AutoTinyBertConfig
    base_model_prefix = "bert"

    @torch.no_grad()
    def _init_weights(self, module):
        std = self.config.initializer_range
        if isinstance(module, nn.Linear):
            module.weight.normal_(0.0, std)
            if module.bias is not None:
                module.bias.zero_()
        elif isinstance(module, nn.Embedding):
            module.weight.normal_(0.0, std)
            if module.padding_idx is not None:
                module.weight[module.padding_idx].zero_()
        elif isinstance(module, nn.LayerNorm):
            module.weight.fill_(1.0)
            module.bias.zero_()
        elif isinstance(module, BertEmbeddings):
            module.position_ids.copy_(torch.arange(module.position_ids.shape[-1]).expand((1, -1)))
            module.token_type_ids.zero_()


class AutoTinyBertModel(AutoTinyBertPreTrainedModel):
    def __init__(self, config: AutoTinyBertConfig, add_pooling_layer: bool = True):
        super().__init__(config)
        self.embeddings = BertEmbeddings(config)
        self.encoder = nn.Module()
        self.encoder.layer = nn.ModuleList([AutoTinyBertLayer(config) for _ in range(config.num_hidden_layers)])
        self.pooler = BertPooler(config) if add_pooling_layer else None
        self.post_init()

    def get_input_embeddings(self):
        return self.embeddings.word_embeddings

    def set_input_embeddings(self, value):
        self.embeddings.word_embeddings = value

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None,
                inputs_embeds=None, output_hidden_states=None, return_dict=None, **kwargs) -> AutoTinyBertOutput:
        x = self.embeddings(input_ids=input_ids, token_type_ids=token_type_ids, position_ids=position_ids,
                            inputs_embeds=inputs_embeds)  # (B, T, d_m)
        mask = additive_mask(attention_mask, x.dtype)
        hidden = [x] if output_hidden_states else None
        for layer in self.encoder.layer:
            x = layer(x, mask)
            if hidden is not None:
                hidden.append(x)
        return AutoTinyBertOutput(last_hidden_state=x, pooler_output=self.pooler(x) if self.pooler is not None else None,
                                  hidden_states=tuple(hidden) if hidden is not None else None)


class AutoTinyBertForSequenceClassification(AutoTinyBertPreTrainedModel):
    def __init__(self, config: AutoTinyBertConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.bert = AutoTinyBertModel(config)
        dropout = config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None, inputs_embeds=None,
                labels=None, output_hidden_states=None, return_dict=None, **kwargs) -> AutoTinyBertClassifierOutput:
        out = self.bert(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds,
                        output_hidden_states=output_hidden_states)
        logits = self.classifier(self.dropout(out.pooler_output))
        loss = None
        if labels is not None:
            loss = (F.mse_loss(logits.squeeze(-1), labels.float()) if self.num_labels == 1
                    else F.cross_entropy(logits, labels))
        return AutoTinyBertClassifierOutput(loss=loss, logits=logits, hidden_states=out.hidden_states)


class AutoTinyBertForQuestionAnswering(AutoTinyBertPreTrainedModel):
    def __init__(self, config: AutoTinyBertConfig):
        super().__init__(config)
        self.bert = AutoTinyBertModel(config, add_pooling_layer=False)
        self.qa_outputs = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None, inputs_embeds=None,
                start_positions=None, end_positions=None, output_hidden_states=None, return_dict=None,
                **kwargs) -> AutoTinyBertQAOutput:
        out = self.bert(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds,
                        output_hidden_states=output_hidden_states)
        start, end = self.qa_outputs(out.last_hidden_state).split(1, dim=-1)
        start, end = start.squeeze(-1).contiguous(), end.squeeze(-1).contiguous()
        loss = None
        if start_positions is not None and end_positions is not None:
            n = start.size(1)
            loss = (F.cross_entropy(start, start_positions.clamp(0, n), ignore_index=n)
                    + F.cross_entropy(end, end_positions.clamp(0, n), ignore_index=n)) / 2
        return AutoTinyBertQAOutput(loss=loss, start_logits=start, end_logits=end, hidden_states=out.hidden_states)


AutoConfig.register("autotinybert", AutoTinyBertConfig, exist_ok=True)
AutoModel.register(AutoTinyBertConfig, AutoTinyBertModel, exist_ok=True)
AutoModelForSequenceClassification.register(AutoTinyBertConfig, AutoTinyBertForSequenceClassification, exist_ok=True)
AutoModelForQuestionAnswering.register(AutoTinyBertConfig, AutoTinyBertForQuestionAnswering, exist_ok=True)
