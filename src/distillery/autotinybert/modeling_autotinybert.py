"""AutoTinyBERT's standalone models: an encoder whose attention width ``qkv_size`` is its own dimension,
in the attention and position scheme of the family it was cut from.

A sub-architecture α = (l, d_m, d_f, h, d_qkv) found in the super-network is extracted into one of
these (``hidden_size`` = d_m, ``intermediate_size`` = d_f, ``num_attention_heads`` = h,
``qkv_size`` = d_qkv): what ships is an ordinary dense model, with no slicing left. The families' own
Hugging Face classes tie the attention width to the hidden size, so the layer is written out here, once,
with what a family needs recorded in the config (so that save -> load rebuilds it):

- embeddings: ``embedding_size`` (narrower embeddings, then ``embeddings.projection`` up: ELECTRA,
  ALBERT), ``position_kind`` ("absolute" from 0, "after-padding": from ``position_padding_idx`` + 1 as
  RoBERTa and MPNet count, "none"), token types when ``type_vocab_size`` > 0;
- attention: ``relative_attention`` None, "bias" (MPNet's bucketed per-head bias; each layer holds its
  own copy of the table, so that heads can be reordered layer by layer), "disentangled" (DeBERTa-v2's
  c2p / p2c terms on the shared ``encoder.rel_embeddings``) or "rotary" (ModernBERT; frequencies of the
  teacher's head size ``rotary_head_size``, so a head keeping d of its dimensions keeps their pairs);
  ``layer_windows``: a local attention window per layer (0: global);
- layers: ``pre_norm`` (with ``first_attention_norm`` and ``final_norm``), ``glu`` (``intermediate.gate``
  beside ``intermediate.dense``: act(dense) · gate), ``linear_bias``, ``norm_bias``;
- head: ``pooling`` ("cls" or "mean"), the pooler's dense layer (``pooler_bias``), ``pooler_activation``,
  ``pooler_norm``, then the classifier; the token classifier (``AutoTinyBertForTokenClassification``) and
  ``qa_outputs`` read every token, and with ``token_head`` (ModernBERT) that dense layer, activation and norm
  run on every token before them.

The defaults are BERT's, with BERT's parameter names, so a student folder whose config holds only BERT's
fields loads as a BERT-shaped student. The forward of :class:`AutoTinyBertModel` takes an optional :class:`Slice`: the super-net is a
full-size AutoTinyBertModel run on slices of its weights, so the slice and the extracted model are one
code path. Attention runs through ``F.scaled_dot_product_attention`` ("sdpa", the default), or written
out ("eager", and whenever the attention weights are asked for with ``output_attentions``).
Layers are transformers' ``GradientCheckpointingLayer``: ``gradient_checkpointing_enable()`` works.
"""

from __future__ import annotations

import math
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
    AutoModelForTokenClassification,
    BertConfig,
    PreTrainedModel,
)
from transformers.activations import ACT2FN
from transformers.loss.loss_utils import ForSequenceClassificationLoss, ForTokenClassification
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import ModelOutput

from distillery.modeling import wants_dict

RELATIVE_KINDS = (None, "bias", "disentangled", "rotary")
POSITION_KINDS = ("absolute", "after-padding", "none")


