"""Test oracles: the slow, obvious references the fast code is checked against.

They exist only for tests (and for benchmarks/moebert.py, which times ``reference_importance``
against the hook-based pass), so they live here and not in the package. Each one is written the
plain way on purpose: one example, one token or one matrix at a time, so that it is easy to read
and hard to get wrong.
"""

from __future__ import annotations

import torch
from torch import Tensor

from distillery.training.losses import task_loss
from distillery.data.encode import model_inputs
from distillery.importance import _targets, attention_blocks, dense_ffns


def reference_importance(model, dataset, collate_fn, kind: str) -> Tensor:
    """MoEBERT's Eq. 4 the obvious way: one example at a time, ``torch.autograd.grad`` of its loss
    with respect to W1 and W2, ``|Σ w ⊙ ∇w|`` per neuron, summed over examples."""
    ffns = dense_ffns(model)
    weights = [w for pair in ffns for w in (pair[0].weight, pair[1].weight)]
    device = weights[0].device
    scores = torch.zeros(len(ffns), ffns[0][1].in_features, dtype=torch.float64)
    was_training = model.training
    model.eval()
    try:
        for n in range(len(dataset)):
            batch = collate_fn([dataset[n]])
            out = model(**model_inputs(batch, model))
            loss = task_loss(kind, out, _targets(batch, device), reduction="none").sum()
            grads = torch.autograd.grad(loss, weights)
            for i, (w1, w2) in enumerate(ffns):
                g1, g2 = grads[2 * i], grads[2 * i + 1]
                in_term, d_h = (w1.weight * g1).sum(1), w2.weight.shape[1]
                if in_term.numel() == 2 * d_h:  # a GLU's W1: neuron j has input row j and gate row d_h + j
                    in_term = in_term[:d_h] + in_term[d_h:]
                term = in_term + (w2.weight * g2).sum(0)  # (d_h,)
                scores[i] += term.detach().abs().double().cpu()
    finally:
        model.train(was_training)
    return scores.float()


def reference_head_importance(model, dataset, collate_fn, kind: str) -> Tensor:
    """Michel et al.'s head importance the obvious way: an explicit mask ξ = 1 multiplies each
    head's context vectors, and ``torch.autograd.grad`` of each example's loss gives |∂L/∂ξ_h|."""
    attns = attention_blocks(model)
    n_heads = model.config.num_attention_heads
    masks = [torch.ones(n_heads, requires_grad=True) for _ in attns]

    def masking(mask):
        def pre_hook(module, args):
            c = args[0]
            return ((c.unflatten(-1, (n_heads, -1)) * mask[:, None]).flatten(-2),) + args[1:]
        return pre_hook

    handles = [out.register_forward_pre_hook(masking(m)) for (_, out), m in zip(attns, masks)]
    scores = torch.zeros(len(attns), n_heads, dtype=torch.float64)
    was_training = model.training
    model.eval()
    try:
        for n in range(len(dataset)):
            batch = collate_fn([dataset[n]])
            out = model(**model_inputs(batch, model))
            loss = task_loss(kind, out, _targets(batch, "cpu"), reduction="none").sum()
            scores += torch.stack(torch.autograd.grad(loss, masks)).abs().double()
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
    return scores.float()


def moe_ffn_reference(ffn, x: Tensor, token_expert: Tensor) -> Tensor:
    """A MoEBERT FFN (``MoEFeedForward``) the obvious way: a Python loop over tokens, each through
    its expert's own neurons plus the shared block. x: (B, T, d), token_expert: (B, T) -> (B, T, d)."""
    flat, experts = x.reshape(-1, x.shape[-1]), token_expert.reshape(-1)
    rows = []
    for t in range(flat.shape[0]):
        y = ffn.expert(flat[t:t + 1], int(experts[t]))[0]
        if ffn.shared_w1 is not None:
            y = y + ffn.act(flat[t] @ ffn.shared_w1 + ffn.shared_b1) @ ffn.shared_w2
        rows.append(y)
    return torch.stack(rows).view_as(x)


def sequential_product(x: Tensor) -> Tensor:
    """CMOW's sequence product the obvious way: a Python loop of matmuls over dim 1.
    (B, T, d, d) -> (B, d, d)."""
    out = torch.eye(x.shape[-1], dtype=x.dtype, device=x.device).expand_as(x[:, 0]).clone()
    for t in range(x.shape[1]):
        out = out @ x[:, t]
    return out
