"""The one-shot super-network: a BERT that runs any α of its search space by slicing its weights.

Every sub-network uses the bottom-left sub-matrices (AutoTinyBERT §3.2) — the first d_m dimensions of
embeddings, LayerNorms and every hidden-side weight, the first d_f FFN neurons, and the attention rows
of :func:`qkv_rows` (first h heads, or the first d_qkv / H dimensions of each head) — of l layers
spread over the depth (:func:`sub_layers`, the ``distill`` baseline's rule: 0, 2, 4 of 6), not the
first l: the top layers carry what the task head reads, and the baseline's shape is then one of the
search space's sub-networks, so the search cannot lose to it except by noise.

:meth:`SuperNet.rewire` (DynaBERT's network rewiring) first orders every layer's FFN neurons and
heads by importance (:mod:`distillery.importance`), so that first-k slices keep the most important
units. A permutation of units is exact: the rewired super-net computes what it did before (a test).
Hidden dimensions are not rewired: the residual stream ties one order across embeddings, every layer
and the head, and the slice of it is a projection that no single permutation makes lossless.
A LayerNorm of a sub-network normalises over its own d_m dimensions. At full size the super-net is
exactly the BERT it was built from (a test), and :meth:`SuperNet.extract` turns α into a standalone
:class:`AutoTinyBertForSequenceClassification` (or QA / encoder) equal to the slice (a test).
"""

from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import BertConfig, BertForQuestionAnswering, BertForSequenceClassification, BertModel, PreTrainedModel

from distillery.autotinybert.modeling_autotinybert import (
    AutoTinyBertConfig,
    AutoTinyBertForQuestionAnswering,
    AutoTinyBertForSequenceClassification,
    AutoTinyBertModel,
    additive_mask,
    attention,
    split_heads,
)
from distillery.autotinybert.space import Arch, SearchSpace
from distillery.baseline import select_layers
from distillery.errors import DistilleryError