@strict
class AutoTinyBertConfig(BertConfig):
    """BertConfig plus ``qkv_size`` (d_qkv: the width of Q, K and V, split over the heads) and the family's
    scheme (see the module docstring); the defaults are BERT's."""

    model_type = "autotinybert"

    qkv_size: int | None = None  # None: hidden_size
    family: str = "bert"
    embedding_size: int | None = None  # None: hidden_size, no projection
    position_kind: str = "absolute"
    position_padding_idx: int | None = None
    relative_attention: str | None = None
    relative_buckets: int = 32  # bias: the table's buckets; disentangled: position_buckets (≤ 0: none)
    max_relative_positions: int = -1  # disentangled
    pos_att_type: list[str] | None = None  # disentangled: "c2p", "p2c"
    share_att_key: bool = True  # disentangled: positions projected by the content key / query projections
    norm_rel_embeddings: bool = False
    rotary_head_size: int | None = None
    rope_theta: float = 10000.0
    local_rope_theta: float = 10000.0
    layer_windows: list[int] | None = None  # per layer: 0 global, w > 0 attends within distance w
    pre_norm: bool = False
    first_attention_norm: bool = True
    final_norm: bool = False
    glu: bool = False
    linear_bias: bool = True
    norm_bias: bool = True
    pooling: str = "cls"
    pooler: bool = True  # the bare model has one (not an embedder of RoBERTa or MPNet: theirs is the head's)
    pooler_activation: str = "tanh"
    pooler_bias: bool = True
    pooler_norm: bool = False
    # QA, token classification: the pooler's dense, activation and norm on every token before the last linear
    token_head: bool = False

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
        if self.relative_attention not in RELATIVE_KINDS or self.position_kind not in POSITION_KINDS:
            raise ValueError(f"Unknown relative_attention {self.relative_attention!r} or position_kind {self.position_kind!r}.")
        if self.layer_windows is not None and len(self.layer_windows) != self.num_hidden_layers:
            raise ValueError(f"layer_windows has {len(self.layer_windows)} entries for {self.num_hidden_layers} layers.")


@dataclass
class Slice:
    """What a sub-network takes of a full-size model's weights: ``hidden`` d_m, ``ffn`` d_f, the Q/K/V
    ``rows`` (and attention-output columns), ``heads`` h and the ``layers`` it runs (indices)."""

    hidden: int
    ffn: int
    rows: Tensor
    heads: int
    layers: list[int]


