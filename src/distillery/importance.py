"""Importance of every FFN neuron (MoEBERT Eq. 4) and attention head, from one forward and one
backward pass per batch. MoEBERT cuts experts by the neuron scores; AutoTinyBERT rewires its
super-network by both, so that first-k slices keep the most important units.

    I_j = Σ_(x,y) | w1_jᵀ ∇_{w1_j} L(x,y) + w2_jᵀ ∇_{w2_j} L(x,y) |

with ``w1_j`` the j-th column of W1 (row j of ``intermediate.dense.weight``) and ``w2_j`` the j-th
row of W2 (column j of ``output.dense.weight``). The absolute value is taken per example.

Why no per-example gradients are needed: with ``z = W1 a + b1`` the pre-activation and ``h = act(z)``
the FFN hidden layer, summed over the tokens t of one example,

    w1_jᵀ ∇_{w1_j} L = Σ_t (∂L/∂z_tj) · (z_tj − b1_j)      w2_jᵀ ∇_{w2_j} L = Σ_t (∂L/∂h_tj) · h_tj

and examples in a batch do not interact (eval mode: no dropout, no batch statistics), so the
gradients of the *summed* batch loss with respect to z and h are exactly each example's own. Hooks
capture z, h and their gradients; each example's terms are summed over its tokens, added, and
their absolute value accumulated.

A GLU FFN (ModernBERT: ``h = act(z_in) · z_gate`` with ``z = W1 a + b1`` stacking the input rows
over the gate rows, neuron j being rows j and d_h + j) has three weight vectors per neuron: its
input row u_j, its gate row g_j and w2_j. The first-order change of the loss when all three go to
zero is the sum of the three products, each read from the gradient at its own pre-activation:

    u_jᵀ ∇_{u_j} L = Σ_t (∂L/∂z_in,tj) (z_in,tj − b_in,j)     with ∂L/∂z_in = ∂L/∂h · act'(z_in) · z_gate
    g_jᵀ ∇_{g_j} L = Σ_t (∂L/∂z_gate,tj) (z_gate,tj − b_gate,j)  with ∂L/∂z_gate = ∂L/∂h · act(z_in)

so the hook on W1's output (both halves at once) gives a (B, 2·d_h) term whose halves are added
(without gate bias the gate term equals the W2 term: ∂L/∂h · act(z_in) · z_gate = ∂L/∂h · h).

A weight used more than once in a pass (ALBERT's one layer, applied ``num_hidden_layers`` times)
has as gradient the sum over its uses, so each example's terms are summed over the calls before
the absolute value is taken (Eq. 4 for a shared weight), and such a model gets one row of scores.

Layers, FFN projections and GLU layout come from :mod:`distillery.encoders`, for every family.

``b1_j`` is not included, as in Eq. 4: the score is the first-order change of the loss when the
neuron's weights w1_j and w2_j go to zero. (Including b1 would add Σ_t ∂L/∂z_tj · b1_j; the paper's
scores, and ours, leave it out.)

Head importance (Michel et al., 2019, "Are Sixteen Heads Really Better than One?"): with a mask
ξ_h = 1 multiplying head h's context vectors c_th (the input of the attention-output dense layer),

    I_h = Σ_(x,y) | ∂L(x,y)/∂ξ_h | = Σ_(x,y) | Σ_t (∂L/∂c_th) · c_th |

read in the same pass from the gradient of that input; the value biases (weights, without biases) of every
layer then require grad, so that autograd records the first layer's attention too.

The scores come from the task's **train** split (or a seeded sample of it), never from dev: the
paper's code scores on dev, which leaks the evaluation set into the conversion.
"""

from __future__ import annotations

import contextlib
import logging

import numpy as np
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader
from tqdm.auto import tqdm

import distillery.distributed as distributed
from distillery.data.encode import ROW_FLAGS, TARGETS, example_lengths, length_batches, model_inputs
from distillery.encoders import encoder_layers, ffn_linears, ffn_width, layout_of, submodule
from distillery.errors import DistilleryError
from distillery.kinds import TaskKind, kind_of

