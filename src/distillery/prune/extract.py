"""A teacher as a full-size pruned-student model (AutoTinyBERT's conversion, any family it converts), and the
removal of what the deterministic masks drop: a smaller dense :class:`PrunedBert*` model with each layer's heads
and FFN neurons, and the hidden dimensions, that the masks keep — computing what the masked model computes.

Every weight of the smaller model is its source tensor with, along each axis that shrank, the kept indices of the
unit that axis counts: the Q/K/V rows (and attention-output columns) of the kept heads, a relative-bias table's
kept head columns, the kept FFN neurons (intermediate rows, output columns), and the kept hidden dimensions
everywhere else (embeddings, norms, every hidden-side weight, pooler, head).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from transformers import PreTrainedModel

from distillery.autotinybert.convert import convert_teacher
from distillery.errors import DistilleryError
from distillery.kinds import TaskKind
from distillery.prune.modeling_prune import PrunedBertConfig, PrunedBertModel

_HEAD_ROWS = (".attention.self.query.", ".attention.self.key.", ".attention.self.value.",
              ".attention.self.pos_key.", ".attention.self.pos_query.")


def model_class(kind: TaskKind | None):
    """The pruned-student class of a task kind's head (the base model without a head)."""
    return PrunedBertModel if kind is None else kind.head.auto_class._model_mapping[PrunedBertConfig]


def _base(model: nn.Module) -> PrunedBertModel:
    return model if isinstance(model, PrunedBertModel) else model.bert


def full_size(teacher: PreTrainedModel) -> tuple[PreTrainedModel, TaskKind | None]:
    """The teacher as a full-size pruned-student task model computing what it computes, and its head's kind."""
    bert, head, kind = convert_teacher(teacher)
    config = PrunedBertConfig(**{k: v for k, v in bert.config.to_dict().items()
                                 if k not in ("model_type", "architectures", "transformers_version", "dtype", "torch_dtype")})
    if head is not None:
        config.num_labels = head.out_features
        config.problem_type = teacher.config.problem_type
    model = model_class(kind)(config)  # a bare encoder with a pooler only where the teacher's has one (config.pooler)
    with torch.no_grad():
        missing = _base(model).load_state_dict(bert.state_dict(), strict=False)
        assert not missing.unexpected_keys and not missing.missing_keys, missing
        if head is not None:
            getattr(model, type(model).HEAD_LINEAR).load_state_dict(head.state_dict())
    return model.eval(), kind


def kept_units(gates: dict[str, Tensor], hidden: int) -> dict:
    """Indices kept: ``heads`` and ``neurons`` a layer, ``hidden`` (all when the hidden dimension is not pruned)."""
    keep = lambda row: torch.nonzero(row > 0).flatten().cpu()  # noqa: E731
    # a layer left with neither sub-layer is an identity: dropped (its weights would hold nothing)
    layers = [i for i in range(len(gates["heads"])) if gates["heads"][i].sum() > 0 or gates["neurons"][i].sum() > 0]
    if not layers:
        raise DistilleryError("The masks removed every layer of the teacher; ask for a smaller --speedup.")
    return {"layers": layers, "heads": [keep(gates["heads"][i]) for i in layers],
            "neurons": [keep(gates["neurons"][i]) for i in layers],
            "hidden": keep(gates["hidden"]) if "hidden" in gates else torch.arange(hidden)}


def pruned_config(config: PrunedBertConfig, kept: dict) -> PrunedBertConfig:
    c = config.to_dict()
    for key in ("model_type", "architectures", "transformers_version", "_name_or_path", "dtype", "torch_dtype"):
        c.pop(key, None)
    windows = c.get("layer_windows")
    c.update(num_hidden_layers=len(kept["layers"]), layer_windows=None if windows is None else [windows[i] for i in kept["layers"]],
             hidden_size=len(kept["hidden"]), layer_heads=[len(h) for h in kept["heads"]],
             layer_intermediate_sizes=[len(n) for n in kept["neurons"]])
    return PrunedBertConfig(**c)


def _index(name: str, dim: int, kept: dict, head_size: int) -> Tensor:
    """The kept indices along axis ``dim`` of weight ``name`` (one that shrank)."""
    dotted = "." + name
    layer = int(name.split(".")[2]) if name.startswith("encoder.layer.") else None
    heads = None if layer is None else kept["heads"][layer]
    if layer is not None and ((dim == 0 and any(r in dotted for r in _HEAD_ROWS))
                              or (dim == 1 and dotted.endswith(".attention.output.dense.weight"))):
        return (heads[:, None] * head_size + torch.arange(head_size)[None, :]).flatten()
    if layer is not None and dim == 1 and "relative_bias" in dotted:
        return heads
    if layer is not None and ((dim == 0 and ".intermediate." in dotted)
                              or (dim == 1 and dotted.endswith(".output.dense.weight") and ".attention." not in dotted)):
        return kept["neurons"][layer]
    return kept["hidden"]


@torch.no_grad()
def extract(model: PreTrainedModel, gates: dict[str, Tensor]) -> PreTrainedModel:
    """The smaller dense model of a full-size pruned-student ``model`` under 0/1 ``gates`` (:func:`masks.fold`-ed)."""
    base = _base(model)
    kept = kept_units(gates, base.config.hidden_size)
    config = pruned_config(model.config, kept)
    small = type(model)(config)
    source = base.state_dict()
    for name, dst in _base(small).state_dict().items():
        parts = name.split(".")
        if name.startswith("encoder.layer."):  # layer i of the smaller model is kept layer kept["layers"][i]
            parts[2] = str(kept["layers"][int(parts[2])])
        t = source[".".join(parts)]
        for dim, size in enumerate(dst.shape):
            if t.shape[dim] != size:
                t = t.index_select(dim, _index(name, dim, kept, base.config.head_size).to(t.device))
        dst.copy_(t)
    if small is not _base(small):
        src, dst = getattr(model, type(model).HEAD_LINEAR), getattr(small, type(small).HEAD_LINEAR)
        dst.weight.copy_(src.weight.index_select(1, kept["hidden"].to(src.weight.device)))
        dst.bias.copy_(src.bias)
    return small.eval()
