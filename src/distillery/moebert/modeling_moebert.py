"""MoEBERT: a BERT-family encoder whose FFNs are mixtures of experts, one expert active per token.

The attention blocks, embeddings and heads are Hugging Face's own BERT (and RoBERTa) modules, with
the teacher's parameter names, so a teacher's weights copy over one to one. Only the feed-forward
block is new (:class:`MoEFeedForward`): ``N`` experts of ``d_e`` neurons each, of which the first
``s`` neurons (the most important ones, MoEBERT §3.1) are shared.

Shared neurons are stored one of two ways (``config.shared_mode``):

- ``cloned`` (the paper's code): every expert owns a copy of the shared neurons; the copies are
  trained separately and drift apart. The module holds no shared block, each expert ``d_e`` neurons.
- ``tied``: one shared block of ``s`` neurons, computed once for all tokens, plus ``d_e − s`` own
  neurons per expert. The same function right after conversion, ``N−1`` fewer copies of the shared
  weights, no drift, and the shared part is one large matmul instead of ``N`` small ones.

Routing (``config.routing``):

- ``hash-r`` / ``hash-b``: each token id is pre-assigned to an expert by a per-layer table (a
  buffer, saved with the weights): random (seeded) or balanced by token frequency (Roller et al.).
- ``gate``: sentence-level, as in the paper's Fig. 3c: the masked mean of the layer input → linear
  → softmax → the top-1 expert runs for the whole sentence. ``gate_scale="prob"`` multiplies the
  expert's output by its probability (the paper's code); ``"straight-through"`` multiplies by
  ``p / stop_grad(p)`` — the value is 1, so a converted model is exactly its teacher, while the gate
  still receives the gradient of the probability-scaled output. A Switch-style load-balancing loss
  ``N · Σ_i f_i · P_i`` is returned as ``balance_loss``.

Dispatch never loops over tokens or experts: the slots of an (N, capacity, d) buffer gather their
tokens (one gather), all experts run as one batched matmul pair with b2 folded in, and
each token's row, read back, receives the shared block's last matmul in place
(:func:`plan_dispatch` plans every layer at once; measured on 2 cores at 1×128 this is ~3 % faster
than scattering into a zeroed buffer and adding, which it replaced). A per-expert loop over sorted
rows was measured slower at 1×128 on a CPU (its many small operations cost more than the padded slots). A sentence gate at batch size 1
runs the chosen expert on the whole sequence without any gather. While exporting to ONNX the
capacity is the token count (no data-dependent shapes in the graph): correct, but N× the routed work.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from huggingface_hub.dataclasses import strict
from torch import Tensor, nn
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForQuestionAnswering,
    AutoModelForSequenceClassification,
    BertConfig,
    PreTrainedModel,
)
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.masking_utils import create_bidirectional_mask
from transformers.modeling_outputs import ModelOutput
from transformers.models.bert.modeling_bert import BertAttention, BertEmbeddings, BertPooler
from transformers.models.roberta.modeling_roberta import RobertaClassificationHead, RobertaEmbeddings

ROUTINGS = ("hash-r", "hash-b", "gate")
SHARED_MODES = ("tied", "cloned")
GATE_SCALES = ("prob", "straight-through")


@strict
class MoEBertConfig(BertConfig):
    """BertConfig plus the mixture-of-experts shape.

    ``intermediate_size`` stays the teacher's ``d_h`` (what the experts were cut from);
    ``expert_size`` is ``d_e``, the neurons one token runs through (shared ones included);
    ``shared_size`` is ``s``. ``embedding_type`` / ``classifier_type`` say whose embeddings
    ("bert": absolute positions from 0; "roberta": positions after the padding index) and whose
    sequence-classification head ("bert": pooler + linear; "roberta": dense-tanh-linear on <s>).
    """

    model_type = "moebert"

    num_experts: int = 4
    expert_size: int | None = None  # None: intermediate_size // num_experts
    shared_size: int = 0
    shared_mode: str = "tied"
    routing: str = "hash-r"
    gate_scale: str = "prob"
    routing_seed: int = 0
    embedding_type: str = "bert"
    classifier_type: str = "bert"

    def __post_init__(self, **kwargs):
        if self.expert_size is None:
            self.expert_size = self.intermediate_size // max(self.num_experts, 1)
        super().__post_init__(**kwargs)

    def validate_architecture(self):
        super().validate_architecture()
        check_expert_shape(self.intermediate_size, self.num_experts, self.expert_size, self.shared_size)
        for name, value, allowed in (("routing", self.routing, ROUTINGS), ("shared_mode", self.shared_mode, SHARED_MODES),
                                     ("gate_scale", self.gate_scale, GATE_SCALES),
                                     ("embedding_type", self.embedding_type, ("bert", "roberta")),
                                     ("classifier_type", self.classifier_type, ("bert", "roberta"))):
            if value not in allowed:
                raise ValueError(f"Unknown {name} {value!r}; choose one of {', '.join(allowed)}.")

    @property
    def own_size(self) -> int:
        """Neurons each expert holds in the module: its own ones (tied) or all d_e (cloned)."""
        return self.expert_size - self.shared_size if self.shared_mode == "tied" else self.expert_size

    @property
    def shared_block_size(self) -> int:
        return self.shared_size if self.shared_mode == "tied" else 0


def check_expert_shape(d_h: int, num_experts: int, expert_size: int, shared_size: int) -> None:
    """Raise ValueError (a sentence) unless N experts of d_e neurons sharing s fit in a d_h-neuron FFN."""
    if num_experts < 1:
        raise ValueError(f"The number of experts must be at least 1, got {num_experts}.")
    if not 1 <= expert_size <= d_h:
        raise ValueError(f"The expert size must be between 1 and the FFN's {d_h} neurons, got {expert_size}.")
    if not 0 <= shared_size <= expert_size:
        raise ValueError(f"The shared neurons ({shared_size}) must be between 0 and the expert size ({expert_size}).")
    needed = shared_size + num_experts * (expert_size - shared_size)
    if needed > d_h:
        raise ValueError(
            f"{num_experts} experts of {expert_size} neurons sharing {shared_size} need "
            f"{shared_size} + {num_experts}×{expert_size - shared_size} = {needed} distinct neurons, "
            f"but the FFN has {d_h}; use fewer or smaller experts, or share more."
        )


# ------------------------------------------------------------------------------------------------
# The expert FFN


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
    """Dispatch plans for token->expert assignments ``expert`` of shape (L, M): one per row, all with
    the same capacity (the busiest expert of any row). ``valid`` (M,) marks real tokens (default: all).

    All rows are planned together in a dozen tensor ops and one host sync (the capacity), so hash
    routing plans every layer before the first one runs. Each op costs several microseconds in the
    middle of a forward pass (its code and data are cold after the matmuls), which is why this is
    written for few ops rather than for the fewest FLOPs; sharing one capacity across rows costs a
    few padded slots and nothing measurable.
    """
    n_rows, m = expert.shape
    exporting = torch.compiler.is_exporting()  # no host sync in a graph: every expert gets room for all tokens
    padded = valid is not None and (exporting or not bool(valid.all()))
    key = expert.masked_fill(valid == 0, num_experts) if padded else expert  # padding: an expert of its own
    # (L, M, N[+1]): running count per expert (a comparison, not F.one_hot, which first checks the range)
    count = (key.unsqueeze(2) == torch.arange(num_experts + int(padded), device=key.device)).cumsum(1)
    load = count[:, -1, :num_experts]  # (L, N)
    rank = count.gather(2, key.unsqueeze(2)).squeeze(2) - 1  # (L, M): place among its expert's tokens
    cap = m if exporting else max(int(load.amax()), 1)
    row = key * cap + rank  # (L, M) row of the flattened slot buffer; padding lands at n · cap or past it
    if padded:
        row = row.clamp_max(num_experts * cap)  # padding: the spare last column of the scatter below
    tokens = torch.arange(m, device=expert.device).expand(n_rows, m)
    source = expert.new_zeros(n_rows, num_experts * cap + 1).scatter_(1, row, tokens)
    source = source[:, :-1].reshape(n_rows, num_experts, cap)
    slot = row.clamp_max(num_experts * cap - 1) if padded else row  # padding reads a real row; valid zeroes it
    multiplier = valid.to(torch.get_default_dtype()).unsqueeze(1) if padded else None
    return [DispatchPlan(slot=s, source=src, capacity=cap, load=n, valid=multiplier)
            for s, src, n in zip(slot.unbind(0), source.unbind(0), load.unbind(0))]


class MoEFeedForward(nn.Module):
    """``y = W2_e · act(W1_e · a + b1_e) + b2`` with e the token's expert (plus the shared block).

    Weights are stacked per expert and stored input-major (``w1: (N, d, k)``, ``w2: (N, k, d)``) so
    that every expert pass is a plain ``x @ w``.
    """

    def __init__(self, config: MoEBertConfig):
        super().__init__()
        d, n, own, shared = config.hidden_size, config.num_experts, config.own_size, config.shared_block_size
        self.num_experts = n
        # BERT's exact GELU as the function itself: HF's activation module adds a module call to each of
        # the two uses per layer, measurable at batch 1 (~0.09 ms of a 14.7 ms forward); same numerics.
        self.act = F.gelu if config.hidden_act == "gelu" else ACT2FN[config.hidden_act]
        self.w1 = nn.Parameter(torch.empty(n, d, own))  # (N, d, k)
        self.b1 = nn.Parameter(torch.zeros(n, own))
        self.w2 = nn.Parameter(torch.empty(n, own, d))  # (N, k, d)
        self.b2 = nn.Parameter(torch.zeros(d))
        if shared:
            self.shared_w1 = nn.Parameter(torch.empty(d, shared))
            self.shared_b1 = nn.Parameter(torch.zeros(shared))
            self.shared_w2 = nn.Parameter(torch.empty(shared, d))
        else:
            self.shared_w1 = self.shared_b1 = self.shared_w2 = None

    def expert(self, x: Tensor, e: int) -> Tensor:
        """Expert e's own neurons on rows x, with b2: (M, d) -> (M, d)."""
        return torch.addmm(self.b2, self.act(torch.addmm(self.b1[e], x, self.w1[e])), self.w2[e])

    def forward(self, x: Tensor, plan: "DispatchPlan | None" = None, sentence_expert: Tensor | None = None,
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
            h = self.act(torch.addmm(self.shared_b1, flat, self.shared_w1))
            out = out.addmm_(h, self.shared_w2.to(h.dtype))  # autocast skips in-place ops: match h's dtype
        out = out.view(bsz, seq, d)
        if scale is not None:
            out = out * scale.to(out.dtype)[:, None, None]
        return out

    def _dispatch(self, flat: Tensor, plan: "DispatchPlan") -> Tensor:
        """Each token through its expert (b2 included) as one batched matmul pair: the slots of an
        (N, capacity, d) buffer gather their tokens, the N experts run as two ``baddbmm``, and each
        token reads its row back. Slots no token fills cost only their share of the matmuls
        (capacity: the token count of the busiest expert in any layer of the plan)."""
        slots = F.embedding(plan.source, flat)  # (N, cap, d)
        h = self.act(torch.baddbmm(self.b1.unsqueeze(1), slots, self.w1))  # (N, cap, k)
        rows = F.embedding(plan.slot, torch.baddbmm(self.b2, h, self.w2).flatten(0, 1))  # (M, d)
        return rows if plan.valid is None else rows * plan.valid.to(rows.dtype)


class SentenceGate(nn.Module):
    """Sentence-level top-1 router: masked mean of the layer input → linear → softmax."""

    def __init__(self, config: MoEBertConfig):
        super().__init__()
        self.num_experts = config.num_experts
        self.straight_through = config.gate_scale == "straight-through"
        self.linear = nn.Linear(config.hidden_size, config.num_experts)

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


class MoEBertLayer(nn.Module):
    """BERT's attention block, then the expert FFN, residual and LayerNorm as in BertOutput."""

    def __init__(self, config: MoEBertConfig, layer_idx: int):
        super().__init__()
        self.attention = BertAttention(config, layer_idx=layer_idx)
        self.experts = MoEFeedForward(config)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.gate = SentenceGate(config) if config.routing == "gate" else None
        # token id -> expert; a buffer so that it is saved with the weights and moves with the model.
        generator = torch.Generator().manual_seed(config.routing_seed * 1000 + layer_idx)
        self.register_buffer("hash_table", torch.randint(0, config.num_experts, (config.vocab_size,), generator=generator))

    def forward(self, hidden: Tensor, attention_mask, mask: Tensor, token_expert: Tensor | None,
                plan: DispatchPlan | None, **kwargs) -> tuple[Tensor, dict]:
        """hidden: (B, T, d); ``mask`` (B, T) marks real tokens; hash routing passes each token's
        expert and the dispatch plan, made for all layers at once by the model."""
        a, _ = self.attention(hidden, attention_mask, **kwargs)  # (B, T, d)
        route: dict = {"token_expert": token_expert}
        sentence_expert = scale = None
        if self.gate is not None:
            sentence_expert, scale, route["balance"] = self.gate(a, mask)
            route["token_expert"] = sentence_expert[:, None].expand(mask.shape)  # (B, T)
            if a.shape[0] > 1 or torch.compiler.is_exporting():
                plan = plan_dispatch(route["token_expert"].reshape(1, -1), self.experts.num_experts, mask.reshape(-1))[0]
        y = self.experts(a, plan, sentence_expert, scale)
        if self.training:  # (an identity in eval: skipping the call is worth ~5 µs a layer at batch 1)
            y = self.dropout(y)
        return self.LayerNorm(y + a), route


# ------------------------------------------------------------------------------------------------
# Models


@dataclass
class MoEBertModelOutput(ModelOutput):
    last_hidden_state: Tensor | None = None
    pooler_output: Tensor | None = None
    hidden_states: tuple[Tensor, ...] | None = None
    balance_loss: Tensor | None = None  # sum over layers (gate routing), else None
    expert_load: Tensor | None = None  # (layers, experts): real tokens routed to each expert


@dataclass
class MoEBertSequenceClassifierOutput(ModelOutput):
    loss: Tensor | None = None
    logits: Tensor | None = None
    hidden_states: tuple[Tensor, ...] | None = None
    balance_loss: Tensor | None = None
    expert_load: Tensor | None = None


@dataclass
class MoEBertQuestionAnsweringOutput(ModelOutput):
    loss: Tensor | None = None
    start_logits: Tensor | None = None
    end_logits: Tensor | None = None
    hidden_states: tuple[Tensor, ...] | None = None
    balance_loss: Tensor | None = None
    expert_load: Tensor | None = None


class MoEBertPreTrainedModel(PreTrainedModel):
    config_class = MoEBertConfig
    config: MoEBertConfig
    base_model_prefix = "moebert"
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_attention_backend = True

    @torch.no_grad()
    def _init_weights(self, module):
        super()._init_weights(module)
        std = self.config.initializer_range
        if isinstance(module, MoEFeedForward):
            for p in (module.w1, module.w2, module.shared_w1, module.shared_w2):
                if p is not None:
                    init.normal_(p, mean=0.0, std=std)
            for p in (module.b1, module.b2, module.shared_b1):
                if p is not None:
                    init.zeros_(p)
        elif isinstance(module, (BertEmbeddings, RobertaEmbeddings)):
            init.copy_(module.position_ids, torch.arange(module.position_ids.shape[-1]).expand((1, -1)))
            init.zeros_(module.token_type_ids)

    def num_effective_parameters(self) -> int:
        """Parameters one token's output uses: one expert per layer (not N), the shared block, the
        routers, attention and head, and one row of each embedding table."""
        total = 0
        for module in self.modules():
            for name, p in module.named_parameters(recurse=False):
                if isinstance(module, nn.Embedding):
                    total += p.shape[1]
                elif isinstance(module, MoEFeedForward) and name in ("w1", "b1", "w2"):
                    total += p.numel() // module.num_experts
                else:
                    total += p.numel()
        return total


class MoEBertModel(MoEBertPreTrainedModel):
    def __init__(self, config: MoEBertConfig, add_pooling_layer: bool = True):
        super().__init__(config)
        self.embeddings = RobertaEmbeddings(config) if config.embedding_type == "roberta" else BertEmbeddings(config)
        self.layers = nn.ModuleList([MoEBertLayer(config, i) for i in range(config.num_hidden_layers)])
        self.pooler = BertPooler(config) if add_pooling_layer else None
        self.post_init()

    def get_input_embeddings(self):
        return self.embeddings.word_embeddings

    def set_input_embeddings(self, value):
        self.embeddings.word_embeddings = value

    def hash_routes(self, input_ids: Tensor | None, mask: Tensor) -> tuple[list, list]:
        """Per layer: each token's expert (B, T) and the dispatch plan (hash routing); Nones for the gate."""
        n = len(self.layers)
        if self.config.routing == "gate":
            return [None] * n, [None] * n
        if input_ids is None:
            raise ValueError("hash routing assigns experts by token id: pass input_ids, not inputs_embeds.")
        ids = input_ids.reshape(-1)
        experts = torch.stack([layer.hash_table.index_select(0, ids) for layer in self.layers])  # (L, B·T)
        plans = plan_dispatch(experts, self.config.num_experts, mask.reshape(-1))
        return experts.view(n, *input_ids.shape).unbind(0), plans

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None,
                inputs_embeds=None, output_hidden_states=None, output_expert_load=False, return_dict=None,
                **kwargs) -> MoEBertModelOutput:
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("Pass exactly one of input_ids and inputs_embeds.")
        output_hidden_states = output_hidden_states if output_hidden_states is not None else self.config.output_hidden_states
        hidden = self.embeddings(input_ids=input_ids, token_type_ids=token_type_ids, position_ids=position_ids,
                                 inputs_embeds=inputs_embeds)  # (B, T, d)
        mask = attention_mask if attention_mask is not None else torch.ones(hidden.shape[:2], dtype=torch.long, device=hidden.device)
        attn_mask = create_bidirectional_mask(config=self.config, inputs_embeds=hidden, attention_mask=attention_mask)
        all_hidden = [hidden] if output_hidden_states else None
        balance, loads = [], []
        token_experts, plans = self.hash_routes(input_ids, mask)
        for layer, token_expert, plan in zip(self.layers, token_experts, plans):
            hidden, route = layer(hidden, attn_mask, mask, token_expert, plan, **kwargs)
            if "balance" in route:
                balance.append(route["balance"])
            if output_expert_load:
                loads.append(_expert_load(route, mask, self.config.num_experts))
            if output_hidden_states:
                all_hidden.append(hidden)
        return MoEBertModelOutput(
            last_hidden_state=hidden,
            pooler_output=self.pooler(hidden) if self.pooler is not None else None,
            hidden_states=tuple(all_hidden) if output_hidden_states else None,
            balance_loss=torch.stack(balance).sum() if balance else None,
            expert_load=torch.stack(loads) if output_expert_load else None,
        )


