"""Importance-guided adaptation of a dense teacher into MoEBERT (MoEBERT §3.1).

Neurons of each FFN are ranked by importance (descending); the top ``s`` are shared by every
expert, and expert e (0-based) gets ranks ``s+e, s+e+N, s+e+2N, …`` until it holds ``d_e``
neurons; the least important neurons are dropped. ``b1`` and ``W2`` follow ``W1``'s neurons, ``b2``
is kept once; a GLU FFN's gate rows follow their input rows (neuron j is rows j and d_h + j of
``W1``). Everything else (embeddings, attention, LayerNorms, the task head) is the teacher's, under
the teacher's parameter names: the student is the teacher's own class with MoE FFNs
(:mod:`distillery.moebert.modeling_moebert`). Any family :mod:`distillery.encoders` describes converts.
"""

from __future__ import annotations

import copy
import heapq
from collections import Counter
from collections.abc import Iterable, Sequence

import torch
from torch import Tensor, nn
from transformers import PreTrainedModel

from distillery.encoders import ffn_width, layers_prefix, layout_of
from distillery.errors import DistilleryError
from distillery.importance import dense_ffns
from distillery.modeling import head_of_class
from distillery.moebert.modeling_moebert import (
    MoEBertConfig,
    MoEBertForQuestionAnswering,
    MoEBertForSequenceClassification,
    MoEBertForTokenClassification,
    MoEBertModel,
    MoEBertPreTrainedModel,
    choices_problem,
    resolve_expert_shape,
)

# The MoEBERT class of each head (distillery.modeling.HEADS, by the Auto class its family model is built with)
STUDENT_CLASSES = {cls.FAMILY_HEAD: cls for cls in (MoEBertForSequenceClassification, MoEBertForTokenClassification,
                                                    MoEBertForQuestionAnswering, MoEBertModel)}

from distillery.moebert.options import SPLITS


def neuron_ranking(importance: Tensor, split: str = "import", seed: int = 0) -> Tensor:
    """Neuron indices in the order the split hands them out: most important first (``import``),
    least important first (``inverse``, the paper's ablation), or a seeded random order."""
    if split == "import":
        return torch.argsort(importance, descending=True, stable=True)
    if split == "inverse":
        return torch.argsort(importance, descending=False, stable=True)
    if split == "random":
        return torch.randperm(importance.numel(), generator=torch.Generator().manual_seed(seed))
    raise DistilleryError(f"Unknown split {split!r}; choose one of {', '.join(SPLITS)}.")


def expert_indices(ranking: Tensor, num_experts: int, expert_size: int, shared_size: int) -> tuple[Tensor, Tensor]:
    """(shared (s,), own (N, d_e − s)) neuron indices from a ranking, by the paper's rule."""
    resolve_expert_shape(ranking.numel(), num_experts, expert_size, shared_size)  # a sentence unless they fit
    own_size = expert_size - shared_size
    shared = ranking[:shared_size]
    # rest[k] is rank s + k; expert e takes k = e, e + N, e + 2N, ... : a (own_size, N) reshape, transposed.
    rest = ranking[shared_size:shared_size + num_experts * own_size]
    own = rest.reshape(own_size, num_experts).t().contiguous()  # (N, d_e − s)
    return shared, own


def balanced_hash_table(token_counts: Tensor, num_experts: int) -> Tensor:
    """Token id -> expert, balancing token frequencies (Roller et al.'s balanced hash).

    Greedy bin packing: tokens in descending frequency, each to the expert with the least load so far
    (ties: the lowest expert id). Tokens never seen (count 0) are spread by ``id mod N``, so the table
    is deterministic and an unseen token still has an expert.
    """
    counts = token_counts.to(torch.long)
    table = torch.arange(counts.numel()) % num_experts
    seen = torch.nonzero(counts > 0).flatten()
    seen = seen[torch.argsort(counts[seen], descending=True, stable=True)]
    heap = [(0, e) for e in range(num_experts)]
    assigned = []
    for c in counts[seen].tolist():  # one pass over the vocabulary at conversion time, not a hot path
        load, e = heapq.heappop(heap)
        assigned.append(e)
        heapq.heappush(heap, (load + c, e))
    table[seen] = torch.tensor(assigned, dtype=torch.long)
    return table