def split_heads(x: Tensor, heads: int) -> Tensor:
    """(B, T, d_qkv) -> (B, h, T, d_qkv / h)."""
    bsz, seq, width = x.shape
    return x.view(bsz, seq, heads, width // heads).transpose(1, 2)


def additive_mask(attention_mask: Tensor | None, dtype: torch.dtype) -> Tensor | None:
    """(B, T) 1/0 -> (B, 1, 1, T) additive mask (0 or the dtype's minimum); None when all tokens are real."""
    if attention_mask is None or (not _in_graph() and bool(attention_mask.all())):
        return None  # (an exported or compiled graph cannot branch on the data: it always applies the mask)
    return (1.0 - attention_mask[:, None, None, :].to(dtype)) * torch.finfo(dtype).min


def _in_graph() -> bool:
    """Tracing for torch.export or torch.compile: no data-dependent branch."""
    return torch.compiler.is_exporting() or torch.compiler.is_compiling()


def linear(x: Tensor, lin: nn.Linear, rows=None, cols=None) -> Tensor:
    """``lin(x)`` on its ``rows`` (outputs) and ``cols`` (inputs); the module itself when both are None."""
    if rows is None and cols is None:
        return lin(x)
    w, b = lin.weight, lin.bias
    if rows is not None:
        w, b = w[rows], (None if b is None else b[rows])
    return F.linear(x, w if cols is None else w[:, cols], b)


def layer_norm(x: Tensor, norm: nn.LayerNorm | None, d: int | None = None) -> Tensor:
    """``norm`` over the first ``d`` dimensions (its own width when None); x itself without a norm."""
    if norm is None:
        return x
    if d is None:
        return norm(x)
    return F.layer_norm(x, (d,), norm.weight[:d], None if norm.bias is None else norm.bias[:d], norm.eps)


def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotary positions on (B, h, T, d): dimension i paired with i + d/2, as ModernBERT (and LLaMA) pair them."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def mpnet_buckets(seq: int, buckets: int, device, max_distance: int = 128) -> Tensor:
    """MPNet's bidirectional log-spaced bucket of each relative position (T, T)."""
    n = torch.arange(seq, device=device)[:, None] - torch.arange(seq, device=device)[None, :]  # i − j = −(j − i)
    half = buckets // 2
    ret = (n < 0).long() * half
    n = n.abs()
    exact = half // 2
    large = exact + (torch.log(n.float().clamp(min=1) / exact) / math.log(max_distance / exact) * (half - exact)).long()
    return ret + torch.where(n < exact, n, large.clamp(max=half - 1))


class AutoTinyBertEmbeddings(nn.Module):
    """Word (+ absolute position) (+ token type) embeddings, a LayerNorm, and an optional projection up."""

    def __init__(self, config: AutoTinyBertConfig):
        super().__init__()
        e = config.embedding_size or config.hidden_size
        self.word_embeddings = nn.Embedding(config.vocab_size, e, padding_idx=config.pad_token_id)
        self.position_embeddings = (nn.Embedding(config.max_position_embeddings, e)
                                    if config.position_kind != "none" else None)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, e) if config.type_vocab_size > 0 else None
        self.LayerNorm = nn.LayerNorm(e, eps=config.layer_norm_eps, bias=config.norm_bias)
        self.projection = nn.Linear(e, config.hidden_size) if config.embedding_size else None
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.position_kind, self.padding_idx = config.position_kind, config.position_padding_idx

    def positions(self, input_ids: Tensor | None, shape: torch.Size, device) -> Tensor:
        """(1 or B, T) position ids; from ``inputs_embeds`` (no ids) every position is a real token."""
        if self.position_kind == "after-padding":  # RoBERTa / MPNet: padding keeps padding_idx
            if input_ids is None:
                return torch.arange(self.padding_idx + 1, self.padding_idx + 1 + shape[1], device=device)[None, :]
            real = input_ids.ne(self.padding_idx).long()
            return torch.cumsum(real, dim=1) * real + self.padding_idx
        return torch.arange(shape[1], device=device)[None, :]

    def forward(self, input_ids: Tensor | None, token_type_ids: Tensor | None = None, d: int | None = None,
                inputs_embeds: Tensor | None = None) -> Tensor:
        """``inputs_embeds`` (B, T, embedding width) stand for the word embeddings of ``input_ids``."""
        cols = None if d is None or self.projection is not None else d  # a projection's input is never sliced
        pick = lambda emb, ids: F.embedding(ids, emb.weight if cols is None else emb.weight[:, :cols])  # noqa: E731
        x = pick(self.word_embeddings, input_ids) if inputs_embeds is None else inputs_embeds
        shape = x.shape[:2]
        if self.position_embeddings is not None:
            x = x + pick(self.position_embeddings, self.positions(input_ids, shape, x.device))
        if self.token_type_embeddings is not None:
            types = (torch.zeros(shape, dtype=torch.long, device=x.device) if token_type_ids is None else token_type_ids)
            x = x + pick(self.token_type_embeddings, types)
        x = layer_norm(x, self.LayerNorm, cols)
        if self.projection is not None:
            x = linear(x, self.projection, None if d is None else slice(0, d))
        return self.dropout(x)


def _module(**children) -> nn.Module:
    m = nn.Module()
    for name, child in children.items():
        setattr(m, name, child)
    return m


