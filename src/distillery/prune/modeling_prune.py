"""The pruned student: AutoTinyBERT's layer (:mod:`distillery.autotinybert.modeling_autotinybert`, any family it
is cut from) with a head count and an FFN width of each layer's own, where 0 removes the sub-layer.

``PrunedBertConfig`` is an ``AutoTinyBertConfig`` plus ``layer_heads`` and ``layer_intermediate_sizes`` (None:
every layer has the uniform ``num_attention_heads`` / ``intermediate_size``); a head keeps the uniform head size
``qkv_size / num_attention_heads``. A removed attention (0 heads) or FFN (0 neurons) is absent from the weights
and the forward: the layer passes its input through, as CoFi's pruned sub-layers do (no norm either).

The same classes run the masked training model: a full-size ``PrunedBert*`` model whose base holds, during a
forward, the masks of :mod:`distillery.prune.masks` (``bert.masks``: heads, FFN neurons, the hidden dimension and
whole sub-layers). A mask of 0/1 values computes exactly what the model with those units removed computes:
a masked sub-layer of value z returns x + z·(y − x) (x its input, y its output), and a norm under a hidden mask
normalises over the kept dimensions only, as the removed model's narrower norm does (a test asserts the two).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from huggingface_hub.dataclasses import strict
from torch import Tensor, nn
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForQuestionAnswering,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
)

from distillery.autotinybert.modeling_autotinybert import (
    AutoTinyBertConfig,
    AutoTinyBertEmbeddings,
    AutoTinyBertForQuestionAnswering,
    AutoTinyBertForSequenceClassification,
    AutoTinyBertForTokenClassification,
    AutoTinyBertLayer,
    AutoTinyBertModel,
    AutoTinyBertOutput,
    AutoTinyBertPooler,
    AutoTinyBertPreTrainedModel,
    Context,
    layer_norm,
)
from distillery.modeling import wants_dict


@strict
class PrunedBertConfig(AutoTinyBertConfig):
    """AutoTinyBertConfig with per-layer ``layer_heads`` and ``layer_intermediate_sizes`` (0: the sub-layer removed)."""

    model_type = "prunedbert"

    layer_heads: list[int] | None = None
    layer_intermediate_sizes: list[int] | None = None

    def validate_architecture(self):
        super().validate_architecture()
        for name in ("layer_heads", "layer_intermediate_sizes"):
            sizes = getattr(self, name)
            if sizes is not None and (len(sizes) != self.num_hidden_layers or min(sizes, default=0) < 0):
                raise ValueError(f"{name} needs {self.num_hidden_layers} counts of 0 or more, got {sizes}.")

    @property
    def head_size(self) -> int:
        return self.qkv_size // self.num_attention_heads

    def heads_of(self, i: int) -> int:
        return self.num_attention_heads if self.layer_heads is None else self.layer_heads[i]

    def ffn_of(self, i: int) -> int:
        return self.intermediate_size if self.layer_intermediate_sizes is None else self.layer_intermediate_sizes[i]


@dataclass
class LayerMasks:
    """One layer's masks during a forward: ``heads`` (h,), ``neurons`` (d_f,), ``attention`` and ``ffn`` (scalars)."""

    heads: Tensor | None = None
    neurons: Tensor | None = None
    attention: Tensor | None = None
    ffn: Tensor | None = None


@dataclass
class ModelMasks:
    """The masks the base model reads during one forward: ``hidden`` (d_m,) and a :class:`LayerMasks` a layer."""

    hidden: Tensor | None
    layers: list[LayerMasks]


def masked_norm(x: Tensor, norm: nn.LayerNorm | None, keep: Tensor | None) -> Tensor:
    """``norm(x)`` over the dimensions where ``keep`` is non-zero, times ``keep`` (x · keep without a norm): the
    narrower norm of the model with the other dimensions removed, which is what the mask stands for."""
    if keep is None:
        return layer_norm(x, norm)
    if norm is None:
        return x * keep
    real = (keep != 0).to(x.dtype)
    n = real.sum()
    mean = (x * real).sum(-1, keepdim=True) / n
    var = (((x - mean) * real) ** 2).sum(-1, keepdim=True) / n
    y = (x - mean) * torch.rsqrt(var + norm.eps) * norm.weight
    return (y if norm.bias is None else y + norm.bias) * keep


