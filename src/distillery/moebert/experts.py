"""The expert FFN of MoEBERT and the dispatch of tokens to experts.

:class:`MoEFeedForward`: ``N`` experts of ``d_e`` neurons each (a GLU's input and gate rows kept
together), the first ``s`` shared (one tied block, or cloned into every expert); :class:`SentenceGate`:
the paper's sentence-level top-1 router.

Dispatch never loops over tokens or experts: the slots of an (N, capacity, d) buffer gather their
tokens (one gather), all experts run as one batched matmul pair with b2 folded in, and
each token's row, read back, receives the shared block's last matmul in place
(:func:`plan_dispatch` plans every layer call at once; on 2 cores at 1×128 this is ~3 % faster
than scattering into a zeroed buffer and adding). It does not run a per-expert loop over sorted rows: on a CPU
at 1×128 that loop's many small operations cost more than the padded slots (benchmarks/base_moebert.py times
both). A sentence gate at batch size 1 runs the chosen expert on the whole sequence without any gather. While exporting to ONNX the
capacity is the token count (no data-dependent shapes in the graph): correct, but N× the routed work;
so is it under ``torch.compile``, which then compiles the forward pass as one graph.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers.activations import ACT2FN


@dataclass
class DispatchPlan:
    """Where each token goes, for one layer.

    The experts run on an (N, capacity, d) buffer of slots: expert e owns ``slots[e]``.
    ``source[e, r]`` is the token that slot (e, r) reads its input from (a slot no token fills reads
    some other token: its output row is computed and never read, so it costs its share of the matmul
    and no gradient). ``slot[t]`` is the row of the flattened (N · capacity, d) output that token t
    reads. Padding tokens take no slot: they read a row that ``valid`` (M, 1) zeroes; ``valid`` is
    None when every token is real, and the multiply is skipped.
    """

    slot: Tensor  # (M,) long
    source: Tensor  # (N, capacity) long
    capacity: int  # (a symbolic size while exporting)
    load: Tensor  # (N,) real tokens per expert
    valid: Tensor | None = None  # (M, 1) 1.0 for real tokens, 0.0 for padding


def plan_dispatch(expert: Tensor, num_experts: int, valid: Tensor | None = None) -> list[DispatchPlan]:
    """Dispatch plans for token->expert assignments ``expert`` of shape (L, M): one per row, each with
    the capacity of its own busiest expert. ``valid`` (M,) marks real tokens (default: all).

    All rows are planned together in a dozen tensor ops and one host sync (the capacities), so hash
    routing plans every layer before the first one runs. Each op costs several microseconds in the
    middle of a forward pass (its code and data are cold after the matmuls), which is why this is
    written for few ops rather than for the fewest FLOPs. Each row keeps its own capacity (a view of
    one shared slot buffer) because the padded slots are real matmul rows: at 1×128 tokens on MPNet-base
    one capacity for every layer (the busiest expert of any layer) cost ~2 % of the forward pass.
    """
    n_rows, m = expert.shape
    # no host sync in a graph (exported, or compiled: torch.compile's fullgraph): every expert gets room for all tokens
    exporting = torch.compiler.is_exporting() or torch.compiler.is_compiling()
    padded = valid is not None and (exporting or not bool(valid.all()))
    key = expert.masked_fill(valid == 0, num_experts) if padded else expert  # padding: an expert of its own
    # (L, M, N[+1]): running count per expert (a comparison, not F.one_hot, which first checks the range)
    count = (key.unsqueeze(2) == torch.arange(num_experts + int(padded), device=key.device)).cumsum(1)
    load = count[:, -1, :num_experts]  # (L, N)
    rank = count.gather(2, key.unsqueeze(2)).squeeze(2) - 1  # (L, M): place among its expert's tokens
    if exporting:  # one symbolic capacity, the token count
        cap, caps = m, [m] * n_rows
    else:
        cap = load.amax(1, keepdim=True).clamp_min(1)  # (L, 1)
        caps = cap.squeeze(1).tolist()
    row = key * cap + rank  # (L, M) row of the row's flattened slot buffer; padding lands at n · cap or past it
    if padded:  # padding: the spare column past the row's slots (cap: a number, or a tensor per row)
        row = row.clamp_max(num_experts * cap)
    tokens = torch.arange(m, device=expert.device).expand(n_rows, m)
    source = expert.new_zeros(n_rows, num_experts * max(caps) + 1).scatter_(1, row, tokens)
    slot = row.clamp_max(num_experts * cap - 1) if padded else row  # padding reads a real row; valid zeroes it
    multiplier = valid.to(torch.get_default_dtype()).unsqueeze(1) if padded else None
    return [DispatchPlan(slot=s, source=src[:num_experts * c].view(num_experts, c), capacity=c, load=n, valid=multiplier)
            for s, src, n, c in zip(slot.unbind(0), source.unbind(0), load.unbind(0), caps)]


def _linear(x: Tensor, w: Tensor, b: Tensor | None) -> Tensor:
    """x @ w (+ b), one call: ``addmm`` / ``baddbmm`` by rank."""
    if x.dim() == 2:
        return torch.mm(x, w) if b is None else torch.addmm(b, x, w)
    return torch.bmm(x, w) if b is None else torch.baddbmm(b, x, w)


class MoEFeedForward(nn.Module):
    """``y = W2_e · h + b2`` with ``h = act(W1_e · a + b1_e)`` (GLU: ``act(in) · gate``), e the
    token's expert, plus the shared block.

    Weights are stacked per expert and stored input-major (``w1: (N, d, k)`` or ``(N, d, 2k)`` for
    a GLU, input columns then gate columns; ``w2: (N, k, d)``) so that every expert pass is a plain
    ``x @ w``. ``bias`` False (ModernBERT's FFN has none): no b1, b2, shared b1. ``dropout``: on the
    hidden neurons, where the family's FFN had it (ModernBERT's ``mlp_dropout``)."""

    def __init__(self, hidden_size: int, num_experts: int, own: int, shared: int, activation: str,
                 glu: bool = False, bias: bool = True, dropout: float = 0.0, std: float = 0.02):
        super().__init__()
        d, n, width = hidden_size, num_experts, 2 if glu else 1
        self.num_experts, self.glu, self.dropout = n, glu, float(dropout)
        # BERT's exact GELU as the function itself: HF's activation module adds a module call to each of
        # the two uses per layer, measurable at batch 1 (~0.09 ms of a 14.7 ms forward); same numerics.
        self.act = F.gelu if activation == "gelu" else ACT2FN[activation]
        self.w1 = nn.Parameter(torch.empty(n, d, width * own).normal_(0.0, std))  # (N, d, k)
        self.w2 = nn.Parameter(torch.empty(n, own, d).normal_(0.0, std))  # (N, k, d)
        self.b1 = nn.Parameter(torch.zeros(n, width * own)) if bias else None
        self.b2 = nn.Parameter(torch.zeros(d)) if bias else None
        if shared:
            self.shared_w1 = nn.Parameter(torch.empty(d, width * shared).normal_(0.0, std))
            self.shared_b1 = nn.Parameter(torch.zeros(width * shared)) if bias else None
            self.shared_w2 = nn.Parameter(torch.empty(shared, d).normal_(0.0, std))
        else:
            self.shared_w1 = self.shared_b1 = self.shared_w2 = None

    def hidden(self, z: Tensor) -> Tensor:
        """The hidden neurons from their pre-activations: act(z), or act(in) · gate for a GLU."""
        if self.glu:
            z, gate = z.chunk(2, dim=-1)
            h = self.act(z) * gate
        else:
            h = self.act(z)
        return F.dropout(h, self.dropout, True) if self.dropout and self.training else h

    def own_hidden(self, x: Tensor, e: int) -> Tensor:
        """Expert e's own hidden neurons on rows x: (M, d) -> (M, k)."""
        return self.hidden(_linear(x, self.w1[e], None if self.b1 is None else self.b1[e]))

    def shared_hidden(self, x: Tensor) -> Tensor:
        """The shared block's hidden neurons on rows x: (M, d) -> (M, s)."""
        return self.hidden(_linear(x, self.shared_w1, self.shared_b1))

    def expert(self, x: Tensor, e: int) -> Tensor:
        """Expert e's own neurons on rows x, with b2: (M, d) -> (M, d)."""
        return _linear(self.own_hidden(x, e), self.w2[e], self.b2)

    def forward(self, x: Tensor, plan: DispatchPlan | None = None, sentence_expert: Tensor | None = None,
                scale: Tensor | None = None) -> Tensor:
        """x: (B, T, d). Tokens go to experts by ``plan`` (token-level: hash routing, or a gate's
        choice expanded to tokens); a single sentence with ``sentence_expert`` runs that expert on
        all its tokens. ``scale`` (B,) multiplies each sentence's FFN output (the gate probability)."""
        bsz, seq, d = x.shape
        flat = x.reshape(-1, d)  # (B·T, d)
        if plan is None:
            out = self.expert(flat, int(sentence_expert[0]))  # the whole sentence, no gather
        else:
            out = self._dispatch(flat, plan)
        if self.shared_w1 is not None:  # added in place onto the routed rows (b2 included): no copy of them
            h = self.shared_hidden(flat)
            out = out.addmm_(h, self.shared_w2.to(h.dtype))  # autocast skips in-place ops: match h's dtype
        out = out.view(bsz, seq, d)
        if scale is not None:
            out = out * scale.to(out.dtype)[:, None, None]
        return out

    def _dispatch(self, flat: Tensor, plan: DispatchPlan) -> Tensor:
        """Each token through its expert (b2 included) as one batched matmul pair: the slots of an
        (N, capacity, d) buffer gather their tokens, the N experts run as two batched matmuls, and each
        token reads its row back. Slots no token fills cost only their share of the matmuls
        (capacity: the token count of the layer's busiest expert)."""
        slots = F.embedding(plan.source, flat)  # (N, cap, d)
        rows = F.embedding(plan.slot, self.experts_batched(slots).flatten(0, 1))  # (M, d)
        return rows if plan.valid is None else rows * plan.valid.to(rows.dtype)

    def experts_batched(self, slots: Tensor) -> Tensor:
        """Expert e's own neurons on row e of ``slots`` (N, cap, d), b2 included: two batched matmuls."""
        h = self.hidden(_linear(slots, self.w1, None if self.b1 is None else self.b1.unsqueeze(1)))  # (N, cap, k)
        return _linear(h, self.w2, self.b2)


class SentenceGate(nn.Module):
    """Sentence-level top-1 router: masked mean of the layer input → linear → softmax."""

    def __init__(self, hidden_size: int, num_experts: int, straight_through: bool = False):
        super().__init__()
        self.num_experts = num_experts
        self.straight_through = straight_through  # gate_scale "straight-through": p / stop_grad(p), else p
        self.linear = nn.Linear(hidden_size, num_experts)

    def forward(self, x: Tensor, mask: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """x: (B, T, d), mask: (B, T) -> expert (B,), scale (B,), balance loss (scalar)."""
        m = mask.to(x.dtype).unsqueeze(-1)  # (B, T, 1)
        mean = (x * m).sum(1) / m.sum(1).clamp_min(1.0)  # (B, d)
        probs = F.softmax(self.linear(mean), dim=-1)  # (B, N)
        p, expert = probs.max(dim=-1)  # (B,), (B,)
        scale = p / p.detach() if self.straight_through else p
        # Switch Transformer: N · Σ_i (fraction of sentences routed to i) · (mean probability of i).
        fraction = torch.bincount(expert, minlength=self.num_experts).to(probs.dtype) / expert.numel()
        balance = self.num_experts * (fraction * probs.mean(0)).sum()
        return expert, scale, balance