logger = logging.getLogger("distillery")


def dense_ffns(teacher) -> list[tuple[nn.Linear, nn.Linear]]:
    """(W1, W2) of every layer of the family's layer list (:func:`distillery.encoders.ffn_linears`;
    a GLU's W1 stacks the input rows over the gate rows)."""
    layout = layout_of(teacher.config)
    try:
        return [ffn_linears(layout, layer) for layer in encoder_layers(teacher)]
    except AttributeError:
        raise DistilleryError(f"{type(teacher).__name__} has no dense FFN where the {layout.family} layout puts it "
                              f"({layout.ffn_in} / {layout.ffn_out}).") from None


def attention_blocks(teacher) -> list[tuple[nn.Linear, nn.Linear]]:
    """(value projection, attention-output projection) of every layer, read through the family's layout
    (:mod:`distillery.encoders`); the value projection is the fused [q; k; v] one where the family fuses
    them (ModernBERT). The heads sit side by side in the output projection's input columns."""
    layout = layout_of(teacher.config, type(teacher).__name__)
    return [(submodule(layer, layout.value or layout.qkv), submodule(layer, layout.attention_out))
            for layer in encoder_layers(teacher)]


def _targets(batch, device):
    """What a kind's importance loss reads of a batch besides the outputs: the targets, the row flags (an embedder's
    pooling) and the attention mask (an embedder's mean leaves the padding out)."""
    return {k: batch[k].to(device) for k in (*TARGETS, *ROW_FLAGS, "attention_mask") if k in batch}


def sample_loader(dataset, collate_fn, batch_size: int, max_examples: int | None, seed: int) -> DataLoader:
    """Batches of a seeded sample of ``max_examples`` examples (all when None), of similar lengths
    (:func:`~distillery.data.encode.length_batches`, at most ``batch_size`` each): the conversion's
    passes treat examples independently, so grouping lengths only saves padding. The importance
    scores and the output refit (:mod:`distillery.moebert.refit`) read the same sample.

    Under a launcher of several processes each process gets its share of the batches
    (:func:`distillery.distributed.shard`); the passes add their sums up over the processes."""
    indices = np.arange(len(dataset))
    if max_examples is not None and max_examples < len(dataset):
        indices = np.random.default_rng(seed).choice(len(dataset), size=max_examples, replace=False)
    subset = torch.utils.data.Subset(dataset, indices.tolist())
    lengths = example_lengths(dataset)
    if lengths is None:
        batches = [list(range(i, min(i + batch_size, len(indices)))) for i in range(0, len(indices), batch_size)]
    else:
        batches = length_batches(lengths.numpy()[indices], batch_size)
    return DataLoader(subset, batch_sampler=distributed.shard(batches), collate_fn=collate_fn)


def _needs_grad(module, args):  # forward pre-hook: autograd records the pass from here on
    return (args[0].requires_grad_(),) + args[1:] if not args[0].requires_grad else None


def _first_token(module, args):  # forward pre-hook: the module sees token 0 of each sequence only
    return (args[0][:, :1].contiguous(),) + args[1:]  # (a strided slice would make the matmul a bmm)


def _reads_first_token_only(model, inputs: dict, last_w1) -> bool:
    """Whether ``model``'s outputs depend on its last FFN through token 0 alone, as with the [CLS]
    pooling of BERT-family classification and regression heads: checked on a real batch, the outputs
    with that FFN run on token 0 only equal the full ones.

    Then the last layer's FFN runs on token 0 only during the importance pass (the residual add
    broadcasts the rest, which no output reads): every other token's gradient there is exactly zero,
    so their importance terms are zero and the scores are unchanged, and the pass skips one of its
    layers' FFN work forward and backward (~12 % of it on a 6-layer MiniLM)."""
    with torch.no_grad():
        full = model(**inputs)[0]
        handle = last_w1.register_forward_pre_hook(_first_token)
        try:
            sliced = model(**inputs)[0]
        except RuntimeError:  # a model whose FFN block cannot take one token against all
            return False
        finally:
            handle.remove()
    return sliced.shape == full.shape and torch.allclose(sliced, full, rtol=1e-4, atol=1e-5)


