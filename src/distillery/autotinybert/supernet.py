"""The one-shot super-network: a full-size AutoTinyBERT model of the teacher's family (cut from the
teacher by :mod:`distillery.autotinybert.convert`, so any encoder family distillery knows) that runs any α of
its search space by slicing its weights, through the same forward as the extracted model.

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
exactly the teacher it was built from (a test per family), and :meth:`SuperNet.extract` turns α into a
standalone AutoTinyBERT model of the head's Auto class (:class:`AutoTinyBertForSequenceClassification`, token
classification, QA, or the encoder) equal to the slice (a test). The head is the task kind's
(:mod:`distillery.kinds`): a kind whose head reads one pooled state runs the pooler, the others read every token.
With rotary positions (ModernBERT) a head keeping d of its dimensions keeps the first d / 2 of each
half, the pairs rotated together, at their own frequencies; a relative bias table (MPNet) loses the
columns of the heads a sub-network drops; DeBERTa's relative embeddings are projected by the same sliced
rows as the content keys and queries.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import PreTrainedModel

from distillery.autotinybert.convert import convert_teacher
from distillery.autotinybert.modeling_autotinybert import AutoTinyBertConfig, AutoTinyBertModel, Slice, split_heads
from distillery.autotinybert.space import Arch, SearchSpace
from distillery.distill.recipe import select_layers
from distillery.errors import DistilleryError
from distillery.kinds import TaskKind, kind_of
from distillery.modeling import Head


def attention_scores(q: Tensor, k: Tensor, heads: int) -> Tensor:
    """Pre-softmax content scores q·kᵀ/√d_head per head: (B, T, d_qkv) × 2 -> (B, h, T, T)."""
    return split_heads(q, heads) @ split_heads(k, heads).transpose(-1, -2) / math.sqrt(q.shape[-1] // heads)


def sub_layers(arch_layers: int, num_layers: int) -> list[int]:
    """Indices of the super-net layers a sub-network of ``arch_layers`` layers runs, spread as the
    ``distill`` baseline spreads them (:func:`distillery.distill.recipe.select_layers`)."""
    return select_layers(num_layers, arch_layers)


def head_rows(heads: Tensor, head_size: int, per_head: int | None = None, rotary: bool = False) -> Tensor:
    """Q/K/V rows of the given heads, in their order, the first ``per_head`` (default all) dimensions
    of each: (h,) -> (h · per_head,). With ``rotary`` a head's kept dimensions are the first per_head / 2
    of each half, the pairs that rotary positions rotate together (i and i + head_size / 2)."""
    per_head = per_head or head_size
    dims = torch.arange(per_head)
    if rotary and per_head < head_size:
        dims = torch.cat((torch.arange(per_head // 2), head_size // 2 + torch.arange(per_head // 2)))
    return (heads[:, None] * head_size + dims[None, :]).flatten()


def qkv_rows(arch: Arch, max_heads: int, head_size: int, strategy: str, rotary: bool = False) -> Tensor:
    """Indices of the Q/K/V output rows (and attention-output input columns) α keeps."""
    if strategy == "heads":
        return head_rows(torch.arange(arch.heads), head_size)  # whole heads, the first h of them
    return head_rows(torch.arange(max_heads), head_size, arch.qkv // max_heads, rotary)


@torch.no_grad()
def permute_units(layer: nn.Module, neurons: Tensor, heads: Tensor | None, head_size: int) -> None:
    """Reorder one AutoTinyBERT layer's FFN neurons (W1 and gate rows, W2 columns) and attention heads
    (Q/K/V rows of each head block, attention-output columns, a relative bias's columns) in place: the
    layer's function is unchanged."""
    for lin in (layer.intermediate.dense, getattr(layer.intermediate, "gate", None)):
        if lin is not None:
            _permute_rows(lin, neurons)
    out = layer.output.dense
    out.weight.copy_(out.weight[:, neurons])
    if heads is None:
        return
    rows = head_rows(heads, head_size)
    s = layer.attention.self
    for lin in (s.query, s.key, s.value, getattr(s, "pos_key", None), getattr(s, "pos_query", None)):
        if lin is not None:
            _permute_rows(lin, rows)
    o = layer.attention.output.dense
    o.weight.copy_(o.weight[:, rows])
    if hasattr(s, "relative_bias"):
        s.relative_bias.weight.copy_(s.relative_bias.weight[:, heads])


def _permute_rows(lin: nn.Linear, rows: Tensor) -> None:
    lin.weight.copy_(lin.weight[rows])
    if lin.bias is not None:
        lin.bias.copy_(lin.bias[rows])


class SuperNet(nn.Module):
    """A full-size AutoTinyBERT model of the teacher's family (base model plus an optional task head) that
    runs sub-architectures by slicing its weights."""

    def __init__(self, bert: AutoTinyBertModel, head: nn.Module | None = None, kind: TaskKind | str | None = None,
                 strategy: str = "heads", dropout: float | None = None):
        super().__init__()
        if not isinstance(bert, AutoTinyBertModel):  # a super-net folder saved as a BertModel
            bert = convert_teacher(bert)[0]
        self.bert = bert
        self.head = head
        # the task kind the head predicts for (its object, or its name); None: an encoder only
        self.kind: TaskKind | None = None if kind is None or head is None else kind_of(kind)
        self.config: AutoTinyBertConfig = bert.config
        c = self.config
        self.space = SearchSpace.from_supernet(c.num_hidden_layers, c.hidden_size, c.intermediate_size,
                                               c.num_attention_heads, strategy, qkv_size=c.qkv_size)
        self.head_size = c.qkv_size // c.num_attention_heads
        self.classifier_dropout = nn.Dropout(dropout if dropout is not None else c.hidden_dropout_prob)

    @classmethod
    def from_teacher(cls, teacher: PreTrainedModel, strategy: str = "heads") -> "SuperNet":
        """A super-net initialised from a (fine-tuned) teacher of any family distillery knows: a copy of its weights."""
        bert, head, kind = convert_teacher(teacher)
        return cls(bert, head, kind, strategy)

    @torch.no_grad()
    def rewire(self, neuron_scores: Tensor, head_scores: Tensor | None = None) -> dict[str, list[list[int]]]:
        """Order every layer's FFN neurons ((L, D_f) scores) and heads ((L, H) scores), most important
        first; returns the orders applied (original unit index at each new position). Scores of one row
        (a teacher with one shared layer, untied here) order every layer alike."""
        c = self.config
        neuron_scores = neuron_scores.expand(c.num_hidden_layers, -1) if len(neuron_scores) == 1 else neuron_scores
        if head_scores is not None and len(head_scores) == 1:
            head_scores = head_scores.expand(c.num_hidden_layers, -1)
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

    def slice(self, arch: Arch, device=None) -> Slice:
        """What sub-network α takes of the super-net's weights."""
        rows = qkv_rows(arch, self.space.max_heads, self.head_size, self.space.strategy,
                        rotary=self.config.relative_attention == "rotary")
        return Slice(arch.hidden, arch.ffn, rows.to(device), arch.heads, sub_layers(arch.layers, self.config.num_hidden_layers))

    def encode(self, input_ids: Tensor, attention_mask: Tensor | None = None, token_type_ids: Tensor | None = None,
               arch: Arch | None = None, output_hidden_states: bool = False,
               last_scores: bool = False) -> tuple[Tensor, list[Tensor] | None]:
        """Last hidden state (B, T, d_m) of sub-network α (default: the full super-net), and the hidden
        states of every layer when asked; with ``last_scores`` the list holds the last layer's
        pre-softmax content scores (B, h, T, T) instead (what the KD objective compares)."""
        sub = self.slice(arch or self.space.full(), input_ids.device)
        x, hidden, scores = self.bert.encode(input_ids, attention_mask, token_type_ids, sub, output_hidden_states, last_scores)
        return x, ([scores] if last_scores else hidden)

    @property
    def task_head(self) -> Head | None:
        """The Hugging Face head the super-net's head is (None: an encoder only)."""
        return None if self.kind is None else self.kind.head

    def head_outputs(self, x: Tensor, d: int, attention_mask: Tensor | None = None) -> dict[str, Tensor]:
        """The task head on a last hidden state of width ``d``, as the extracted model's head computes it: the
        head's output fields (``logits``: of the pooled state, or of every token; ``start_logits`` and
        ``end_logits``: one column each); empty without a head."""
        if self.kind is None:
            return {}
        if self.kind.pooled_output:
            states = self.bert.pooler(x, attention_mask, d)
        else:  # every token, through the prediction head the family runs on each (ModernBERT) where it has one
            states = x if self.bert.pooler is None else self.bert.pooler.transform(x, d)
        fields = self.kind.head.outputs
        if len(fields) == 1:  # a classifier's head: dropout before its linear layer (a span head has none)
            states = self.classifier_dropout(states)
        out = F.linear(states, self.head.weight[:, :d], self.head.bias)
        if len(fields) == 1:
            return {fields[0]: out}
        return {name: column.squeeze(-1) for name, column in zip(fields, out.split(1, dim=-1), strict=True)}

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, token_type_ids: Tensor | None = None,
                arch: Arch | None = None, output_hidden_states: bool = False, sub_networks: list[Arch] | None = None,
                **kwargs) -> dict[str, Tensor]:
        """Outputs of sub-network α: the head's (``logits``; ``start_logits``/``end_logits`` for QA),
        ``last_hidden_state`` always, ``hidden_states`` when asked.

        With ``sub_networks``, instead ``{"sub_networks": [outputs, ...]}``, each sub-network's
        ``last_hidden_state``, last-layer pre-softmax ``scores`` and head outputs, in order: the one-shot
        step's M sub-networks in one call, so that under DDP the step is one forward of the wrapped model
        (DDP syncs gradients through its forward, once per backward)."""
        if sub_networks is not None:
            outs = []
            for a in sub_networks:
                x, (scores,) = self.encode(input_ids, attention_mask, token_type_ids, a, last_scores=True)
                outs.append({"last_hidden_state": x, "scores": scores, **self.head_outputs(x, a.hidden, attention_mask)})
            return {"sub_networks": outs}
        arch = arch or self.space.full()
        x, hidden = self.encode(input_ids, attention_mask, token_type_ids, arch, output_hidden_states)
        out: dict[str, Tensor] = {"last_hidden_state": x}
        if hidden is not None:
            out["hidden_states"] = tuple(hidden)
        return {**out, **self.head_outputs(x, arch.hidden, attention_mask)}

    # -- extraction ------------------------------------------------------------------------------

    def extract_config(self, arch: Arch) -> AutoTinyBertConfig:
        c = self.config.to_dict()
        for key in ("model_type", "architectures", "transformers_version", "_name_or_path", "dtype", "torch_dtype"):
            c.pop(key, None)
        kept = sub_layers(arch.layers, self.config.num_hidden_layers)
        windows = self.config.layer_windows
        c.update(num_hidden_layers=arch.layers, hidden_size=arch.hidden, intermediate_size=arch.ffn,
                 num_attention_heads=arch.heads, qkv_size=arch.qkv,
                 layer_windows=None if windows is None else [windows[j] for j in kept])
        if self.head is not None:
            c["num_labels"] = self.head.out_features
        return AutoTinyBertConfig(**c)

    @torch.no_grad()
    def extract(self, arch: Arch) -> PreTrainedModel:
        """α as a standalone dense model with copies of the sliced weights (what ships)."""
        self.check(arch)
        config = self.extract_config(arch)
        # the AutoTinyBERT class of the head's Auto class (registered with it by modeling_autotinybert)
        model_cls = AutoTinyBertModel if self.kind is None else self.kind.head.auto_class._model_mapping[AutoTinyBertConfig]
        model = model_cls(config)  # a bare encoder with a pooler only where the super-net has one (config.pooler)
        base = model if isinstance(model, AutoTinyBertModel) else model.bert
        sub = self.slice(arch)
        source = self.bert.state_dict()
        for name, dst in base.state_dict().items():
            dst.copy_(sliced_weight(name, source, dst.shape, sub))
        if self.kind is not None:
            head = getattr(model, model_cls.HEAD_LINEAR)
            head.weight.copy_(self.head.weight[:, : arch.hidden])
            head.bias.copy_(self.head.bias)
        return model.eval()


# Weights whose Q/K/V-side dimension takes the sub-network's rows (every other dimension of every weight
# takes its first entries: d_m, d_f, heads of a bias table; rewiring put the kept units first).
_ROWS_OUT = (".attention.self.query.", ".attention.self.key.", ".attention.self.value.",
             ".attention.self.pos_key.", ".attention.self.pos_query.")
_ROWS_IN = ".attention.output.dense.weight"


def sliced_weight(name: str, source: dict[str, Tensor], shape: torch.Size, sub: Slice) -> Tensor:
    """The super-net's tensor behind the extracted model's ``name``, sliced to ``shape``: layer i of the
    sub-network is super-net layer ``sub.layers[i]``."""
    parts = name.split(".")
    if name.startswith("encoder.layer."):
        parts[2] = str(sub.layers[int(parts[2])])
    t = source[".".join(parts)]
    dotted = "." + name
    for dim, size in enumerate(shape):
        if (dim == 0 and any(r in dotted for r in _ROWS_OUT)) or (dim == 1 and dotted.endswith(_ROWS_IN)):
            t = t.index_select(dim, sub.rows.to(t.device))
        else:
            t = t.narrow(dim, 0, size)
    return t