class AutoTinyBertLayer(GradientCheckpointingLayer):
    """A layer with BERT's parameter names (attention.self.query … output.LayerNorm); post- or pre-norm,
    with the family's relative attention, a GLU FFN when asked."""

    def __init__(self, config: AutoTinyBertConfig, index: int = 0):
        super().__init__()
        d, qkv, eps, bias = config.hidden_size, config.qkv_size, config.layer_norm_eps, config.linear_bias
        self.heads, self.pre_norm, self.relative = config.num_attention_heads, config.pre_norm, config.relative_attention
        norm = lambda: nn.LayerNorm(d, eps=eps, bias=config.norm_bias)  # noqa: E731
        s = _module(query=nn.Linear(d, qkv, bias=bias), key=nn.Linear(d, qkv, bias=bias), value=nn.Linear(d, qkv, bias=bias))
        if self.relative == "bias":
            s.relative_bias = nn.Embedding(config.relative_buckets, self.heads)
        if self.relative == "disentangled" and not config.share_att_key:
            types = config.pos_att_type or []
            s.pos_key = nn.Linear(d, qkv) if "c2p" in types else None
            s.pos_query = nn.Linear(d, qkv) if "p2c" in types else None
        first_norm = config.first_attention_norm or index > 0 or not config.pre_norm
        self.attention = _module(self=s, output=_module(dense=nn.Linear(qkv, d, bias=bias), LayerNorm=norm() if first_norm else None))
        self.intermediate = _module(dense=nn.Linear(d, config.intermediate_size, bias=bias))
        if config.glu:
            self.intermediate.gate = nn.Linear(d, config.intermediate_size, bias=bias)
        self.output = _module(dense=nn.Linear(config.intermediate_size, d, bias=bias), LayerNorm=norm())
        self.act = ACT2FN[config.hidden_act]
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.attention_dropout = config.attention_probs_dropout_prob

    def forward(self, x: Tensor, ctx: "Context", sub: Slice | None = None, window: int = 0,
                scores: list | None = None, attentions: list | None = None) -> Tensor:
        d, f = (None, None) if sub is None else (sub.hidden, sub.ffn)
        cols, hidden_cols = (None, None) if sub is None else (slice(0, d), slice(0, d))
        att_norm, out_norm = self.attention.output.LayerNorm, self.output.LayerNorm
        a_in = layer_norm(x, att_norm, d) if self.pre_norm else x
        a = self.attend(a_in, ctx, sub, window, scores, attentions)
        a = self.dropout(linear(a, self.attention.output.dense, hidden_cols, None if sub is None else sub.rows))
        x = x + a if self.pre_norm else layer_norm(a + x, att_norm, d)
        h_in = layer_norm(x, out_norm, d) if self.pre_norm else x
        ffn_rows = None if sub is None else slice(0, f)
        h = self.act(linear(h_in, self.intermediate.dense, ffn_rows, cols))
        if hasattr(self.intermediate, "gate"):
            h = h * linear(h_in, self.intermediate.gate, ffn_rows, cols)
        h = self.dropout(linear(h, self.output.dense, hidden_cols, ffn_rows))
        return x + h if self.pre_norm else layer_norm(h + x, out_norm, d)

    def attend(self, x: Tensor, ctx: "Context", sub: Slice | None, window: int, scores: list | None,
               attentions: list | None = None) -> Tensor:
        """Multi-head attention of (B, T, d) -> (B, T, d_qkv), with the family's positions; with
        ``attentions`` (or an "eager" model) written out, the weights (B, h, T, T) appended to it."""
        s = self.attention.self
        rows, cols = (None, None) if sub is None else (sub.rows, slice(0, sub.hidden))
        heads = self.heads if sub is None else sub.heads
        q, k, v = (split_heads(linear(x, lin, rows, cols), heads) for lin in (s.query, s.key, s.value))
        if scores is not None:  # the content scores q·kᵀ/√d_head the one-shot KD compares
            scores.append(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]))
        mask, scale = ctx.mask(window), None
        if self.relative == "rotary":
            cos, sin = ctx.rotary(q.shape[-1], window)
            q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        elif self.relative == "bias":
            bias = s.relative_bias.weight[ctx.buckets][..., :heads].permute(2, 0, 1)[None]  # (1, h, T, T)
            mask = bias if mask is None else mask + bias
        elif self.relative == "disentangled":
            bias, scale = ctx.disentangled(s, q, k, rows, cols)
            mask = bias if mask is None else mask + bias
        p = self.attention_dropout if self.training else 0.0
        if attentions is None and not ctx.eager:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p, scale=scale)
        else:  # what SDPA computes, with its weights kept
            weights = q @ k.transpose(-1, -2) * (scale if scale is not None else 1.0 / math.sqrt(q.shape[-1]))
            weights = (weights if mask is None else weights + mask).softmax(-1)
            if attentions is not None:
                attentions.append(weights)
            out = F.dropout(weights, p) @ v
        return out.transpose(1, 2).flatten(2)