def _expert_load(route: dict, mask: Tensor, num_experts: int) -> Tensor:
    """Real (unmasked) tokens sent to each expert: (N,)."""
    return torch.bincount(route["token_expert"][mask.bool()], minlength=num_experts)


class MoEBertForSequenceClassification(MoEBertPreTrainedModel):
    def __init__(self, config: MoEBertConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        roberta_head = config.classifier_type == "roberta"
        self.moebert = MoEBertModel(config, add_pooling_layer=not roberta_head)
        if roberta_head:
            self.classifier = RobertaClassificationHead(config)
        else:
            dropout = config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob
            self.dropout = nn.Dropout(dropout)
            self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None,
                inputs_embeds=None, labels=None, output_hidden_states=None, output_expert_load=False,
                return_dict=None, **kwargs) -> MoEBertSequenceClassifierOutput:
        out = self.moebert(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds,
                           output_hidden_states=output_hidden_states, output_expert_load=output_expert_load, **kwargs)
        if self.config.classifier_type == "roberta":
            logits = self.classifier(out.last_hidden_state)
        else:
            logits = self.classifier(self.dropout(out.pooler_output))
        loss = None
        if labels is not None:
            if self.num_labels == 1:
                loss = F.mse_loss(logits.squeeze(-1).float(), labels.float())
            else:
                loss = F.cross_entropy(logits.view(-1, self.num_labels).float(), labels.view(-1))
        return MoEBertSequenceClassifierOutput(loss=loss, logits=logits, hidden_states=out.hidden_states,
                                               balance_loss=out.balance_loss, expert_load=out.expert_load)


