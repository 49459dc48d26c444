"""Least-squares refit of the experts' output weights after conversion (our addition to MoEBERT).

Cutting an FFN into experts drops, for every token, the neurons outside its expert: on SST-2 with
MiniLM (1536 → 4 × 384) the converted model falls from 0.885 to 0.811 dev accuracy before any
training, and its last hidden state is 0.24 (MSE) away from the teacher's. The kept neurons'
activations are strongly correlated with the dropped ones, so a linear map of them recovers much
of what was lost. Per layer, with the routing fixed (hash routing is known before training), we
solve for the output side only (b2, the shared block's W2 and every expert's W2):

    min_W  Σ_t ‖φ_t W − y_t‖² + λ ‖W − W_0‖²      φ_t = [1, h_s(a_t), h_e(a_t)]

with h the hidden neurons (``act(W1 a + b1)``, or ``act(in) · gate`` for a GLU; no 1 where the FFN
has no biases), where ``a_t`` is the teacher's FFN input for token t (real tokens of the train sample the importance
scores use), ``y_t`` the dense FFN's output, e the token's expert, and W_0 the converted weights.
φ_t is zero outside the bias, the shared block and the token's own expert, so the normal equations
are assembled block by block from one pass over the sample (a loop over the N experts, each one
matmul), never as the (tokens × (1 + s + N·k)) design matrix. λ = ``ridge`` · mean(diag G) keeps the
system well posed (an expert with no tokens keeps its weights) and the solution near W_0. A
conversion that already reproduces the teacher (N = 1, d_e = d_h) is left exactly as it is.

The input side (W1, b1) is left alone: it is what the importance split chose. Gate routing is
learned during training, so there every token counts for every expert (each expert is fitted to
stand in for the whole FFN).

On by default except for QA, where it lost on SQuAD (``--no-refit`` gives the paper's conversion,
``--refit`` forces it). On SST-2 it takes ~9 s on 2 cores and
lifts the untrained student to 0.866 (last hidden state's MSE 0.24 → 0.06); after the quick
budget's training at lr 2e-4, seven seeds end 0.29 points under the teacher on average, against
0.67 for the paper's conversion at its best rate (the quick budget of ``distillery/moebert/presets.yaml``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor
from tqdm.auto import tqdm

import distillery.distributed as distributed
from distillery.data.encode import model_inputs
from distillery.errors import DistilleryError
from distillery.moebert.convert import dense_ffns


@dataclass
class _Normal:
    """Sufficient statistics of one layer's least-squares problem (float64)."""

    gram: Tensor  # (D, D) Σ φᵀφ, upper blocks only until solve()
    rhs: Tensor  # (D, d) Σ φᵀy
    yy: float = 0.0  # Σ ‖y‖²
    tokens: int = 0


def refit_outputs(student, teacher, loader, *, ridge: float = 1e-2, progress: bool = True) -> list[tuple[float, float]]:
    """Refit every MoE layer's b2 and W2 (shared and per expert) in place; returns, per layer, the
    mean squared error of the FFN output against the dense FFN on the sample, before and after.
    A layer applied several times (ALBERT) gathers the tokens of every call, each routed as that call."""
    if ridge <= 0:
        raise DistilleryError("The refit's ridge must be above zero.")
    layers = student.moe_layers
    ffns = dense_ffns(teacher)
    if len(ffns) != len(layers):
        raise DistilleryError(f"The teacher has {len(ffns)} layers and the student {len(layers)}: refit needs the converted pair.")
    gate = student.config.routing == "gate"
    device = next(student.parameters()).device
    stats = [_normal(layer.experts, device) for layer in layers]
    batch: dict[str, Tensor] = {}
    calls = [0] * len(layers)  # calls of each layer in the current batch's pass: which hash table row routes

    def hook(i):
        def pre_hook(module, args):  # the teacher's FFN input a: (B, T, d)
            real = batch["attention_mask"].bool()
            x = args[0][real]  # (tokens, d)
            w1, w2 = ffns[i]
            ex = layers[i].experts
            y = w2(ex.hidden(F.linear(x, w1.weight, w1.bias)))  # the dense FFN, b2 included (not w1(x): this hooks w1)
            assign = None if gate else layers[i].table(calls[i])[batch["input_ids"][real]]
            calls[i] += 1
            _accumulate(stats[i], ex, x, y, assign)
        return pre_hook

    handles = [w1.register_forward_pre_hook(hook(i)) for i, (w1, _) in enumerate(ffns)]
    was_training = (student.training, teacher.training)
    student.eval(), teacher.eval()
    try:
        with torch.no_grad():
            for b in tqdm(loader, desc="refit", disable=not progress, leave=False):
                batch.clear()
                batch.update(model_inputs(b, teacher))
                calls[:] = [0] * len(layers)
                teacher(**batch)
            for st in stats:  # each process summed its share of the batches (sample_loader)
                totals = torch.tensor([st.yy, st.tokens], dtype=torch.float64, device=device)
                distributed.all_sum_(st.gram, st.rhs, totals)
                st.yy, st.tokens = float(totals[0]), int(totals[1])
            return [_solve(layer.experts, st, ridge) for layer, st in zip(layers, stats)]
    finally:
        for h in handles:
            h.remove()
        student.train(was_training[0]), teacher.train(was_training[1])