def count_tokens(input_ids: Iterable[Sequence[int]], vocab_size: int) -> Tensor:
    """Occurrences of each token id in an iterable of id lists (the task's train split)."""
    counter: Counter = Counter()
    for ids in input_ids:
        counter.update(ids)
    counts = torch.zeros(vocab_size, dtype=torch.long)
    if counter:
        keys = torch.tensor(list(counter.keys()), dtype=torch.long)
        counts[keys] = torch.tensor(list(counter.values()), dtype=torch.long)
    return counts


def teacher_layout(config):
    """The teacher's encoder layout, or a sentence saying why MoEBERT cannot cut its FFNs."""
    if getattr(config, "model_type", None) == MoEBertConfig.model_type:
        raise DistilleryError("The teacher is already a MoEBERT model: MoEBERT cuts a dense teacher's FFNs into experts.")
    layout = layout_of(config)
    if layout.student and getattr(config, "glu", False):
        raise DistilleryError(f"This {layout.family} student has a GLU FFN (two input projections), which MoEBERT "
                              f"cannot replace as one block; convert its original teacher instead.")
    if layout.ffn_block is None:
        raise DistilleryError(f"The {layout.family} layout does not say where its FFN block is, so MoEBERT cannot replace it.")
    if layout.shared_layers and getattr(config, "num_hidden_groups", 1) != 1:
        raise DistilleryError(f"This {layout.family} teacher has {config.num_hidden_groups} layer groups; MoEBERT "
                              f"converts a teacher with one shared group (the layout describes group 0 only).")
    return layout


def student_class(teacher) -> type[MoEBertPreTrainedModel]:
    """The MoEBERT class with the teacher's head."""
    name = type(teacher).__name__
    head = head_of_class(name)
    if head is not None and head.auto_class in STUDENT_CLASSES:
        return STUDENT_CLASSES[head.auto_class]
    raise DistilleryError(f"Cannot convert {name}: MoEBERT has sequence-classification, token-classification, QA and "
                          f"bare-encoder heads.")


def convert(
    teacher: PreTrainedModel,
    importance: Tensor | None,
    *,
    num_experts: int = 4,
    expert_size: int | None = None,
    shared_size: int | None = None,
    split: str = "import",
    shared_mode: str = "tied",
    routing: str = "hash-r",
    gate_scale: str = "prob",
    token_counts: Tensor | None = None,
    seed: int = 0,
) -> PreTrainedModel:
    """A MoEBERT model with the teacher's weights, its FFNs cut into experts.

    ``importance``: (layers, d_h) scores from :func:`distillery.importance.ffn_importance`, one row
    per layer of the family's layer list (None only for ``split="random"``). ``expert_size`` and
    ``shared_size`` default as :func:`~distillery.moebert.modeling_moebert.resolve_expert_shape` says.
    ``token_counts`` (vocab,) is needed for ``hash-b``.
    """
    layout = teacher_layout(teacher.config)
    ffns = dense_ffns(teacher)
    d_h = ffn_width(layout, teacher.config)
    num_experts, expert_size, shared_size = resolve_expert_shape(d_h, num_experts, expert_size, shared_size)
    importance = _checked_importance(importance, split, len(ffns), d_h)
    problem = choices_problem(routing, shared_mode, gate_scale)
    if problem:
        raise DistilleryError(problem)
    if routing == "hash-b" and token_counts is None:
        raise DistilleryError("hash-b routing balances token frequencies: pass token_counts from the train split.")
    cls = student_class(teacher)
    tc = teacher.config
    config = MoEBertConfig(encoder_config=copy.deepcopy(tc), num_experts=num_experts, expert_size=expert_size,
                           shared_size=shared_size, shared_mode=shared_mode, routing=routing, gate_scale=gate_scale,
                           routing_seed=seed, id2label=tc.id2label, label2id=tc.label2id, problem_type=tc.problem_type)
    student = cls(config)
    _load_converted(student, _student_state(teacher, student, layout, ffns, importance, split, seed, token_counts))
    # built on the CPU; it lives where the teacher does (the refit runs the two side by side)
    return student.to(next(teacher.parameters()).device).eval()


