"""Importance-guided adaptation of a dense teacher into MoEBERT (MoEBERT §3.1).

Neurons of each FFN are ranked by importance (descending); the top ``s`` are shared by every
expert, and expert e (0-based) gets ranks ``s+e, s+e+N, s+e+2N, …`` until it holds ``d_e``
neurons; the least important neurons are dropped. ``b1`` and ``W2`` follow ``W1``'s neurons, ``b2``
is kept once. Attention, embeddings, LayerNorms and the task head are copied unchanged.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Iterable, Sequence

import torch
from torch import Tensor, nn
from transformers import PreTrainedModel

from distillery.modeling import find_encoder_layers
from distillery.errors import DistilleryError
from distillery.importance import dense_ffns  # noqa: F401  (re-exported: refit and the tests read it here)
from distillery.moebert.modeling_moebert import (
    MoEBertConfig,
    MoEBertForQuestionAnswering,
    MoEBertForSequenceClassification,
    check_expert_shape,
)

SPLITS = ("import", "random", "inverse")


def shared_default(d_h: int) -> int:
    """s = d_h / 6 rounded to a multiple of 8 (the paper's 512 of 3072; 256 of MiniLM's 1536)."""
    return int(round(d_h / 6 / 8)) * 8


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
    d_h = ranking.numel()
    try:
        check_expert_shape(d_h, num_experts, expert_size, shared_size)
    except ValueError as e:
        raise DistilleryError(str(e)) from None
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

    ``importance``: (layers, d_h) scores from :func:`distillery.moebert.importance.ffn_importance`
    (None only for ``split="random"``). ``token_counts`` (vocab,) is needed for ``hash-b``.
    """
    tc = teacher.config
    model_type = getattr(tc, "model_type", "")
    if model_type not in ("bert", "roberta", "moebert") and not hasattr(tc, "intermediate_size"):
        raise DistilleryError(f"Cannot convert a {model_type or type(teacher).__name__} model: MoEBERT needs a BERT-family encoder.")
    d_h, n_layers = tc.intermediate_size, tc.num_hidden_layers
    expert_size = expert_size or d_h // num_experts
    shared_size = shared_default(d_h) if shared_size is None else shared_size
    try:
        check_expert_shape(d_h, num_experts, expert_size, shared_size)
    except ValueError as e:
        raise DistilleryError(str(e)) from None
    if split not in SPLITS:
        raise DistilleryError(f"Unknown split {split!r}; choose one of {', '.join(SPLITS)}.")
    if importance is None:
        if split != "random":
            raise DistilleryError(f"Split {split!r} needs importance scores.")
        importance = torch.zeros(n_layers, d_h)
    if tuple(importance.shape) != (n_layers, d_h):
        raise DistilleryError(f"Importance scores have shape {tuple(importance.shape)}; the teacher needs ({n_layers}, {d_h}).")
    if routing == "hash-b" and token_counts is None:
        raise DistilleryError("hash-b routing balances token frequencies: pass token_counts from the train split.")
    head = "qa" if type(teacher).__name__.endswith("ForQuestionAnswering") else "classification"
    if head == "classification" and not type(teacher).__name__.endswith("ForSequenceClassification"):
        raise DistilleryError(f"Cannot convert {type(teacher).__name__}: MoEBERT has sequence-classification and QA heads.")

    is_roberta = model_type == "roberta" or getattr(tc, "embedding_type", "bert") == "roberta"
    fields = {k: v for k, v in tc.to_dict().items() if k not in ("model_type", "transformers_version", "architectures")}
    for k in ("num_experts", "expert_size", "shared_size", "shared_mode", "routing", "gate_scale", "routing_seed",
              "embedding_type", "classifier_type"):
        fields.pop(k, None)
    try:
        config = MoEBertConfig(**fields, num_experts=num_experts, expert_size=expert_size, shared_size=shared_size,
                               shared_mode=shared_mode, routing=routing, gate_scale=gate_scale, routing_seed=seed,
                               embedding_type="roberta" if is_roberta else "bert",
                               classifier_type="roberta" if model_type == "roberta" else "bert")
    except Exception as e:  # huggingface_hub's strict-dataclass validation raises its own error type
        raise DistilleryError(str(e).splitlines()[-1].strip()) from None
    config._attn_implementation = teacher.config._attn_implementation  # same attention kernel as the teacher
    cls = MoEBertForQuestionAnswering if head == "qa" else MoEBertForSequenceClassification
    student = cls(config)

    # Everything but the FFNs keeps the teacher's name under the "moebert" prefix.
    prefix = teacher.base_model_prefix
    layer_key, _ = find_encoder_layers(teacher)
    state = {}
    for key, value in teacher.state_dict().items():
        if ".intermediate." in key or (".output.dense." in key and ".attention." not in key):  # the dense FFN
            continue
        if key.startswith(layer_key + "."):
            i, rest = key[len(layer_key) + 1:].split(".", 1)
            rest = rest.replace("output.LayerNorm", "LayerNorm") if not rest.startswith("attention.") else rest
            key = f"moebert.layers.{i}.{rest}"
        elif key.startswith(prefix + "."):
            key = "moebert." + key[len(prefix) + 1:]
        state[key] = value.detach().clone()

    tables = []
    for i, (w1, w2) in enumerate(dense_ffns(teacher)):
        shared, own = expert_indices(neuron_ranking(importance[i], split, seed=seed * 1000 + i),
                                     num_experts, expert_size, shared_size)
        if shared_mode == "cloned":  # every expert holds a copy of the shared neurons
            own = torch.cat([shared.expand(num_experts, -1), own], dim=1)
        W1, B1, W2 = w1.weight.detach(), w1.bias.detach(), w2.weight.detach()  # (d_h, d), (d_h,), (d, d_h)
        p = f"moebert.layers.{i}.experts."
        state[p + "w1"] = W1[own].transpose(1, 2).contiguous()  # (N, k, d) -> (N, d, k)
        state[p + "b1"] = B1[own].clone()
        state[p + "w2"] = W2[:, own].permute(1, 2, 0).contiguous()  # (d, N, k) -> (N, k, d)
        state[p + "b2"] = w2.bias.detach().clone()
        if shared_mode == "tied" and shared_size:
            state[p + "shared_w1"] = W1[shared].t().contiguous()  # (d, s)
            state[p + "shared_b1"] = B1[shared].clone()
            state[p + "shared_w2"] = W2[:, shared].t().contiguous()  # (s, d)
        if routing == "hash-b":
            tables.append(balanced_hash_table(token_counts, num_experts))
    missing, unexpected = student.load_state_dict(state, strict=False)
    # Left at their initial values on purpose: the hash tables (seeded per layer), the gates, and
    # buffers the teacher does not save.
    allowed = ("hash_table", "gate.", "position_ids", "token_type_ids")
    missing = [k for k in missing if not any(a in k for a in allowed)]
    if missing or unexpected:
        raise DistilleryError(f"Cannot map the teacher's weights onto MoEBERT: missing {missing[:5]}, unexpected {unexpected[:5]}.")
    for layer, table in zip(student.moebert.layers, tables):
        layer.hash_table.copy_(table)
    # built on the CPU; it lives where the teacher does (the refit runs the two side by side)
    return student.to(next(teacher.parameters()).device).eval()
