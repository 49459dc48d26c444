"""Method prune's cheap mode (``--option mode=cheap``): retraining-free pruning (Kwon et al. 2022) under the same
latency model, for a user with minutes rather than hours.

No masks' phase. The teacher's attention heads and FFN neurons are scored by the empirical Fisher information of
their masks on training examples (:func:`distillery.importance.unit_importance` with ``fisher``: Σ_x (∂L(x)/∂m)²,
from one forward and backward pass a batch); each unit's score is divided by what removing it saves, the latency
model's price of one head or one neuron at the full width (Kwon et al. look the same up in a latency table), and
the units are kept in the order of that ratio until the latency model puts the shape at the target: the log α of
:class:`distillery.prune.masks.Masks` are set to the log of the ratio (sharpened, so that the deterministic gates
keep exactly the units above a threshold) and the same :func:`distillery.prune.masks.calibrated_gates` as the full
mode finds the threshold. A sub-layer goes when no unit of it is kept; the hidden dimension is kept. The pruned
model is then distilled as the full mode's is (its fine-tuning), briefly.

The full mode starts from this selection (:func:`cheap_start`): its masks' phase refines it rather than finding
one from gates drawn at random.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from distillery.importance import unit_importance
from distillery.method_context import MethodContext
from distillery.prune.latency import LatencyModel
from distillery.prune.masks import Masks, calibrated_gates, start_at

SHARPNESS = 8.0  # log α per unit of log(score / cost): a gate's P(z ≠ 0) goes 0 → 1 over a tenth of e in the ratio
KEPT = 100.0  # the sub-layers' log α: kept whatever the shift, removed only when none of their units is


def unit_costs(latency: LatencyModel) -> tuple[float, float]:
    """The ratio to the teacher's latency that one head and one FFN neuron cost at the full hidden width."""
    c = latency.coefficients.double()
    return float(c[2] + c[3]), float(c[5])


def priority(score: Tensor, cost: float) -> Tensor:
    """log(score / cost): the log α order of the units (a zero score or cost made tiny, not infinite)."""
    return torch.log(score.double().clamp_min(1e-30)) - torch.log(torch.tensor(max(cost, 1e-12), dtype=torch.float64))


def scored_rows(ctx: MethodContext):
    """The rows the Fisher scores read: the train split, or where the task's own is empty (an embedder learns from the
    texts given only) the student's training texts with the teacher's vectors, the targets of the kind's importance
    loss (``TaskKind.importance_loss``: an in-batch contrastive loss, the distance to the teacher's own vectors having
    no gradient on the teacher); labelled once and cached, so that the fine-tuning reads the same rows again."""
    return ctx.task_data.train if len(ctx.task_data.train) else ctx.distillation_train(True)


def head_floor(heads: Tensor, min_heads: int) -> Tensor:
    """The ``min_heads`` highest-scored heads of each layer (a boolean of ``heads``' shape, layers × heads)."""
    floor = torch.zeros_like(heads, dtype=torch.bool)
    if min_heads > 0:
        floor.scatter_(-1, heads.topk(min(min_heads, heads.shape[-1]), dim=-1).indices, True)
    return floor


def fisher_masks(ctx: MethodContext, examples: int, full: nn.Module, latency: LatencyModel,
                 min_heads: int = 0) -> Masks:
    """Masks whose log α rank the teacher's heads and neurons by Fisher information per latency saved; each layer's
    ``min_heads`` best heads kept as its sub-layers are (removed only where nothing else reaches the target)."""
    kind = ctx.task_data.task.kind_object
    neurons, heads = unit_importance(ctx.teacher, scored_rows(ctx), ctx.task_data.collate, kind,
                                     max_examples=int(examples), seed=ctx.config.student.seed, heads=True, fisher=True)
    c = full.config
    masks = Masks(c.num_hidden_layers, c.num_attention_heads, c.intermediate_size, c.hidden_size, prune_hidden=False)
    head_cost, neuron_cost = unit_costs(latency)
    order = {"heads": priority(heads, head_cost), "neurons": priority(neurons, neuron_cost)}
    middle = torch.cat([o.flatten() for o in order.values()]).median()
    order["heads"] = torch.where(head_floor(order["heads"], min_heads),
                                 middle + KEPT / SHARPNESS, order["heads"])
    with torch.no_grad():
        for name, o in order.items():
            getattr(masks, name).copy_(((o - middle) * SHARPNESS).flatten().float() / masks.lr_scale)
        for name in ("attention", "ffn"):
            getattr(masks, name).fill_(KEPT / masks.lr_scale)
    return masks


def cheap_start(ctx: MethodContext, examples: int, full: nn.Module, latency: LatencyModel, target: float,
                masks: Masks, margin: float, min_heads: int = 0) -> dict[str, Tensor]:
    """``masks`` (the full mode's) set to start at the cheap mode's selection at ``target`` (a ratio to the teacher's
    latency), the Fisher order per latency saved kept within it (:func:`distillery.prune.masks.start_at`);
    the selection's gates."""
    cheap = fisher_masks(ctx, examples, full, latency, min_heads)
    gates, shift = calibrated_gates(cheap, latency, target)
    with torch.no_grad():
        order = {name: cheap.log_alpha(name) + shift for name in ("heads", "neurons")}
    start_at(masks, gates, order, margin)
    return gates