def _gate(x: Tensor, y: Tensor, z: Tensor | None) -> Tensor:
    """A sub-layer's output y under its mask z: y at 1, its input x (the sub-layer removed) at 0."""
    return y if z is None else x + z * (y - x)


class PrunedBertLayer(AutoTinyBertLayer):
    """AutoTinyBERT's layer with this layer's own heads and FFN width; a sub-layer of size 0 is absent."""

    def __init__(self, config: PrunedBertConfig, index: int = 0):
        heads, ffn = config.heads_of(index), config.ffn_of(index)
        shape = copy.copy(config)  # the layer's own shape (at least 1 of each, the absent one dropped below)
        shape.num_attention_heads, shape.qkv_size = max(heads, 1), max(heads, 1) * config.head_size
        shape.intermediate_size = max(ffn, 1)
        super().__init__(shape, index)
        self.head_size = config.head_size
        if heads == 0:
            self.attention = None
        if ffn == 0:
            self.intermediate = self.output = None

    def forward(self, x: Tensor, ctx: Context, window: int = 0, masks: LayerMasks | None = None,
                hidden: Tensor | None = None, attentions: list | None = None) -> Tensor:
        m = masks or LayerMasks()
        if self.attention is not None:
            norm = self.attention.output.LayerNorm
            a = self.attend(masked_norm(x, norm, hidden) if self.pre_norm else x, ctx, None, window, None, attentions)
            if m.heads is not None:
                a = a * m.heads.repeat_interleave(self.head_size)
            a = self.dropout(self.attention.output.dense(a))
            a = a if hidden is None else a * hidden
            x = _gate(x, x + a if self.pre_norm else masked_norm(a + x, norm, hidden), m.attention)
        if self.intermediate is not None:
            norm = self.output.LayerNorm
            h_in = masked_norm(x, norm, hidden) if self.pre_norm else x
            h = self.act(self.intermediate.dense(h_in))
            if hasattr(self.intermediate, "gate"):
                h = h * self.intermediate.gate(h_in)
            h = h if m.neurons is None else h * m.neurons
            h = self.dropout(self.output.dense(h))
            h = h if hidden is None else h * hidden
            x = _gate(x, x + h if self.pre_norm else masked_norm(h + x, norm, hidden), m.ffn)
        return x


class PrunedBertEmbeddings(AutoTinyBertEmbeddings):
    def forward(self, input_ids, token_type_ids=None, d=None, inputs_embeds=None, hidden: Tensor | None = None):
        if hidden is None:
            return super().forward(input_ids, token_type_ids, d, inputs_embeds)
        if self.projection is not None:  # the norm is the embeddings' own width: only the projection's output is cut
            return super().forward(input_ids, token_type_ids, d, inputs_embeds) * hidden
        x = self.word_embeddings(input_ids) if inputs_embeds is None else inputs_embeds
        if self.position_embeddings is not None:
            x = x + self.position_embeddings(self.positions(input_ids, x.shape[:2], x.device))
        if self.token_type_embeddings is not None:
            types = torch.zeros(x.shape[:2], dtype=torch.long, device=x.device) if token_type_ids is None else token_type_ids
            x = x + self.token_type_embeddings(types)
        return self.dropout(masked_norm(x, self.LayerNorm, hidden))


class PrunedBertPooler(AutoTinyBertPooler):
    """The pooler, whose output dimensions are the hidden dimension's (cut with it) while a mask is set."""

    hidden: Tensor | None = None

    def transform(self, h: Tensor, d: int | None = None) -> Tensor:
        if self.hidden is None:
            return super().transform(h, d)
        return masked_norm(self.act(self.dense(h)), self.norm, self.hidden)