def ffn_importance(model, dataset, collate_fn, kind: TaskKind | str, *, batch_size: int = 32, max_examples: int | None = None,
                   seed: int = 0, progress: bool = True) -> Tensor:
    """(layers, d_h) importance scores of the FFN neurons of a BERT-family ``model``.

    ``dataset`` holds encoded training examples (with their labels / answer positions), ``kind`` is
    the task kind (its object or name: :mod:`distillery.kinds`); ``max_examples`` samples that many
    (seeded) instead of using all.
    """
    return unit_importance(model, dataset, collate_fn, kind, batch_size=batch_size, max_examples=max_examples,
                           seed=seed, progress=progress, heads=False)[0]


def unit_importance(model, dataset, collate_fn, kind: TaskKind | str, *, batch_size: int = 32, max_examples: int | None = None,
                    seed: int = 0, progress: bool = True, heads: bool = True,
                    fisher: bool = False) -> tuple[Tensor, Tensor | None]:
    """(layers, d_h) FFN neuron scores and, with ``heads``, (layers, H) head scores, from one pass. ``fisher``:
    each example's term squared instead of its absolute value, the empirical Fisher information of the unit's mask
    (Kwon et al. 2022: Σ_x (∂L(x)/∂m)², the same per-example derivative)."""
    if len(dataset) == 0:
        raise DistilleryError("Importance needs at least one training example.")
    kind = kind_of(kind)
    layout = layout_of(model.config)
    ffns = dense_ffns(model)
    attns = attention_blocks(model) if heads else []
    device = next(model.parameters()).device
    terms = _ImportanceTerms(model, len(ffns), heads, device, fisher)
    handles = terms.attach(ffns, attns)
    try:
        with _activation_gradients_only(model, ffns, attns):
            loader = sample_loader(dataset, collate_fn, batch_size, max_examples, seed)
            first = next(iter(loader), None)  # None: a process whose share of a tiny sample is empty
            if (kind.pooled_output and first is not None and not layout.shared_layers
                    and _reads_first_token_only(model, model_inputs(first, model), ffns[-1][0])):
                handles.append(ffns[-1][0].register_forward_pre_hook(_first_token))
            for batch in tqdm(loader, desc="importance", disable=not progress, leave=False):
                out = model(**model_inputs(batch, model))
                kind.importance_loss(out, _targets(batch, device)).sum().backward()
                terms.add_batch()
    finally:
        for h in handles:
            h.remove()
    scores, head_scores = terms.scores, terms.head_scores
    distributed.all_sum_(scores, *([head_scores] if heads else []))
    return scores.float().cpu(), (head_scores.float().cpu() if heads else None)


