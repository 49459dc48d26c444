"""AutoTinyBERT's search space: one architecture α = (l, d_m, d_f, h, d_qkv) shared by every layer.

Two ways to shrink multi-head attention (the paper's Fig. 3):

- ``heads``: keep each head's size (the super-net's d_qkv / H) and take the first h heads; d_qkv
  follows as h · head size.
- ``head-dims``: keep all H heads and take the first d_qkv / H dimensions of each head, so head
  boundaries are preserved (the paper's code re-splits the heads instead, which is wrong for a
  super-net initialised from a pretrained model).
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, replace

from distillery.autotinybert.options import STRATEGIES


@dataclass(frozen=True)
class Arch:
    """α: layers l, hidden d_m, FFN d_f, heads h, attention width d_qkv."""

    layers: int
    hidden: int
    ffn: int
    heads: int
    qkv: int

    def as_dict(self) -> dict[str, int]:
        return asdict(self)

    def __str__(self) -> str:
        return f"l={self.layers} d_m={self.hidden} d_f={self.ffn} h={self.heads} d_qkv={self.qkv}"


@dataclass(frozen=True)
class SearchSpace:
    """Ranges (inclusive) and steps of each dimension, and the attention strategy.

    ``head_size`` is the super-net's per-head width (d_qkv / H of the full model)."""

    layers: tuple[int, int, int]
    hidden: tuple[int, int, int]
    ffn: tuple[int, int, int]
    heads: tuple[int, int, int]
    head_size: int
    max_heads: int
    strategy: str = "heads"
    qkv_step: int | None = None  # head-dims: d_qkv steps (a multiple of H); default H · 4

    def __post_init__(self):
        if self.strategy not in STRATEGIES:
            raise ValueError(f"Unknown attention strategy {self.strategy!r}; choose one of {', '.join(STRATEGIES)}.")
        for name in ("layers", "hidden", "ffn", "heads"):
            lo, hi, step = getattr(self, name)
            if not (1 <= lo <= hi and step >= 1):
                raise ValueError(f"The {name} range {lo}..{hi} step {step} is empty or invalid.")

    @classmethod
    def from_supernet(cls, num_layers: int, hidden: int, ffn: int, heads: int, strategy: str = "heads",
                      hidden_step: int | None = None, ffn_step: int | None = None,
                      qkv_size: int | None = None) -> "SearchSpace":
        """The default space of a super-net: 1..L layers, d_m from 2 steps up to d, d_f from one step up
        to D_f, 1..H heads (``heads``) or d_qkv in steps of 4·H (``head-dims``). Steps default to 32 (d_m)
        and 64 (d_f), or an eighth of the size for a small super-net. ``qkv_size``: the attention width
        (default the hidden size)."""
        hidden_step = hidden_step or min(32, max(1, hidden // 8))
        ffn_step = ffn_step or min(64, max(1, ffn // 8))
        return cls(layers=(1, num_layers, 1), hidden=(min(2 * hidden_step, hidden), hidden, hidden_step),
                   ffn=(min(ffn_step, ffn), ffn, ffn_step), heads=(1, heads, 1), head_size=(qkv_size or hidden) // heads,
                   max_heads=heads, strategy=strategy, qkv_step=4 * heads)

    def at_full_width(self) -> "SearchSpace":
        """The sub-space whose architectures all keep the super-net's hidden size d_m (every other
        dimension searched over its whole range): what the search explores unless ``search_hidden`` is set."""
        hidden = self.hidden[1]
        return replace(self, hidden=(hidden, hidden, self.hidden[2]))

    # -- values ----------------------------------------------------------------------------------

    @staticmethod
    def _values(lo: int, hi: int, step: int) -> list[int]:
        values = list(range(lo, hi + 1, step))
        return values if values[-1] == hi else values + [hi]  # the full size is always reachable

    def choices(self) -> dict[str, list[int]]:
        """Every allowed value per dimension; d_qkv's depend on the strategy."""
        out = {name: self._values(*getattr(self, name)) for name in ("layers", "hidden", "ffn")}
        if self.strategy == "heads":
            out["heads"] = self._values(*self.heads)
            out["qkv"] = []  # follows the heads
        else:
            step = self.qkv_step or 4 * self.max_heads
            out["heads"] = [self.max_heads]
            out["qkv"] = self._values(step, self.max_heads * self.head_size, step)
        return out

    def full(self) -> Arch:
        c = self.choices()
        heads = c["heads"][-1]
        return Arch(c["layers"][-1], c["hidden"][-1], c["ffn"][-1], heads,
                    heads * self.head_size if self.strategy == "heads" else c["qkv"][-1])

    def smallest(self) -> Arch:
        """The smallest sub-network (the sandwich rule's lower bound)."""
        c = self.choices()
        heads = c["heads"][0]
        return Arch(c["layers"][0], c["hidden"][0], c["ffn"][0], heads,
                    heads * self.head_size if self.strategy == "heads" else c["qkv"][0])

    def contains(self, arch: Arch) -> bool:
        c = self.choices()
        ok = arch.layers in c["layers"] and arch.hidden in c["hidden"] and arch.ffn in c["ffn"] and arch.heads in c["heads"]
        if self.strategy == "heads":
            return ok and arch.qkv == arch.heads * self.head_size
        return ok and arch.qkv in c["qkv"]

    def sample(self, rng: random.Random) -> Arch:
        """A uniformly random architecture (each dimension independently)."""
        c = self.choices()
        heads = rng.choice(c["heads"])
        qkv = heads * self.head_size if self.strategy == "heads" else rng.choice(c["qkv"])
        return Arch(rng.choice(c["layers"]), rng.choice(c["hidden"]), rng.choice(c["ffn"]), heads, qkv)

    def sample_distinct(self, k: int, rng: random.Random) -> list[Arch]:
        """Up to ``k`` different architectures, in draw order (a small space may hold fewer)."""
        archs: dict[Arch, None] = {}
        for _ in range(100 * k):
            archs[self.sample(rng)] = None
            if len(archs) == k:
                break
        return list(archs)

    def mutate(self, arch: Arch, p: float, rng: random.Random) -> Arch:
        """Each dimension re-drawn with probability ``p`` (Algorithm 2's mutation)."""
        c = self.choices()
        draw = lambda name, value: rng.choice(c[name]) if rng.random() < p else value
        layers, hidden, ffn = draw("layers", arch.layers), draw("hidden", arch.hidden), draw("ffn", arch.ffn)
        heads = draw("heads", arch.heads)
        if self.strategy == "heads":
            qkv = heads * self.head_size
        else:
            qkv = draw("qkv", arch.qkv)
        return Arch(layers, hidden, ffn, heads, qkv)