class PrunedBertModel(AutoTinyBertModel):
    config_class = PrunedBertConfig

    def __init__(self, config: PrunedBertConfig, add_pooling_layer: bool | None = None):
        AutoTinyBertPreTrainedModel.__init__(self, config)
        c = config
        add_pooling_layer = c.pooler if add_pooling_layer is None else add_pooling_layer
        self.masks: ModelMasks | None = None  # set by the masked training model around its forward
        self.embeddings = PrunedBertEmbeddings(c)
        self.encoder = nn.Module()
        self.encoder.layer = nn.ModuleList([PrunedBertLayer(c, i) for i in range(c.num_hidden_layers)])
        if c.relative_attention == "disentangled":
            span = c.relative_buckets if c.relative_buckets > 0 else c.max_relative_positions
            self.encoder.rel_embeddings = nn.Embedding(2 * span, c.hidden_size)
            self.encoder.rel_norm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps) if c.norm_rel_embeddings else None
        self.final_norm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps, bias=c.norm_bias) if c.final_norm else None
        self.pooler = PrunedBertPooler(c) if add_pooling_layer else None
        self.post_init()

    def encode(self, input_ids, attention_mask=None, token_type_ids=None, output_hidden_states=False,
               inputs_embeds=None, attentions=None):
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("Pass exactly one of input_ids and inputs_embeds.")
        m = self.masks
        hidden_z = None if m is None else m.hidden
        x = self.embeddings(input_ids, token_type_ids, inputs_embeds=inputs_embeds, hidden=hidden_z)
        ctx = Context(self, attention_mask, x, None)
        if hidden_z is not None and self.config.relative_attention == "disentangled":
            ctx.rel = masked_norm(ctx.rel if not self.config.norm_rel_embeddings else
                                  self.encoder.rel_embeddings.weight[: ctx.rel.shape[0]],
                                  self.encoder.rel_norm, hidden_z)
        states = [x] if output_hidden_states else None
        windows = self.config.layer_windows or [0] * len(self.encoder.layer)
        for j, layer in enumerate(self.encoder.layer):
            x = layer(x, ctx, windows[j], None if m is None else m.layers[j], hidden_z, attentions)
            if states is not None:
                states.append(x)
        x = masked_norm(x, self.final_norm, hidden_z) if self.final_norm is not None else x
        if states is not None and self.final_norm is not None:
            states[-1] = x
        return x, states

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None,
                inputs_embeds=None, output_hidden_states=None, output_attentions=None, return_dict=None,
                **kwargs) -> AutoTinyBertOutput:
        if position_ids is not None:
            raise ValueError("A pruned student computes its positions (as the family it was cut from); it takes no position_ids.")
        c = self.config
        output_hidden_states = c.output_hidden_states if output_hidden_states is None else output_hidden_states
        output_attentions = c.output_attentions if output_attentions is None else output_attentions
        attentions = [] if output_attentions else None
        if self.pooler is not None:
            self.pooler.hidden = None if self.masks is None else self.masks.hidden
        x, states = self.encode(input_ids, attention_mask, token_type_ids, bool(output_hidden_states), inputs_embeds, attentions)
        out = AutoTinyBertOutput(last_hidden_state=x,
                                 pooler_output=self.pooler(x, attention_mask) if self.pooler is not None else None,
                                 hidden_states=tuple(states) if states is not None else None,
                                 attentions=tuple(attentions) if attentions is not None else None)
        return out if wants_dict(return_dict, c) else out.to_tuple()


def _compact(config: PrunedBertConfig) -> PrunedBertConfig:
    """A uniform config no larger than the pruned model's largest layer: the shape the AutoTinyBERT head classes
    build their (at once replaced) base model of."""
    small = copy.copy(config)
    small.layer_heads = small.layer_intermediate_sizes = None
    small.num_hidden_layers, small.num_attention_heads, small.qkv_size, small.intermediate_size = 1, 1, config.head_size, 1
    small.layer_windows = None
    return small


class _PrunedHead:
    """The AutoTinyBERT head classes with a :class:`PrunedBertModel` as their base."""

    config_class = PrunedBertConfig

    def __init__(self, config: PrunedBertConfig):
        super().__init__(_compact(config))
        self.config = config
        self.bert = PrunedBertModel(config, add_pooling_layer=self.bert.pooler is not None)
        self.post_init()


class PrunedBertForSequenceClassification(_PrunedHead, AutoTinyBertForSequenceClassification):
    pass


class PrunedBertForTokenClassification(_PrunedHead, AutoTinyBertForTokenClassification):
    pass


class PrunedBertForQuestionAnswering(_PrunedHead, AutoTinyBertForQuestionAnswering):
    pass


AutoConfig.register("prunedbert", PrunedBertConfig, exist_ok=True)
AutoModel.register(PrunedBertConfig, PrunedBertModel, exist_ok=True)
AutoModelForSequenceClassification.register(PrunedBertConfig, PrunedBertForSequenceClassification, exist_ok=True)
AutoModelForTokenClassification.register(PrunedBertConfig, PrunedBertForTokenClassification, exist_ok=True)
AutoModelForQuestionAnswering.register(PrunedBertConfig, PrunedBertForQuestionAnswering, exist_ok=True)