class _ImportanceTerms:
    """The sums of one importance pass, gathered by hooks on every layer's W1 and W2 (and, for heads,
    the attention-output projection) from the activations and their gradients.

    The gradient hooks keep *detached* views of z and h: a hook holding the tensor itself would close
    a reference cycle (tensor -> grad_fn -> hook -> tensor) that only the cyclic garbage collector
    frees, and activations of long batches (SQuAD windows) would pile up until it runs."""

    def __init__(self, model, n_layers: int, heads: bool, device, fisher: bool = False):
        layout = layout_of(model.config)
        self.size = torch.square if fisher else torch.abs  # how a per-example term adds to the score
        self.glu, self.d_h = layout.glu, ffn_width(layout, model.config)
        self.n_heads = model.config.num_attention_heads
        self.scores = torch.zeros(n_layers, self.d_h, dtype=torch.float64, device=device)
        self.head_scores = torch.zeros(n_layers, self.n_heads, dtype=torch.float64, device=device) if heads else None
        self.pending: dict[int, list[Tensor]] = {i: [] for i in range(n_layers)}  # W2 terms waiting for their W1 term
        self.terms: dict[int, Tensor] = {}  # layer -> per-example terms of the batch (summed over a shared layer's calls)

    def attach(self, ffns, attns) -> list:
        """The hooks' handles, for the caller to remove."""
        handles = []
        for i, (w1, w2) in enumerate(ffns):
            handles.append(w2.register_forward_pre_hook(self._on_hidden(i)))
            handles.append(w1.register_forward_hook(self._on_pre_activation(i, w1)))
        for i, (_, out) in enumerate(attns):
            handles.append(out.register_forward_pre_hook(self._on_context(i)))
        return handles

    def add_batch(self) -> None:
        """Add the batch's per-example terms, as absolute values (squares: Fisher), to the neuron scores."""
        for i, term in self.terms.items():
            self.scores[i] += self.size(term).sum(0).double()
        self.terms.clear()

    def _on_hidden(self, i):  # W2's input h = act(z), or act(z_in) · z_gate: (B, T, d_h)
        def pre_hook(module, args):
            h = args[0]
            if h.requires_grad:
                value = h.detach()
                h.register_hook(lambda g: self.pending[i].append((g * value).sum(1)))  # (B, d_h)
        return pre_hook

    def _on_pre_activation(self, i, w1):  # W1's output z: (B, T, d_h), or (B, T, 2·d_h) for a GLU
        def hook(module, args, z):
            if z.requires_grad:
                centred = z.detach() if w1.bias is None else z.detach() - w1.bias.detach()  # w1_j · a = z_j − b1_j

                def grad_hook(g):
                    term = (g * centred).sum(1)  # (B, d_h) or (B, 2·d_h)
                    if self.glu:
                        term = term[:, :self.d_h] + term[:, self.d_h:]  # a neuron's input and gate rows
                    term = term + self.pending[i].pop()  # the same call's W2 term (its gradient came just before)
                    self.terms[i] = term if i not in self.terms else self.terms[i] + term
                z.register_hook(grad_hook)
        return hook

    def _on_context(self, i):  # attention-output dense's input c: (B, T, H · d_head), heads side by side
        def pre_hook(module, args):
            c = args[0]
            if c.requires_grad:
                value = c.detach()

                def grad_hook(g):
                    term = (g * value).sum(1).unflatten(-1, (self.n_heads, -1)).sum(-1)  # (B, H) = ∂L/∂ξ_h per example
                    self.head_scores[i] += self.size(term).sum(0).double()
                c.register_hook(grad_hook)
        return pre_hook


@contextlib.contextmanager
def _activation_gradients_only(model, ffns, attns):
    """The model in eval mode with only activation gradients to compute; its modes, ``requires_grad``
    flags and gradients restored after.

    Freezing every weight but the b1 biases (and the value biases, for heads) skips the weight-gradient
    matmuls; those biases still requiring grad make autograd record the graph from the first FFN
    (attention) on (a bias gradient is a cheap sum over tokens). An FFN without biases (ModernBERT) has
    its first input require grad."""
    was_training = model.training
    model.eval()
    requires = {n: p.requires_grad for n, p in model.named_parameters()}
    handle = None
    try:
        for p in model.parameters():
            p.requires_grad_(False)
        for w1, _ in ffns:
            if w1.bias is not None:
                w1.bias.requires_grad_(True)
        if ffns[0][0].bias is None:
            handle = ffns[0][0].register_forward_pre_hook(_needs_grad)
        for value, _ in attns:  # its weight where the family has no biases (a costlier gradient, the same graph)
            (value.weight if value.bias is None else value.bias).requires_grad_(True)
        yield
    finally:
        if handle is not None:
            handle.remove()
        for n, p in model.named_parameters():
            p.requires_grad_(requires[n])
            p.grad = None
        model.train(was_training)