def _accumulate(st: _Normal, ex, x: Tensor, y: Tensor, assign: Tensor | None) -> None:
    """Add tokens to one layer's normal equations: ``x`` (tokens, d) their FFN inputs, ``y`` the dense
    FFN's outputs, ``assign`` each token's expert (hash routing), or None for gate routing, where
    every token counts for every expert."""
    ones = [x.new_ones(x.shape[0], 1)] if ex.b2 is not None else []
    shared = [ex.shared_hidden(x)] if ex.shared_w1 is not None else []
    c = torch.cat([*ones, *shared, x.new_zeros(x.shape[0], 0)], dim=1)  # (tokens, 1 + s): what every token has
    (n, k, _), width = ex.w2.shape, c.shape[1]
    copies = n if assign is None else 1  # the gate counts every token once per expert, hashing once in all
    st.gram[:width, :width] += copies * (c.t() @ c).double()
    st.rhs[:width] += copies * (c.t() @ y).double()
    st.yy += copies * float((y.double() ** 2).sum())
    st.tokens += copies * x.shape[0]
    for e in range(n):  # a handful of experts, each one matmul
        rows = slice(None) if assign is None else (assign == e).nonzero().squeeze(1)
        xe, ce, ye = x[rows], c[rows], y[rows]
        he = ex.own_hidden(xe, e)  # (tokens of e, k)
        o = slice(width + e * k, width + (e + 1) * k)
        st.gram[:width, o] += (ce.t() @ he).double()
        st.gram[o, o] += (he.t() @ he).double()
        st.rhs[o] += (he.t() @ ye).double()


def _normal(ex, device) -> _Normal:
    """Empty statistics for one MoE FFN: unknowns b2 (if any), the shared W2, every expert's W2."""
    n, k, d = ex.w2.shape
    common = (1 if ex.b2 is not None else 0) + (ex.shared_w2.shape[0] if ex.shared_w2 is not None else 0)
    size = common + n * k
    return _Normal(torch.zeros(size, size, dtype=torch.float64, device=device),
                   torch.zeros(size, d, dtype=torch.float64, device=device))


def _solve(ex, st: _Normal, ridge: float) -> tuple[float, float]:
    """Solve one layer's ridge system and write b2, shared W2 and W2 back; (MSE before, after)."""
    if st.tokens == 0:
        return 0.0, 0.0
    n, k, d = ex.w2.shape
    parts = (([ex.b2.unsqueeze(0)] if ex.b2 is not None else []) + ([ex.shared_w2] if ex.shared_w1 is not None else [])
             + [ex.w2.reshape(n * k, d)])
    w0 = torch.cat(parts).double()  # (D, d)
    gram = torch.triu(st.gram) + torch.triu(st.gram, 1).t()  # only the upper blocks were accumulated

    def mse(w: Tensor) -> float:
        return float(((w * (gram @ w)).sum() - 2 * (w * st.rhs).sum() + st.yy) / (st.tokens * d))

    lam = ridge * float(gram.diagonal().mean())
    eye = torch.eye(gram.shape[0], dtype=gram.dtype, device=gram.device)
    w = torch.linalg.solve(gram + lam * eye, st.rhs + lam * w0)
    before, after = mse(w0), mse(w)
    w = w.to(ex.w2.dtype)
    if ex.b2 is not None:
        ex.b2.copy_(w[0])
    if ex.shared_w1 is not None:
        start = int(ex.b2 is not None)
        ex.shared_w2.copy_(w[start:start + ex.shared_w2.shape[0]])
    ex.w2.copy_(w[-n * k:].view(n, k, d))
    return before, after