class Context:
    """What every layer of one forward shares: the padding mask, per-window masks, and the positions
    (MPNet's buckets, DeBERTa's relative embeddings, rotary tables)."""

    def __init__(self, model: "AutoTinyBertModel", attention_mask: Tensor | None, x: Tensor, d: int | None):
        self.config, self.dtype, self.device, self.seq = model.config, x.dtype, x.device, x.shape[1]
        self.eager = model.config._attn_implementation == "eager"
        self.padding = additive_mask(attention_mask, x.dtype)
        self._windows: dict[int, Tensor | None] = {0: self.padding}
        self._rotary: dict[tuple[int, int], tuple[Tensor, Tensor]] = {}
        c = self.config
        if c.relative_attention == "bias":
            self.buckets = mpnet_buckets(self.seq, c.relative_buckets, self.device)
        if c.relative_attention == "disentangled":
            from transformers.models.deberta_v2.modeling_deberta_v2 import build_relative_position

            self.span = c.relative_buckets if c.relative_buckets > 0 else c.max_relative_positions
            self.relative_pos = build_relative_position(x, x, c.relative_buckets, c.max_relative_positions)[0]
            rel = model.encoder.rel_embeddings.weight[: 2 * self.span]
            rel = rel if d is None else rel[:, :d]
            self.rel = layer_norm(rel, model.encoder.rel_norm, d) if c.norm_rel_embeddings else rel

    def mask(self, window: int) -> Tensor | None:
        """The additive mask of a layer attending within distance ``window`` (0: everywhere)."""
        if window not in self._windows:
            i = torch.arange(self.seq, device=self.device)
            far = ((i[:, None] - i[None, :]).abs() > window)[None, None]
            local = torch.zeros(far.shape, dtype=self.dtype, device=self.device).masked_fill(far, torch.finfo(self.dtype).min)
            self._windows[window] = local if self.padding is None else torch.maximum(local + self.padding,
                                                                                      local.new_tensor(torch.finfo(self.dtype).min))
        return self._windows[window]

    def rotary(self, head_size: int, window: int) -> tuple[Tensor, Tensor]:
        """cos, sin (T, head_size) of the first head_size / 2 frequency pairs of the teacher's head size."""
        if (head_size, window) not in self._rotary:
            self._rotary[head_size, window] = self._rotary_table(head_size, window)
        return self._rotary[head_size, window]

    def _rotary_table(self, head_size: int, window: int) -> tuple[Tensor, Tensor]:
        c = self.config
        theta = c.local_rope_theta if window else c.rope_theta
        full = c.rotary_head_size or head_size
        inv = 1.0 / (theta ** (torch.arange(0, head_size, 2, dtype=torch.float, device=self.device) / full))
        freqs = torch.arange(self.seq, dtype=torch.float, device=self.device)[:, None] * inv[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(self.dtype), emb.sin().to(self.dtype)

    def disentangled(self, s: nn.Module, q: Tensor, k: Tensor, rows, cols) -> tuple[Tensor, float]:
        """DeBERTa-v2's c2p + p2c terms (B, h, T, T), already scaled, and the content scale 1/√(d_head · factor)."""
        types = self.config.pos_att_type or []
        heads, factor = q.shape[1], 1 + len(types)
        scale = 1.0 / math.sqrt(q.shape[-1] * factor)
        rel = self.rel[None]
        c2p_pos = (self.relative_pos + self.span).clamp(0, 2 * self.span - 1)
        p2c_pos = (-self.relative_pos + self.span).clamp(0, 2 * self.span - 1)
        bias = 0.0
        if "c2p" in types:
            pos_key = split_heads(linear(rel, s.key if self.config.share_att_key else s.pos_key, rows, cols), heads)
            c2p = q @ pos_key.transpose(-1, -2)  # (B, h, T, 2S)
            bias = bias + torch.gather(c2p, -1, c2p_pos.expand(*c2p.shape[:2], -1, -1)) * scale
        if "p2c" in types:
            pos_query = split_heads(linear(rel, s.query if self.config.share_att_key else s.pos_query, rows, cols), heads)
            p2c = k @ pos_query.transpose(-1, -2)
            bias = bias + torch.gather(p2c, -1, p2c_pos.expand(*p2c.shape[:2], -1, -1)).transpose(-1, -2) * scale
        return bias, scale


@dataclass
class AutoTinyBertOutput(ModelOutput):
    last_hidden_state: Tensor | None = None
    pooler_output: Tensor | None = None
    hidden_states: tuple[Tensor, ...] | None = None
    attentions: tuple[Tensor, ...] | None = None


@dataclass
class AutoTinyBertClassifierOutput(ModelOutput):
    loss: Tensor | None = None
    logits: Tensor | None = None
    hidden_states: tuple[Tensor, ...] | None = None
    attentions: tuple[Tensor, ...] | None = None


@dataclass
class AutoTinyBertQAOutput(ModelOutput):
    loss: Tensor | None = None
    start_logits: Tensor | None = None
    end_logits: Tensor | None = None
    hidden_states: tuple[Tensor, ...] | None = None
    attentions: tuple[Tensor, ...] | None = None


class AutoTinyBertPreTrainedModel(PreTrainedModel):
    config_class = AutoTinyBertConfig
    config: AutoTinyBertConfig
    base_model_prefix = "bert"
    supports_gradient_checkpointing = True
    _supports_sdpa = True  # the default: attention is F.scaled_dot_product_attention; "eager" writes it out
    _no_split_modules = ["AutoTinyBertLayer"]

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
            if module.bias is not None:
                module.bias.zero_()


class AutoTinyBertPooler(nn.Module):
    """The pooled token (``cls``: the first; ``mean``: the mean over real tokens) through a dense layer, its
    activation and an optional norm: BERT's pooler, RoBERTa's / ELECTRA's head before its out_proj,
    DistilBERT's pre_classifier, DeBERTa's ContextPooler, ModernBERT's prediction head."""

    def __init__(self, config: AutoTinyBertConfig):
        super().__init__()
        d = config.hidden_size
        self.dense = nn.Linear(d, d, bias=config.pooler_bias)
        self.norm = nn.LayerNorm(d, eps=config.layer_norm_eps, bias=config.norm_bias) if config.pooler_norm else None
        self.act = ACT2FN[config.pooler_activation]
        self.pooling = config.pooling

    def forward(self, x: Tensor, attention_mask: Tensor | None = None, d: int | None = None) -> Tensor:
        if self.pooling == "mean" and attention_mask is not None:
            m = attention_mask[..., None].to(x.dtype)
            pooled = (x * m).sum(1) / m.sum(1)
        else:
            pooled = x.mean(1) if self.pooling == "mean" else x[:, 0]
        return self.transform(pooled, d)

    def transform(self, h: Tensor, d: int | None = None) -> Tensor:
        """The dense layer, activation and norm (over the first ``d`` dimensions when given) of any states."""
        cut = None if d is None else slice(0, d)
        return layer_norm(self.act(linear(h, self.dense, cut, cut)), self.norm, d)


class AutoTinyBertModel(AutoTinyBertPreTrainedModel):
    def __init__(self, config: AutoTinyBertConfig, add_pooling_layer: bool | None = None):
        super().__init__(config)
        add_pooling_layer = config.pooler if add_pooling_layer is None else add_pooling_layer
        c = config
        self.embeddings = AutoTinyBertEmbeddings(c)
        self.encoder = _module(layer=nn.ModuleList([AutoTinyBertLayer(c, i) for i in range(c.num_hidden_layers)]))
        if c.relative_attention == "disentangled":
            span = c.relative_buckets if c.relative_buckets > 0 else c.max_relative_positions
            self.encoder.rel_embeddings = nn.Embedding(2 * span, c.hidden_size)
            self.encoder.rel_norm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps) if c.norm_rel_embeddings else None
        self.final_norm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps, bias=c.norm_bias) if c.final_norm else None
        self.pooler = AutoTinyBertPooler(c) if add_pooling_layer else None
        self.post_init()

    def get_input_embeddings(self):
        return self.embeddings.word_embeddings

    def set_input_embeddings(self, value):
        self.embeddings.word_embeddings = value

    def encode(self, input_ids: Tensor | None, attention_mask: Tensor | None = None, token_type_ids: Tensor | None = None,
               sub: Slice | None = None, output_hidden_states: bool = False,
               last_scores: bool = False, inputs_embeds: Tensor | None = None,
               attentions: list | None = None) -> tuple[Tensor, list[Tensor] | None, Tensor | None]:
        """The last hidden state (of the :class:`Slice` ``sub``, or of the whole model), every layer's
        hidden state when asked, and with ``last_scores`` the last layer's content scores (B, h, T, T).
        Each layer's attention weights are appended to ``attentions`` when it is given."""
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("Pass exactly one of input_ids and inputs_embeds.")
        d = None if sub is None else sub.hidden
        x = self.embeddings(input_ids, token_type_ids, d, inputs_embeds=inputs_embeds)
        ctx = Context(self, attention_mask, x, d)
        hidden = [x] if output_hidden_states else None
        kept = range(len(self.encoder.layer)) if sub is None else sub.layers
        windows = self.config.layer_windows or [0] * len(self.encoder.layer)
        scores: list[Tensor] = []
        for n, j in enumerate(kept):
            last = last_scores and n == len(kept) - 1
            x = self.encoder.layer[j](x, ctx, sub, windows[j], scores if last else None, attentions)
            if hidden is not None:
                hidden.append(x)
        x = layer_norm(x, self.final_norm, d)
        if hidden is not None and self.final_norm is not None:
            hidden[-1] = x  # the families' last hidden state is the normed one
        return x, hidden, (scores[0] if scores else None)

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None,
                inputs_embeds=None, output_hidden_states=None, output_attentions=None, return_dict=None,
                **kwargs) -> AutoTinyBertOutput:
        if position_ids is not None:
            raise ValueError("AutoTinyBERT computes its positions (as the family it was cut from); it takes no position_ids.")
        c = self.config
        output_hidden_states = c.output_hidden_states if output_hidden_states is None else output_hidden_states
        output_attentions = c.output_attentions if output_attentions is None else output_attentions
        attentions = [] if output_attentions else None
        x, hidden, _ = self.encode(input_ids, attention_mask, token_type_ids, output_hidden_states=bool(output_hidden_states),
                                   inputs_embeds=inputs_embeds, attentions=attentions)
        out = AutoTinyBertOutput(last_hidden_state=x,
                                 pooler_output=self.pooler(x, attention_mask) if self.pooler is not None else None,
                                 hidden_states=tuple(hidden) if hidden is not None else None,
                                 attentions=tuple(attentions) if attentions is not None else None)
        return out if wants_dict(return_dict, c) else out.to_tuple()