def _checked_importance(importance: Tensor | None, split: str, n_layers: int, d_h: int) -> Tensor:
    """The (layers, d_h) scores the split ranks neurons by: zeros for the random split, which reads none."""
    if split not in SPLITS:
        raise DistilleryError(f"Unknown split {split!r}; choose one of {', '.join(SPLITS)}.")
    if importance is None:
        if split != "random":
            raise DistilleryError(f"Split {split!r} needs importance scores.")
        return torch.zeros(n_layers, d_h)
    if tuple(importance.shape) != (n_layers, d_h):
        raise DistilleryError(f"Importance scores have shape {tuple(importance.shape)}; the teacher needs ({n_layers}, {d_h}).")
    return importance


def _student_state(teacher: PreTrainedModel, student: MoEBertPreTrainedModel, layout,
                   ffns: list[tuple[nn.Linear, nn.Linear]], importance: Tensor, split: str, seed: int,
                   token_counts: Tensor | None) -> dict[str, Tensor]:
    """The student's weights: the teacher's, under their own names, except the FFNs, whose neurons the
    split hands out to the experts layer by layer (plus the hash-b tables)."""
    c, d_h = student.config, ffn_width(layout, teacher.config)
    own = student.state_dict()
    state = {k: v.detach().clone() for k, v in teacher.state_dict().items() if k in own}
    prefix = layers_prefix(teacher)
    for i, (w1, w2) in enumerate(ffns):
        shared, experts = expert_indices(neuron_ranking(importance[i], split, seed=seed * 1000 + i),
                                         c.num_experts, c.expert_size, c.shared_size)
        if c.shared_mode == "cloned":  # every expert holds a copy of the shared neurons
            experts = torch.cat([shared.expand(c.num_experts, -1), experts], dim=1)
        p = f"{prefix}.{i}.{layout.ffn_block}."
        state.update(_expert_weights(p, w1, w2, shared, experts, d_h, layout.glu, tied=c.shared_mode == "tied"))
        if c.routing == "hash-b":
            table = balanced_hash_table(token_counts, c.num_experts)
            state[p + "hash_table"] = table.expand_as(own[p + "hash_table"]).clone()
    return state


def _load_converted(student: MoEBertPreTrainedModel, state: dict[str, Tensor]) -> None:
    missing, unexpected = student.load_state_dict(state, strict=False)
    # Left at their initial values on purpose: the hash tables (seeded per layer call) and the gates.
    missing = [k for k in missing if not any(a in k for a in ("hash_table", "gate."))]
    if missing or unexpected:
        raise DistilleryError(f"Cannot map the teacher's weights onto MoEBERT: missing {missing[:5]}, unexpected {unexpected[:5]}.")


def _expert_weights(p: str, w1: nn.Linear, w2: nn.Linear, shared: Tensor, experts: Tensor, d_h: int, glu: bool,
                    tied: bool) -> dict[str, Tensor]:
    """The MoE block's state (keys under ``p``) from the dense W1, W2: experts (N, k) and shared (s,)
    neuron indices; a GLU neuron j takes W1 rows j (input) and d_h + j (gate)."""
    W1, W2 = w1.weight.detach(), w2.weight.detach()  # (d_h or 2·d_h, d), (d, d_h)
    B1 = w1.bias.detach() if w1.bias is not None else None

    def rows(t: Tensor, idx: Tensor, dim: int) -> Tensor:  # the neurons' rows of W1 (dim -2) or entries of b1 (-1)
        return torch.cat([t[idx], t[idx + d_h]], dim=dim) if glu else t[idx]

    out = {p + "experts.w1": rows(W1, experts, -2).transpose(1, 2).contiguous(),  # (N, k, d) -> (N, d, k)
           p + "experts.w2": W2[:, experts].permute(1, 2, 0).contiguous()}  # (d, N, k) -> (N, k, d)
    if B1 is not None:
        out[p + "experts.b1"] = rows(B1, experts, -1).clone()
        out[p + "experts.b2"] = w2.bias.detach().clone()
    if tied and shared.numel():
        out[p + "experts.shared_w1"] = rows(W1, shared, -2).t().contiguous()  # (d, s)
        out[p + "experts.shared_w2"] = W2[:, shared].t().contiguous()  # (s, d)
        if B1 is not None:
            out[p + "experts.shared_b1"] = rows(B1, shared, -1).clone()
    return out
