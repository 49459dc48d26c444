"""CoFi's hard-concrete masks (Louizos et al. 2018; Xia et al. 2022 §3) on a full-size pruned-student model.

Five kinds of mask, each unit's gate z = min(1, max(0, sigmoid((log u − log(1 − u) + log α) / β)·(r − l) + l)),
u ~ U(0, 1) while training: attention heads (L, H), FFN neurons (L, d_f), the hidden dimension (d_m), and whole
attention and FFN sub-layers (L each). A head's effective gate is z_head · z_attention, a neuron's z_neuron · z_ffn.
P(z ≠ 0) = sigmoid(log α − β log(−l / r)) gives the expected architecture, which the latency model prices
(:mod:`distillery.prune.latency`). At the end the masks are made deterministic as CoFi does: of each group, the
round(Σ P(z ≠ 0)) units of the largest log α are kept (z = 1), the others removed (z = 0), and then
:mod:`distillery.prune.extract` removes them.

The log α are stored divided by ``LR_SCALE``: the one trainer gives every parameter one learning rate (the
student's, ~5e-5), and CoFi trains the masks and the Lagrange multipliers at 0.01 — Adam's step is about the
learning rate whatever the gradient's scale, so a parameter read times 200 moves 200 times as fast.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
from torch import Tensor, nn

from distillery.prune.modeling_prune import LayerMasks, ModelMasks

BETA, LOW, HIGH = 2.0 / 3.0, -0.1, 1.1
LR_SCALE = 200.0
GROUPS = ("heads", "neurons", "hidden", "attention", "ffn")
TIE = 0.01  # start_at: the least log α between a kept and a removed unit of equal order


def keep_probability(log_alpha: Tensor) -> Tensor:
    """P(z ≠ 0) of each gate: 1 − Q(0), the hard-concrete's mass above zero."""
    return torch.sigmoid(log_alpha - BETA * math.log(-LOW / HIGH))