class MoEBertForQuestionAnswering(MoEBertPreTrainedModel):
    def __init__(self, config: MoEBertConfig):
        super().__init__(config)
        self.moebert = MoEBertModel(config, add_pooling_layer=False)
        self.qa_outputs = nn.Linear(config.hidden_size, config.num_labels)  # 2: start and end, as BERT's
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None,
                inputs_embeds=None, start_positions=None, end_positions=None, output_hidden_states=None,
                output_expert_load=False, return_dict=None, **kwargs) -> MoEBertQuestionAnsweringOutput:
        out = self.moebert(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds,
                           output_hidden_states=output_hidden_states, output_expert_load=output_expert_load, **kwargs)
        start_logits, end_logits = self.qa_outputs(out.last_hidden_state).split(1, dim=-1)  # (B, T, 1) each
        start_logits, end_logits = start_logits.squeeze(-1).contiguous(), end_logits.squeeze(-1).contiguous()
        loss = None
        if start_positions is not None and end_positions is not None:
            n = start_logits.size(1)
            loss = (F.cross_entropy(start_logits, start_positions.clamp(0, n), ignore_index=n)
                    + F.cross_entropy(end_logits, end_positions.clamp(0, n), ignore_index=n)) / 2
        return MoEBertQuestionAnsweringOutput(loss=loss, start_logits=start_logits, end_logits=end_logits,
                                              hidden_states=out.hidden_states, balance_loss=out.balance_loss,
                                              expert_load=out.expert_load)


AutoConfig.register("moebert", MoEBertConfig, exist_ok=True)
AutoModel.register(MoEBertConfig, MoEBertModel, exist_ok=True)
AutoModelForSequenceClassification.register(MoEBertConfig, MoEBertForSequenceClassification, exist_ok=True)
AutoModelForQuestionAnswering.register(MoEBertConfig, MoEBertForQuestionAnswering, exist_ok=True)