class AutoTinyBertForSequenceClassification(AutoTinyBertPreTrainedModel):
    HEAD_LINEAR = "classifier"  # the head's last linear layer (what a super-net's head is copied into)

    def __init__(self, config: AutoTinyBertConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.bert = AutoTinyBertModel(config)
        dropout = config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None, inputs_embeds=None,
                labels=None, output_hidden_states=None, output_attentions=None, return_dict=None,
                **kwargs) -> AutoTinyBertClassifierOutput:
        out = self.bert(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds,
                        output_hidden_states=output_hidden_states, output_attentions=output_attentions, return_dict=True)
        logits = self.classifier(self.dropout(out.pooler_output))
        # transformers' loss of its own classifiers: the config's problem_type, else by num_labels and labels
        loss = ForSequenceClassificationLoss(labels, logits, self.config) if labels is not None else None
        result = AutoTinyBertClassifierOutput(loss=loss, logits=logits, hidden_states=out.hidden_states,
                                              attentions=out.attentions)
        return result if wants_dict(return_dict, self.config) else result.to_tuple()


class AutoTinyBertForTokenClassification(AutoTinyBertPreTrainedModel):
    """A tag distribution a token: dropout and the classifier on every token's last state (after the prediction
    head the family runs on each, ``token_head``: ModernBERT), as the families' token classifiers."""

    HEAD_LINEAR = "classifier"

    def __init__(self, config: AutoTinyBertConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.bert = AutoTinyBertModel(config, add_pooling_layer=config.token_head)
        dropout = config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None, inputs_embeds=None,
                labels=None, output_hidden_states=None, output_attentions=None, return_dict=None,
                **kwargs) -> AutoTinyBertClassifierOutput:
        out = self.bert(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds,
                        output_hidden_states=output_hidden_states, output_attentions=output_attentions, return_dict=True)
        h = out.last_hidden_state if self.bert.pooler is None else self.bert.pooler.transform(out.last_hidden_state)
        logits = self.classifier(self.dropout(h))
        # transformers' loss of its own token classifiers: cross-entropy, labels -100 ignored
        loss = ForTokenClassification(logits, labels, self.config) if labels is not None else None
        result = AutoTinyBertClassifierOutput(loss=loss, logits=logits, hidden_states=out.hidden_states,
                                              attentions=out.attentions)
        return result if wants_dict(return_dict, self.config) else result.to_tuple()