def sample_gates(log_alpha: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """A training draw of the gates (reparametrised: differentiable in log α)."""
    eps = 1e-6
    u = torch.rand(log_alpha.shape, generator=generator, device=log_alpha.device).clamp(eps, 1 - eps)
    s = torch.sigmoid((torch.log(u) - torch.log1p(-u) + log_alpha) / BETA)
    return (s * (HIGH - LOW) + LOW).clamp(0.0, 1.0)


def deterministic_gates(log_alpha: Tensor) -> Tensor:
    """0/1 gates of each row: its round(Σ P(z ≠ 0)) units of the largest log α kept (CoFi's deterministic z)."""
    rows = log_alpha.reshape(-1, log_alpha.shape[-1]) if log_alpha.dim() else log_alpha.reshape(1, 1)
    kept = keep_probability(rows).sum(-1).round().long()
    order = torch.argsort(rows, dim=-1, descending=True, stable=True)
    rank = torch.empty_like(order)
    rank.scatter_(-1, order, torch.arange(rows.shape[-1], device=rows.device).expand_as(order))
    return (rank < kept[:, None]).to(log_alpha.dtype).reshape(log_alpha.shape)


class Masks(nn.Module):
    """The log α of every gate of a model of ``layers`` layers, ``heads`` heads, ``ffn`` neurons and ``hidden``
    dimensions (flat 1-D parameters: the trainer's weight decay skips them). ``init``: the starting log α
    (CoFi's: a drop rate of 0.5, log α = 0, P(z ≠ 0) ≈ 0.83: a quick budget's few hundred steps can still close them)."""

    def __init__(self, layers: int, heads: int, ffn: int, hidden: int, init: float = 0.0, prune_hidden: bool = True,
                 lr_scale: float = LR_SCALE):
        super().__init__()
        self.lr_scale = lr_scale
        self.shapes = {"heads": (layers, heads), "neurons": (layers, ffn), "hidden": (hidden,),
                       "attention": (layers,), "ffn": (layers,)}
        self.prune_hidden = prune_hidden
        self.register_buffer("step", torch.zeros((), dtype=torch.long))  # loss calls so far (the target's ramp)
        for name, shape in self.shapes.items():
            if name != "hidden" or prune_hidden:
                self.register_parameter(name, nn.Parameter(torch.full((math.prod(shape),), init / lr_scale)))

    def log_alpha(self, name: str) -> Tensor:
        return getattr(self, name).view(self.shapes[name]) * self.lr_scale

    def names(self) -> list[str]:
        return [n for n in GROUPS if n != "hidden" or self.prune_hidden]

    def gates(self, mode: str, generator: torch.Generator | None = None) -> dict[str, Tensor]:
        """Each group's gates: ``sample`` (training), ``expected`` (P(z ≠ 0)) or ``deterministic`` (0/1)."""
        fn = {"sample": lambda a: sample_gates(a, generator), "expected": keep_probability,
              "deterministic": deterministic_gates}[mode]
        return {name: fn(self.log_alpha(name)) for name in self.names()}

    def expected_shape(self) -> dict[str, Tensor]:
        """The expected architecture: heads and neurons a layer (their P(z ≠ 0) summed, times the sub-layer's),
        the hidden width, and each sub-layer's probability of staying."""
        p = self.gates("expected")
        return shape_of(p, self.shapes["hidden"][0])

    def final_shape(self) -> dict[str, Tensor]:
        return shape_of(fold(self.gates("deterministic")), self.shapes["hidden"][0])


def calibrated_gates(masks: Masks, price: Callable[[dict[str, Tensor]], Tensor], target: float,
                     iterations: int = 60) -> tuple[dict[str, Tensor], float]:
    """The deterministic gates (folded) of every log α shifted by one δ, the largest δ whose shape ``price`` (the
    latency model) puts at most at ``target``; and δ. The masks' phase ends near the target, not on it (the
    Lagrangian oscillates about it, and a short phase may not reach it): one shift, found by bisection, lands the
    removal on the target while keeping the masks' order of the units (δ ≈ 0 when the phase reached it)."""
    hidden = masks.shapes["hidden"][0]

    def gates_at(delta: float) -> dict[str, Tensor]:
        return fold({name: deterministic_gates(masks.log_alpha(name) + delta) for name in masks.names()})

    def fits(delta: float) -> bool:
        return float(price(shape_of(gates_at(delta), hidden))) <= target

    with torch.no_grad():
        bound = 10.0 + max(float(masks.log_alpha(name).abs().max()) for name in masks.names())  # all kept / none
        low, high = -bound, bound
        if fits(high):
            return gates_at(high), high
        if not fits(low):
            return gates_at(low), low
        for _ in range(iterations):
            mid = (low + high) / 2
            low, high = (mid, high) if fits(mid) else (low, mid)
        return gates_at(low), low


def start_at(masks: Masks, gates: dict[str, Tensor], order: dict[str, Tensor], margin: float,
             iterations: int = 60) -> Masks:
    """``masks`` set to start at the 0/1 selection ``gates`` (a group missing from it: all kept), its deterministic
    gates equal to them. Each row's log α: ``order`` (a group missing from it: the selection alone) less the row's
    threshold between its kept and its removed units, kept units clipped to (0, ``margin``], removed ones to
    [−``margin``, 0), then one shift a row that makes its Σ P(z ≠ 0) its count of kept units: CoFi's deterministic
    gates keep round(Σ P) units of the largest log α, and a row of 300 kept and 1,236 removed neurons at ±margin
    alone would count 300 + 1,236 · P(−margin). Units far from the threshold start well inside on or off (a kept
    one at margin 6 is drawn whole in 99 % of the draws), those near it in between: the masks' phase refines the
    selection instead of drawing every gate at random."""
    with torch.no_grad():
        for name in masks.names():
            shape = masks.shapes[name]
            kept = (gates[name] > 0 if name in gates else torch.ones(shape, dtype=torch.bool)).reshape(-1, shape[-1])
            x = order[name].double().reshape(kept.shape) if name in order else (kept.double() * 2 - 1) * margin
            low = torch.where(kept, x, math.inf).amin(-1, keepdim=True)
            high = torch.where(kept, -math.inf, x).amax(-1, keepdim=True)
            middle = torch.where(~kept.any(-1, keepdim=True), high, torch.where(kept.all(-1, keepdim=True), low,
                                                                                 (low + high) / 2))
            y = torch.where(kept, (x - middle).clamp(TIE, margin), (x - middle).clamp(-margin, -TIE))
            n, count = kept.shape[-1], kept.sum(-1, keepdim=True).double()
            whole = min(0.25, n * float(1 - keep_probability(torch.tensor(margin, dtype=torch.float64))))
            none = min(0.25, n * float(keep_probability(torch.tensor(-margin, dtype=torch.float64))))
            count = torch.where(count == n, n - whole, torch.where(count == 0, torch.full_like(count, none), count))
            lo, hi = torch.full_like(count, -4 * margin - 40), torch.full_like(count, 4 * margin + 40)
            for _ in range(iterations):  # the row's shift: Σ P grows with it
                mid = (lo + hi) / 2
                under = keep_probability(y + mid).sum(-1, keepdim=True) < count
                lo, hi = torch.where(under, mid, lo), torch.where(under, hi, mid)
            getattr(masks, name).copy_(((y + (lo + hi) / 2) / masks.lr_scale).float().flatten())
    return masks


def fold(gates: dict[str, Tensor]) -> dict[str, Tensor]:
    """Deterministic gates made consistent: a sub-layer with no unit left is removed, a removed one keeps no unit."""
    g = dict(gates)
    g["attention"] = g["attention"] * (g["heads"].sum(-1) > 0)
    g["ffn"] = g["ffn"] * (g["neurons"].sum(-1) > 0)
    g["heads"] = g["heads"] * g["attention"][:, None]
    g["neurons"] = g["neurons"] * g["ffn"][:, None]
    return g


def shape_of(g: dict[str, Tensor], hidden: int) -> dict[str, Tensor]:
    """Heads (L,), neurons (L,), hidden width and sub-layer presence (L,) of gates or their expectations."""
    return {"heads": g["heads"].sum(-1) * g["attention"], "neurons": g["neurons"].sum(-1) * g["ffn"],
            "hidden": g["hidden"].sum() if "hidden" in g else torch.tensor(float(hidden)),
            "attention": g["attention"], "ffn": g["ffn"]}


def model_masks(gates: dict[str, Tensor]) -> ModelMasks:
    """The gates as the masks the pruned-student model reads in its forward."""
    layers = [LayerMasks(heads=gates["heads"][i], neurons=gates["neurons"][i], attention=gates["attention"][i],
                         ffn=gates["ffn"][i]) for i in range(len(gates["attention"]))]
    return ModelMasks(hidden=gates.get("hidden"), layers=layers)


class MaskedModel(nn.Module):
    """A full-size pruned-student task model and its :class:`Masks`: each forward in training draws the gates,
    in eval uses the deterministic ones; called as the task model is (its outputs)."""

    def __init__(self, model: nn.Module, masks: Masks):
        super().__init__()
        self.model, self.masks = model, masks
        self.last_gates: dict[str, Tensor] | None = None

    @property
    def config(self):
        return self.model.config

    def forward(self, **inputs):
        gates = self.masks.gates("sample" if self.training else "deterministic")
        gates = gates if self.training else fold(gates)
        self.last_gates = gates
        base = self.model.base_model  # the task model's ``bert``, or the model itself where it has no head (an embedder)
        base.masks = model_masks(gates)
        try:
            return self.model(**inputs)
        finally:
            base.masks = None