def attention_scores(q: Tensor, k: Tensor, heads: int) -> Tensor:
    """Pre-softmax scores q·kᵀ/√d_head per head: (B, T, d_qkv) × 2 -> (B, h, T, T)."""
    return split_heads(q, heads) @ split_heads(k, heads).transpose(-1, -2) / math.sqrt(q.shape[-1] // heads)


def sub_layers(arch_layers: int, num_layers: int) -> list[int]:
    """Indices of the super-net layers a sub-network of ``arch_layers`` layers runs, spread as the
    ``distill`` baseline spreads them (:func:`distillery.baseline.select_layers`)."""
    return select_layers(num_layers, arch_layers)


def head_rows(heads: Tensor, head_size: int, per_head: int | None = None) -> Tensor:
    """Q/K/V rows of the given heads, in their order, the first ``per_head`` (default all) dimensions
    of each: (h,) -> (h · per_head,)."""
    return (heads[:, None] * head_size + torch.arange(per_head or head_size)[None, :]).flatten()


def qkv_rows(arch: Arch, max_heads: int, head_size: int, strategy: str) -> Tensor:
    """Indices of the Q/K/V output rows (and attention-output input columns) α keeps."""
    if strategy == "heads":
        return head_rows(torch.arange(arch.heads), head_size)  # whole heads, the first h of them
    return head_rows(torch.arange(max_heads), head_size, arch.qkv // max_heads)


@torch.no_grad()
def permute_units(layer: nn.Module, neurons: Tensor, heads: Tensor | None, head_size: int) -> None:
    """Reorder one BERT layer's FFN neurons (W1 rows and b1, W2 columns) and attention heads (Q/K/V
    rows of each head block, attention-output columns) in place: the layer's function is unchanged."""
    inter, out = layer.intermediate.dense, layer.output.dense
    inter.weight.copy_(inter.weight[neurons])
    inter.bias.copy_(inter.bias[neurons])
    out.weight.copy_(out.weight[:, neurons])
    if heads is None:
        return
    rows = head_rows(heads, head_size)
    s = layer.attention.self
    for lin in (s.query, s.key, s.value):
        lin.weight.copy_(lin.weight[rows])
        lin.bias.copy_(lin.bias[rows])
    o = layer.attention.output.dense
    o.weight.copy_(o.weight[:, rows])


# What each encoder family lacks for the super-net, which slices BERT's layout (absolute positions from
# 0, embeddings as wide as the hidden size, a pooler + linear head) into a standalone AutoTinyBERT student.
_ROBERTA = ("counts positions from padding_idx + 1 and classifies through a two-layer head without a pooler; "
            "the AutoTinyBERT student has neither")
MISSING = {
    "roberta": f"RoBERTa {_ROBERTA}",
    "xlm-roberta": f"XLM-RoBERTa {_ROBERTA}",
    "camembert": f"CamemBERT {_ROBERTA}",
    "electra": "ELECTRA may project narrower embeddings up to the hidden size and classifies through a two-layer "
               "head without a pooler; the AutoTinyBERT student has neither",
    "distilbert": "DistilBERT names its layers differently (transformer.layer, attention.q_lin, ffn.lin1), has no "
                  "token-type embeddings and classifies through pre_classifier; the super-net slices BERT's modules only",
}


def check_teacher_family(teacher_config) -> None:
    """Refuse, up front and by name, a teacher whose structure the super-net cannot slice."""
    model_type = getattr(teacher_config, "model_type", None)
    if model_type == "bert":
        return
    reason = MISSING.get(model_type, f"a {model_type!r} encoder is not BERT's layout (embeddings, encoder.layer "
                                     f"with attention.self / intermediate / output, pooler)")
    raise DistilleryError(f"autotinybert builds its super-net from a BERT teacher only: {reason}. "
                          f"Use a BERT-architecture teacher, or --method distill / moebert for this one.")


class SuperNet(nn.Module):
    """A BERT (base model plus an optional task head) that runs sub-architectures by slicing."""

    def __init__(self, bert: BertModel, head: nn.Module | None = None, head_kind: str | None = None,
                 strategy: str = "heads", dropout: float | None = None):
        super().__init__()
        if not isinstance(bert, BertModel):
            raise DistilleryError(f"The AutoTinyBERT super-net is built from a BERT model, got {type(bert).__name__}.")
        self.bert = bert
        self.head = head
        self.head_kind = head_kind  # "classification", "qa" or None (encoder only)
        self.config: BertConfig = bert.config
        c = self.config
        self.space = SearchSpace.from_supernet(c.num_hidden_layers, c.hidden_size, c.intermediate_size,
                                               c.num_attention_heads, strategy)
        self.head_size = c.hidden_size // c.num_attention_heads
        self.classifier_dropout = nn.Dropout(dropout if dropout is not None else c.hidden_dropout_prob)

    @classmethod
    def from_teacher(cls, teacher: PreTrainedModel, strategy: str = "heads") -> "SuperNet":
        """A super-net initialised from a (fine-tuned) BERT teacher: a copy of its weights."""
        check_teacher_family(teacher.config)
        teacher = copy.deepcopy(teacher)
        if isinstance(teacher, BertForSequenceClassification):
            return cls(teacher.bert, teacher.classifier, "classification", strategy)
        if isinstance(teacher, BertForQuestionAnswering):
            return cls(teacher.bert, teacher.qa_outputs, "qa", strategy)
        if isinstance(teacher, BertModel):
            return cls(teacher, None, None, strategy)
        raise DistilleryError(f"AutoTinyBERT builds its super-net from BERT models; {type(teacher).__name__} is not one.")

    @torch.no_grad()
    def rewire(self, neuron_scores: Tensor, head_scores: Tensor | None = None) -> dict[str, list[list[int]]]:
        """Order every layer's FFN neurons ((L, D_f) scores) and heads ((L, H) scores), most important
        first; returns the orders applied (original unit index at each new position)."""
        c = self.config
        if tuple(neuron_scores.shape) != (c.num_hidden_layers, c.intermediate_size):
            raise DistilleryError(f"Neuron scores of shape {tuple(neuron_scores.shape)}; the super-net needs "
                                  f"({c.num_hidden_layers}, {c.intermediate_size}).")
        if head_scores is not None and tuple(head_scores.shape) != (c.num_hidden_layers, c.num_attention_heads):
            raise DistilleryError(f"Head scores of shape {tuple(head_scores.shape)}; the super-net needs "
                                  f"({c.num_hidden_layers}, {c.num_attention_heads}).")
        neuron_order = torch.argsort(neuron_scores, dim=1, descending=True, stable=True)
        head_order = None if head_scores is None else torch.argsort(head_scores, dim=1, descending=True, stable=True)
        for i, layer in enumerate(self.bert.encoder.layer):
            permute_units(layer, neuron_order[i], None if head_order is None else head_order[i], self.head_size)
        return {"neurons": neuron_order.tolist(), "heads": None if head_order is None else head_order.tolist()}

    # -- the sliced forward ----------------------------------------------------------------------

    def check(self, arch: Arch) -> None:
        if not self.space.contains(arch):
            raise DistilleryError(f"{arch} is not in the super-net's search space ({self.space.strategy}).")

    def _layer_norm(self, ln: nn.LayerNorm, x: Tensor, d: int) -> Tensor:
        return F.layer_norm(x, (d,), ln.weight[:d], ln.bias[:d], ln.eps)

    def encode(self, input_ids: Tensor, attention_mask: Tensor | None = None, token_type_ids: Tensor | None = None,
               arch: Arch | None = None, output_hidden_states: bool = False,
               last_scores: bool = False) -> tuple[Tensor, list[Tensor] | None]:
        """Last hidden state (B, T, d_m) of sub-network α (default: the full super-net), and the hidden
        states of every layer when asked; with ``last_scores`` the list holds the last layer's
        pre-softmax attention scores (B, h, T, T) instead (what the KD objective compares)."""
        arch = arch or self.space.full()
        d, f = arch.hidden, arch.ffn
        emb = self.bert.embeddings
        seq = input_ids.shape[1]
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        x = (F.embedding(input_ids, emb.word_embeddings.weight[:, :d])
             + emb.position_embeddings.weight[:seq, :d] + F.embedding(token_type_ids, emb.token_type_embeddings.weight[:, :d]))
        x = emb.dropout(self._layer_norm(emb.LayerNorm, x, d))
        mask = additive_mask(attention_mask, x.dtype)
        rows = qkv_rows(arch, self.space.max_heads, self.head_size, self.space.strategy).to(x.device)
        heads = arch.heads
        hidden = [x] if output_hidden_states else None
        scores = None
        kept = sub_layers(arch.layers, self.config.num_hidden_layers)
        for i, layer in enumerate(self.bert.encoder.layer[j] for j in kept):
            s, o = layer.attention.self, layer.attention.output
            q, k, v = (F.linear(x, lin.weight[rows, :d], lin.bias[rows]) for lin in (s.query, s.key, s.value))
            if last_scores and i == arch.layers - 1:
                scores = attention_scores(q, k, heads)
            p = s.dropout.p if self.training else 0.0
            a = attention(q, k, v, heads, mask, p)
            x = self._layer_norm(o.LayerNorm, o.dropout(F.linear(a, o.dense.weight[:d, rows], o.dense.bias[:d])) + x, d)
            inter, out = layer.intermediate, layer.output
            h = inter.intermediate_act_fn(F.linear(x, inter.dense.weight[:f, :d], inter.dense.bias[:f]))
            x = self._layer_norm(out.LayerNorm, out.dropout(F.linear(h, out.dense.weight[:d, :f], out.dense.bias[:d])) + x, d)
            if hidden is not None:
                hidden.append(x)
        return x, ([scores] if last_scores else hidden)

    @property
    def task_kind(self) -> str | None:
        """The task kind of the head (what its predictions are distilled as), None without a head."""
        if self.head_kind == "classification":
            return "regression" if self.head.out_features == 1 else "classification"
        return self.head_kind

    def head_outputs(self, x: Tensor, d: int) -> dict[str, Tensor]:
        """The task head on a last hidden state of width ``d``: ``logits`` (pooler + linear) or
        ``start_logits``/``end_logits``; empty without a head."""
        if self.head_kind == "classification":
            pool = self.bert.pooler.dense
            pooled = torch.tanh(F.linear(x[:, 0], pool.weight[:d, :d], pool.bias[:d]))
            return {"logits": F.linear(self.classifier_dropout(pooled), self.head.weight[:, :d], self.head.bias)}
        if self.head_kind == "qa":
            start, end = F.linear(x, self.head.weight[:, :d], self.head.bias).split(1, dim=-1)
            return {"start_logits": start.squeeze(-1), "end_logits": end.squeeze(-1)}
        return {}

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, token_type_ids: Tensor | None = None,
                arch: Arch | None = None, output_hidden_states: bool = False, sub_networks: list[Arch] | None = None,
                **kwargs) -> dict[str, Tensor]:
        """Outputs of sub-network α: ``logits`` (classification), ``start_logits``/``end_logits`` (QA),
        ``last_hidden_state`` always, ``hidden_states`` when asked.

        With ``sub_networks``, instead ``{"sub_networks": [outputs, ...]}``, each sub-network's
        ``last_hidden_state``, last-layer pre-softmax ``scores`` and head outputs, in order: the one-shot
        step's M sub-networks in one call, so that under DDP the step is one forward of the wrapped model
        (DDP syncs gradients through its forward, once per backward)."""
        if sub_networks is not None:
            outs = []
            for a in sub_networks:
                x, (scores,) = self.encode(input_ids, attention_mask, token_type_ids, a, last_scores=True)
                outs.append({"last_hidden_state": x, "scores": scores, **self.head_outputs(x, a.hidden)})
            return {"sub_networks": outs}
        arch = arch or self.space.full()
        x, hidden = self.encode(input_ids, attention_mask, token_type_ids, arch, output_hidden_states)
        out: dict[str, Tensor] = {"last_hidden_state": x}
        if hidden is not None:
            out["hidden_states"] = tuple(hidden)
        return {**out, **self.head_outputs(x, arch.hidden)}

    # -- extraction ------------------------------------------------------------------------------

    def extract_config(self, arch: Arch) -> AutoTinyBertConfig:
        c = self.config.to_dict()
        for key in ("model_type", "architectures", "transformers_version", "_name_or_path", "dtype", "torch_dtype"):
            c.pop(key, None)
        c.update(num_hidden_layers=arch.layers, hidden_size=arch.hidden, intermediate_size=arch.ffn,
                 num_attention_heads=arch.heads, qkv_size=arch.qkv)
        return AutoTinyBertConfig(**c)

    @torch.no_grad()
    def extract(self, arch: Arch) -> PreTrainedModel:
        """α as a standalone dense model with copies of the sliced weights (what ships)."""
        self.check(arch)
        config = self.extract_config(arch)
        model_cls = {"classification": AutoTinyBertForSequenceClassification, "qa": AutoTinyBertForQuestionAnswering}
        model = model_cls.get(self.head_kind, AutoTinyBertModel)(config)
        base = model if isinstance(model, AutoTinyBertModel) else model.bert
        d, f = arch.hidden, arch.ffn
        rows = qkv_rows(arch, self.space.max_heads, self.head_size, self.space.strategy)
        src_emb, dst_emb = self.bert.embeddings, base.embeddings
        for name in ("word_embeddings", "position_embeddings", "token_type_embeddings"):
            getattr(dst_emb, name).weight.copy_(getattr(src_emb, name).weight[:, :d])
        _copy_ln(dst_emb.LayerNorm, src_emb.LayerNorm, d)
        kept = sub_layers(arch.layers, self.config.num_hidden_layers)
        for src, dst in zip((self.bert.encoder.layer[j] for j in kept), base.encoder.layer):
            for name in ("query", "key", "value"):
                _copy_linear(getattr(dst.attention.self, name), getattr(src.attention.self, name), rows, slice(0, d))
            _copy_linear(dst.attention.output.dense, src.attention.output.dense, slice(0, d), rows)
            _copy_ln(dst.attention.output.LayerNorm, src.attention.output.LayerNorm, d)
            _copy_linear(dst.intermediate.dense, src.intermediate.dense, slice(0, f), slice(0, d))
            _copy_linear(dst.output.dense, src.output.dense, slice(0, d), slice(0, f))
            _copy_ln(dst.output.LayerNorm, src.output.LayerNorm, d)
        if base.pooler is not None and self.bert.pooler is not None:
            _copy_linear(base.pooler.dense, self.bert.pooler.dense, slice(0, d), slice(0, d))
        if self.head_kind == "classification":
            _copy_linear(model.classifier, self.head, slice(None), slice(0, d))
        elif self.head_kind == "qa":
            _copy_linear(model.qa_outputs, self.head, slice(None), slice(0, d))
        return model.eval()


def _copy_linear(dst: nn.Linear, src: nn.Linear, out_index, in_index) -> None:
    dst.weight.copy_(src.weight[out_index][:, in_index])
    dst.bias.copy_(src.bias[out_index])


def _copy_ln(dst: nn.LayerNorm, src: nn.LayerNorm, d: int) -> None:
    dst.weight.copy_(src.weight[:d])
    dst.bias.copy_(src.bias[:d])