class AutoTinyBertForQuestionAnswering(AutoTinyBertPreTrainedModel):
    HEAD_LINEAR = "qa_outputs"

    def __init__(self, config: AutoTinyBertConfig):
        super().__init__(config)
        self.bert = AutoTinyBertModel(config, add_pooling_layer=config.token_head)
        self.qa_outputs = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None, inputs_embeds=None,
                start_positions=None, end_positions=None, output_hidden_states=None, output_attentions=None,
                return_dict=None, **kwargs) -> AutoTinyBertQAOutput:
        out = self.bert(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds,
                        output_hidden_states=output_hidden_states, output_attentions=output_attentions, return_dict=True)
        h = out.last_hidden_state if self.bert.pooler is None else self.bert.pooler.transform(out.last_hidden_state)
        start, end = self.qa_outputs(h).split(1, dim=-1)
        start, end = start.squeeze(-1).contiguous(), end.squeeze(-1).contiguous()
        loss = None
        if start_positions is not None and end_positions is not None:
            n = start.size(1)
            loss = (F.cross_entropy(start, start_positions.clamp(0, n), ignore_index=n)
                    + F.cross_entropy(end, end_positions.clamp(0, n), ignore_index=n)) / 2
        result = AutoTinyBertQAOutput(loss=loss, start_logits=start, end_logits=end, hidden_states=out.hidden_states,
                                      attentions=out.attentions)
        return result if wants_dict(return_dict, self.config) else result.to_tuple()


AutoConfig.register("autotinybert", AutoTinyBertConfig, exist_ok=True)
AutoModel.register(AutoTinyBertConfig, AutoTinyBertModel, exist_ok=True)
AutoModelForSequenceClassification.register(AutoTinyBertConfig, AutoTinyBertForSequenceClassification, exist_ok=True)
AutoModelForTokenClassification.register(AutoTinyBertConfig, AutoTinyBertForTokenClassification, exist_ok=True)
AutoModelForQuestionAnswering.register(AutoTinyBertConfig, AutoTinyBertForQuestionAnswering, exist_ok=True)
