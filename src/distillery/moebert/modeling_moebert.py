"""MoEBERT: an encoder of any family distillery knows whose FFNs are mixtures of experts, one
expert active per token.

The student *is* its teacher's Hugging Face model (the family's own class: embeddings, attention,
positions, LayerNorms, head, parameter names), with each layer's FFN replaced by a :class:`MoEBlock`
where :mod:`distillery.encoders` says the FFN sits (``ffn_block``; the modules after it up to the
FFN's output, ``ffn_rest``, become identities, so that whatever the layer does around its FFN, the
dropout, residual and LayerNorm of a post-LN layer or the residual of a pre-LN one, still happens).
:class:`MoEBertConfig` (``model_type`` "moebert") holds the family's config (``encoder_config``) and
the mixture's shape, so ``save_pretrained`` / ``from_pretrained`` and the Auto classes rebuild the
student from config.json and safetensors alone. A student wraps the family's model: it adopts the
family model's children (so the weights keep the family's names, ``bert.encoder.layer.0...``) and
runs the family's own ``forward``, having first handed each MoE block its routing.

The expert FFN (:class:`MoEFeedForward`): ``N`` experts of ``d_e`` neurons each, of which the first
``s`` neurons (the most important ones, MoEBERT §3.1) are shared. A GLU FFN (``act(in) · gate``,
ModernBERT) keeps a neuron's input and gate rows together: each expert's first weight holds its
neurons' input columns, then their gate columns.

Shared neurons are stored one of two ways (``config.shared_mode``):

- ``cloned`` (the paper's code): every expert owns a copy of the shared neurons; the copies are
  trained separately and drift apart. The module holds no shared block, each expert ``d_e`` neurons.
- ``tied``: one shared block of ``s`` neurons, computed once for all tokens, plus ``d_e − s`` own
  neurons per expert. The same function right after conversion, ``N−1`` fewer copies of the shared
  weights, no drift, and the shared part is one large matmul instead of ``N`` small ones.

Routing (``config.routing``):

- ``hash-r`` / ``hash-b``: each token id is pre-assigned to an expert by a table per layer call (a
  buffer, saved with the weights): random (seeded) or balanced by token frequency (Roller et al.).
- ``gate``: sentence-level, as in the paper's Fig. 3c: the masked mean of the FFN input → linear
  → softmax → the top-1 expert runs for the whole sentence. ``gate_scale="prob"`` multiplies the
  expert's output by its probability (the paper's code); ``"straight-through"`` multiplies by
  ``p / stop_grad(p)`` — the value is 1, so a converted model is exactly its teacher, while the gate
  still receives the gradient of the probability-scaled output. A Switch-style load-balancing loss
  ``N · Σ_i f_i · P_i`` is returned as ``balance_loss``.

ALBERT applies one shared layer ``num_hidden_layers`` times: its FFN is converted once, so the
experts are shared across repeats as the dense FFN was, and routing is per repeat (a hash table row,
or the one gate, per call), as a per-layer router would route an unshared model's layers.

Dispatch (:mod:`distillery.moebert.experts`) never loops over tokens or experts: every layer
call of a forward pass is planned at once, all experts of a layer run as one batched matmul pair.

Gradient checkpointing (``gradient_checkpointing_enable``) recomputes a layer with the route of its
own call: each block of a family whose layers run once per pass reads its call's entry by position,
and the blocks keep the pass's routing after a training forward, for the backward's recomputation (so a
backward follows its own forward, as in every training loop). ALBERT, whose one layer runs
``num_hidden_layers`` times, is refused it with a sentence.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import Tensor, nn
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForQuestionAnswering,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
    PreTrainedConfig,
    PreTrainedModel,
)
from transformers import initialization as init
from transformers.configuration_utils import SubConfigSpec
from transformers.modeling_outputs import ModelOutput

from distillery.encoders import (
    encoder_layers,
    ffn_linears,
    ffn_width,
    layer_calls,
    layout_of,
    replace_submodule,
    submodule,
)
from distillery.errors import DistilleryError
from distillery.modeling import wants_dict
from distillery.moebert.experts import (  # noqa: F401  (re-exported)
    DispatchPlan,
    MoEFeedForward,
    SentenceGate,
    plan_dispatch,
)

from distillery.moebert.options import GATE_SCALES, ROUTINGS, SHARED_MODES  # the options' choices
# The family model reads these from encoder_config: set on a MoEBERT config, they are set there too.
_TASK_FIELDS = ("id2label", "label2id", "problem_type", "output_hidden_states", "output_attentions")


class MoEBertConfig(PreTrainedConfig):
    """The family's config (``encoder_config``) plus the mixture-of-experts shape.

    ``expert_size`` is ``d_e``, the neurons one token runs through (shared ones included);
    ``shared_size`` is ``s``; the teacher's FFN width ``d_h`` (what the experts were cut from) stays
    in ``encoder_config``. Attributes this config lacks are read from ``encoder_config``
    (``hidden_size``, ``vocab_size``, ``num_hidden_layers``, ...), and written there
    (``resize_token_embeddings`` sets ``vocab_size``), so code reading a teacher's config reads a
    student's the same way. The head's fields (labels, ``problem_type``) and the outputs asked for
    are the family model's to read: set on this config (``from_pretrained(..., num_labels=5)``), they
    are set on ``encoder_config`` too.
    """

    model_type = "moebert"
    sub_configs_defaults: ClassVar[dict] = {"encoder_config": SubConfigSpec(AutoConfig, model_type="bert")}

    encoder_config: dict | PreTrainedConfig | None = None
    num_experts: int = 4
    expert_size: int | None = None  # None: d_h // num_experts
    shared_size: int = 0
    shared_mode: str = "tied"
    routing: str = "hash-r"
    gate_scale: str = "prob"
    routing_seed: int = 0

    def __post_init__(self, **kwargs):
        if isinstance(self.encoder_config, dict):
            _register_type(self.encoder_config.get("model_type"))
        given = {name for name in ("id2label", "problem_type") if getattr(self, name) is not None}
        given |= {"id2label"} if kwargs.get("num_labels") is not None else set()
        super().__post_init__(**kwargs)
        for name in _TASK_FIELDS:  # what was given here is the head's; the rest is the encoder's
            if name in given or (name == "label2id" and "id2label" in given):
                setattr(self.encoder_config, name, getattr(self, name))
            else:
                object.__setattr__(self, name, getattr(self.encoder_config, name))
        d_h = self.ffn_width
        if self.expert_size is None:
            self.expert_size = default_expert_size(d_h, self.num_experts)
        problem = (expert_shape_problem(d_h, self.num_experts, self.expert_size, self.shared_size)
                   or choices_problem(self.routing, self.shared_mode, self.gate_scale))
        if problem:  # ValueError, as a config's validation raises: readers of config.json translate it
            raise ValueError(problem)

    def __setattr__(self, name: str, value):
        encoder = self.__dict__.get("encoder_config")
        if self.__dict__.get("_post_init_done") and isinstance(encoder, PreTrainedConfig):
            if name in _TASK_FIELDS:
                setattr(encoder, name, value)
            elif name not in self.__dict__ and not hasattr(type(self), name) and hasattr(encoder, name):
                setattr(encoder, name, value)
                return
        super().__setattr__(name, value)

    def __getattr__(self, name: str):
        encoder = self.__dict__.get("encoder_config")
        if name.startswith("__") or name == "encoder_config" or not isinstance(encoder, PreTrainedConfig):
            raise AttributeError(name)
        return getattr(encoder, name)

    @property
    def layout(self):
        return layout_of(self.encoder_config, "MoEBERT's encoder")

    @property
    def ffn_width(self) -> int:
        """d_h, the teacher's FFN width."""
        return ffn_width(self.layout, self.encoder_config)

    @property
    def own_size(self) -> int:
        """Neurons each expert holds in the module: its own ones (tied) or all d_e (cloned)."""
        return self.expert_size - self.shared_size if self.shared_mode == "tied" else self.expert_size

    @property
    def shared_block_size(self) -> int:
        return self.shared_size if self.shared_mode == "tied" else 0


def _register_type(model_type: str | None) -> None:
    """Make a student type (autotinybert, ...) known to AutoConfig before a config of it is read."""
    from transformers import CONFIG_MAPPING

    if model_type and model_type not in CONFIG_MAPPING:
        from distillery.modeling import register_models

        register_models()


# -- the experts' shape: N experts of d_e neurons, s of them shared, cut from a d_h-neuron FFN --------------

def shared_default(d_h: int) -> int:
    """s = d_h / 6 rounded to a multiple of 8 (the paper's 512 of 3072; 256 of MiniLM's 1536)."""
    return int(round(d_h / 6 / 8)) * 8


def default_expert_size(d_h: int, num_experts: int) -> int:
    """d_e = d_h / N: the experts together hold the FFN once (a count under 1 is refused by
    :func:`expert_shape_problem`, not here)."""
    return d_h // max(num_experts, 1)


def expert_shape_problem(d_h: int, num_experts: int, expert_size: int, shared_size: int) -> str | None:
    """The sentence saying why N experts of d_e neurons sharing s do not fit in a d_h-neuron FFN; None when they do."""
    if num_experts < 1:
        return f"The number of experts must be at least 1, got {num_experts}."
    if not 1 <= expert_size <= d_h:
        return f"The expert size must be between 1 and the FFN's {d_h} neurons, got {expert_size}."
    if not 0 <= shared_size <= expert_size:
        return f"The shared neurons ({shared_size}) must be between 0 and the expert size ({expert_size})."
    needed = shared_size + num_experts * (expert_size - shared_size)
    if needed > d_h:
        return (f"{num_experts} experts of {expert_size} neurons sharing {shared_size} need "
                f"{shared_size} + {num_experts}×{expert_size - shared_size} = {needed} distinct neurons, "
                f"but the FFN has {d_h}; use fewer or smaller experts, or share more.")
    return None


def resolve_expert_shape(d_h: int, num_experts: int, expert_size: int | None = None,
                         shared_size: int | None = None) -> tuple[int, int, int]:
    """(N, d_e, s) for a d_h-neuron FFN: d_e defaults to d_h / N, s to :func:`shared_default` capped at
    d_e; a :class:`DistilleryError` sentence when they do not fit."""
    expert_size = default_expert_size(d_h, num_experts) if expert_size is None else expert_size
    shared_size = min(shared_default(d_h), expert_size) if shared_size is None else shared_size
    problem = expert_shape_problem(d_h, num_experts, expert_size, shared_size)
    if problem:
        raise DistilleryError(problem)
    return num_experts, expert_size, shared_size


def choices_problem(routing: str, shared_mode: str, gate_scale: str) -> str | None:
    """The sentence naming a routing, shared mode or gate scale MoEBERT does not have; None when all are known."""
    for name, value, allowed in (("routing", routing, ROUTINGS), ("shared_mode", shared_mode, SHARED_MODES),
                                 ("gate_scale", gate_scale, GATE_SCALES)):
        if value not in allowed:
            return f"Unknown {name} {value!r}; choose one of {', '.join(allowed)}."
    return None


@dataclass
class Routing:
    """What the MoE blocks of one forward pass read: the real-token mask (B, T) and, per layer call
    in order, each token's expert and the dispatch plan (hash routing; Nones for the gate). Each
    block takes the next call's entry and leaves its gate's balance loss and, when ``record``, its
    token -> expert assignment."""

    mask: Tensor
    token_experts: list
    plans: list
    record: bool = False
    calls: int = 0
    balance: list = field(default_factory=list)
    assigned: list = field(default_factory=list)


class MoEBlock(nn.Module):
    """The MoE FFN standing where the family's FFN block was: the experts, the sentence gate (gate
    routing) and the hash table (token id -> expert; one row per call of the layer: ALBERT repeats its
    layer). Its routing is handed over by the model for each forward pass (``routing``)."""

    def __init__(self, config: MoEBertConfig, hidden_size: int, activation: str, calls: list[int], glu: bool,
                 bias: bool, dropout: float):
        super().__init__()
        std = getattr(config.encoder_config, "initializer_range", 0.02)
        self.experts = MoEFeedForward(hidden_size, config.num_experts, config.own_size, config.shared_block_size,
                                      activation, glu=glu, bias=bias, dropout=dropout, std=std)
        self.gate = (SentenceGate(hidden_size, config.num_experts, config.gate_scale == "straight-through")
                     if config.routing == "gate" else None)
        # token id -> expert, seeded by the call's depth; a buffer, saved with the weights and moved with the model
        self.calls, self.num_experts, self.routing_seed = list(calls), config.num_experts, config.routing_seed
        self.register_buffer("hash_table", self.seeded_table(config.vocab_size))
        self.routing: Routing | None = None

    def seeded_table(self, vocab_size: int) -> Tensor:
        """The random (hash-r) table of each of this block's calls for ``vocab_size`` tokens; (V,) for one call."""
        tables = [torch.randint(0, self.num_experts, (vocab_size,),
                                generator=torch.Generator().manual_seed(self.routing_seed * 1000 + c)) for c in self.calls]
        return tables[0] if len(tables) == 1 else torch.stack(tables)

    def resize_table(self, vocab_size: int) -> None:
        """The tables for a resized vocabulary: the kept tokens keep their experts, new ones are seeded."""
        old, new = self.hash_table, self.seeded_table(vocab_size).to(self.hash_table.device)
        kept = min(old.shape[-1], vocab_size)
        new[..., :kept] = old[..., :kept]
        self.hash_table = new

    def table(self, repeat: int) -> Tensor:
        """The hash table of this block's ``repeat``-th call."""
        return self.hash_table if self.hash_table.dim() == 1 else self.hash_table[repeat]

    def forward(self, x: Tensor) -> Tensor:
        """x: (B, T, d), the family's FFN input -> the FFN output (B, T, d)."""
        routing = self.routing
        if routing is None:
            raise RuntimeError("A MoEBERT FFN runs inside its model, which routes the tokens; call the model.")
        # a block run once per pass reads its own call's entry, so that a checkpointed layer's
        # recomputation in the backward takes the route the forward took; ALBERT's repeats count calls
        call = self.calls[0] if len(self.calls) == 1 else routing.calls
        routing.calls += 1
        token_expert, plan = routing.token_experts[call], routing.plans[call]
        sentence_expert = scale = None
        if self.gate is not None:
            sentence_expert, scale, balance = self.gate(x, routing.mask)
            routing.balance.append(balance)
            token_expert = sentence_expert[:, None].expand(routing.mask.shape)  # (B, T)
            if x.shape[0] > 1 or torch.compiler.is_exporting():
                plan = plan_dispatch(token_expert.reshape(1, -1), self.experts.num_experts, routing.mask.reshape(-1))[0]
        if routing.record:
            routing.assigned.append(token_expert)
        # forward, not __call__: the block's own call already ran the module machinery (~5 µs a layer at batch 1)
        return self.experts.forward(x, plan, sentence_expert, scale)


def install_experts(family: PreTrainedModel, config: MoEBertConfig) -> list[MoEBlock]:
    """Replace each layer's FFN of ``family`` (a model of ``config.encoder_config``) by a MoE block
    of ``config``'s shape, with fresh weights; returns the blocks in layer order."""
    layout = config.layout
    if layout.ffn_block is None:
        raise ValueError(f"The {layout.family} layout does not say where its FFN block is; MoEBERT cannot replace it.")
    activation = getattr(config.encoder_config, layout.activation_key)
    calls = layer_calls(family)
    blocks = []
    for k, layer in enumerate(encoder_layers(family)):
        w1, _ = ffn_linears(layout, layer)
        site = submodule(layer, layout.ffn_block)
        dropout = next((m.p for m in site.modules() if isinstance(m, nn.Dropout)), 0.0)
        block = MoEBlock(config, w1.in_features, activation, [c for c, i in enumerate(calls) if i == k], layout.glu,
                         w1.bias is not None, dropout)
        replace_submodule(layer, layout.ffn_block, block)
        for path in layout.ffn_rest:
            replace_submodule(layer, path, nn.Identity())
        blocks.append(block)
    for module in family.modules():  # a chunked FFN would call a block once per chunk: the output is the same unchunked
        if hasattr(module, "chunk_size_feed_forward"):
            module.chunk_size_feed_forward = 0
    config.encoder_config.chunk_size_feed_forward = 0
    return blocks


# ------------------------------------------------------------------------------------------------
# Models


@dataclass
class MoEBertModelOutput(ModelOutput):
    last_hidden_state: Tensor | None = None
    pooler_output: Tensor | None = None
    hidden_states: tuple[Tensor, ...] | None = None
    attentions: tuple[Tensor, ...] | None = None
    balance_loss: Tensor | None = None  # sum over layer calls (gate routing), else None
    expert_load: Tensor | None = None  # (layer calls, experts): real tokens routed to each expert


@dataclass
class MoEBertSequenceClassifierOutput(ModelOutput):
    loss: Tensor | None = None
    logits: Tensor | None = None
    hidden_states: tuple[Tensor, ...] | None = None
    attentions: tuple[Tensor, ...] | None = None
    balance_loss: Tensor | None = None
    expert_load: Tensor | None = None


@dataclass
class MoEBertTokenClassifierOutput(ModelOutput):
    loss: Tensor | None = None
    logits: Tensor | None = None  # (B, T, labels): one tag distribution a token
    hidden_states: tuple[Tensor, ...] | None = None
    attentions: tuple[Tensor, ...] | None = None
    balance_loss: Tensor | None = None
    expert_load: Tensor | None = None


@dataclass
class MoEBertQuestionAnsweringOutput(ModelOutput):
    loss: Tensor | None = None
    start_logits: Tensor | None = None
    end_logits: Tensor | None = None
    hidden_states: tuple[Tensor, ...] | None = None
    attentions: tuple[Tensor, ...] | None = None
    balance_loss: Tensor | None = None
    expert_load: Tensor | None = None


# Inputs a family's forward may not take (DistilBERT, ModernBERT: no token types): dropped for it.
_OPTIONAL_INPUTS = ("token_type_ids", "position_ids")


class MoEBertPreTrainedModel(PreTrainedModel):
    """A family's Hugging Face model (``FAMILY_HEAD``'s class for ``config.encoder_config``) with MoE
    FFNs. Its children are the family model's, under their own names; ``forward`` routes the tokens
    (every layer call planned at once for hash routing), hands the routing to the blocks and runs the
    family's forward."""

    config_class = MoEBertConfig
    config: MoEBertConfig
    base_model_prefix = "moebert"  # each instance takes its family's (bert, roberta, model, ...)
    main_input_name = "input_ids"
    supports_gradient_checkpointing = True
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_attention_backend = True
    FAMILY_HEAD: ClassVar[Any] = AutoModel
    OUTPUT: ClassVar[type] = MoEBertModelOutput

    def __init__(self, config: MoEBertConfig, family: PreTrainedModel | None = None):
        """``family``: the family model with its MoE blocks installed, to wrap as it is (the base model of
        a head, :attr:`base_model`); else one is built from the config."""
        super().__init__(config)
        if family is None:
            try:
                family_class = self.FAMILY_HEAD._model_mapping[type(config.encoder_config)]
            except KeyError:
                raise ValueError(f"{config.encoder_config.model_type} has no {self.FAMILY_HEAD.__name__} class, so "
                                 f"{type(self).__name__} has no family model to build.") from None
            family = family_class(config.encoder_config)
            blocks = install_experts(family, config)
        else:
            blocks = [submodule(layer, config.layout.ffn_block) for layer in encoder_layers(family)]
        for name, child in list(family.named_children()):
            self.add_module(name, child)
        self.base_model_prefix = family.base_model_prefix
        for attr in ("_keys_to_ignore_on_load_unexpected", "_keys_to_ignore_on_load_missing"):
            setattr(self, attr, getattr(family, attr, None))
        object.__setattr__(self, "_family", family)  # not a child: its children are ours
        for module in family.modules():  # transformers initialises a sub-model (a head's base) with its own function
            if isinstance(module, PreTrainedModel):
                object.__setattr__(module, "_init_weights", self._init_weights)
        calls = layer_calls(family)
        repeat = [calls[:c].count(k) for c, k in enumerate(calls)]
        object.__setattr__(self, "_calls", [(blocks[k], r) for k, r in zip(calls, repeat)])
        object.__setattr__(self, "_blocks", blocks)
        named = inspect.signature(family.forward).parameters
        object.__setattr__(self, "_dropped", tuple(k for k in _OPTIONAL_INPUTS if k not in named))
        self.post_init()

    def train(self, mode: bool = True):
        super().train(mode)
        self._family.training = mode  # the family's own forward reads it at its top
        return self

    @property
    def base_model(self) -> "MoEBertModel":
        """The MoEBERT model under a head (sharing its modules): what it saves is a MoEBERT folder that
        the head loads back. The family's own base model would save a family folder with MoE blocks."""
        inner = getattr(self, self.base_model_prefix, None)
        if isinstance(self, MoEBertModel) or not isinstance(inner, PreTrainedModel):
            return self
        view = self.__dict__.get("_base_view")
        if view is None or view._family is not inner:
            with init.no_init_weights():
                view = MoEBertModel(self.config, family=inner)
            object.__setattr__(self, "_base_view", view)
        view.training = self.training  # its modules are the head's; its own flag follows the head's
        return view

    @torch.no_grad()
    def _init_weights(self, module):
        """The family's initialisation (its embeddings' position and token type buffers included), the
        experts drawn as the family draws its FFN, the gates', and the seeded hash tables."""
        if isinstance(module, MoEBlock):
            init.copy_(module.hash_table, module.seeded_table(module.hash_table.shape[-1]))
        elif isinstance(module, MoEFeedForward):
            std = getattr(self.config.encoder_config, "initializer_range", 0.02)
            for name, p in module.named_parameters(recurse=False):
                if name.startswith("b") or name.endswith("b1"):
                    init.zeros_(p)
                else:
                    init.normal_(p, mean=0.0, std=std)
        else:  # the family class's own function: the instances' are this one (see __init__)
            type(self._family)._init_weights(self._family, module)

    def gradient_checkpointing_enable(self, *args, **kwargs):
        if any(len(block.calls) > 1 for block in self._blocks):
            raise ValueError("MoEBERT cannot checkpoint a family whose layers run several times per pass (ALBERT): "
                             "a recomputed call could not tell which repeat it is.")
        super().gradient_checkpointing_enable(*args, **kwargs)

    def resize_token_embeddings(self, new_num_tokens=None, pad_to_multiple_of=None, mean_resizing=True):
        """The family's embeddings, then every hash table to the new vocabulary (new tokens seeded)."""
        embeddings = super().resize_token_embeddings(new_num_tokens, pad_to_multiple_of, mean_resizing)
        for block in self._blocks:
            block.resize_table(embeddings.num_embeddings)
        return embeddings

    @property
    def moe_layers(self) -> list[MoEBlock]:
        """The MoE blocks, one per layer of the family's layer list (ALBERT: of its shared group)."""
        return list(self._blocks)

    @property
    def moe_calls(self) -> list[tuple[MoEBlock, int]]:
        """(block, repeat) of every layer call of a forward pass, in order."""
        return list(self._calls)

    def get_input_embeddings(self):
        return self._family.get_input_embeddings()

    def set_input_embeddings(self, value):
        self._family.set_input_embeddings(value)

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

    def hash_routes(self, input_ids: Tensor | None, mask: Tensor) -> tuple[list, list]:
        """Per layer call: each token's expert (B, T) and the dispatch plan (hash routing); Nones for the gate."""
        n = len(self._calls)
        if self.config.routing == "gate":
            return [None] * n, [None] * n
        if input_ids is None:
            raise ValueError("hash routing assigns experts by token id: pass input_ids, not inputs_embeds.")
        ids = input_ids.reshape(-1)
        experts = torch.stack([block.table(r).index_select(0, ids) for block, r in self._calls])  # (calls, B·T)
        plans = plan_dispatch(experts, self.config.num_experts, mask.reshape(-1))
        return list(experts.view(n, *input_ids.shape).unbind(0)), plans

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None,
                inputs_embeds=None, output_hidden_states=None, output_expert_load=False, return_dict=None, **kwargs):
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("Pass exactly one of input_ids and inputs_embeds.")
        reference = input_ids if input_ids is not None else inputs_embeds
        mask = (attention_mask if attention_mask is not None
                else torch.ones(reference.shape[:2], dtype=torch.long, device=reference.device))
        token_experts, plans = self.hash_routes(input_ids, mask)
        routing = Routing(mask, token_experts, plans, record=output_expert_load)
        given = {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids,
                 "position_ids": position_ids, "inputs_embeds": inputs_embeds, "output_hidden_states": output_hidden_states}
        inputs = {k: v for k, v in {**given, **kwargs}.items() if v is not None and k not in self._dropped}
        blocks = self._blocks
        for block in blocks:  # object.__setattr__: a plain attribute, without nn.Module's checks (~1 µs each)
            object.__setattr__(block, "routing", routing)
        # the backward recomputes with this routing (transformers' own property for this is renamed in 5.x and warns)
        recomputed = self.training and any(getattr(m, "gradient_checkpointing", False) for m in self.modules())
        try:
            out = self._family(**inputs)
        finally:
            if not recomputed:
                for block in blocks:
                    object.__setattr__(block, "routing", None)
        if routing.calls != len(self._calls):
            raise RuntimeError(f"{routing.calls} MoE FFN calls in a forward pass; the model expected {len(self._calls)}.")
        fields = {name: out.get(name) for name in self.OUTPUT.FAMILY_FIELDS}
        result = self.OUTPUT(**fields, balance_loss=torch.stack(routing.balance).sum() if routing.balance else None,
                             expert_load=torch.stack([_expert_load(t, mask, self.config.num_experts)
                                                      for t in routing.assigned]) if output_expert_load else None)
        return result if wants_dict(return_dict, self.config) else result.to_tuple()


for _output in (MoEBertModelOutput, MoEBertSequenceClassifierOutput, MoEBertTokenClassifierOutput,
                MoEBertQuestionAnsweringOutput):
    # the fields read from the family model's output (the rest are the mixture's own)
    _output.FAMILY_FIELDS = tuple(n for n in _output.__dataclass_fields__ if n not in ("balance_loss", "expert_load"))


def _expert_load(token_expert: Tensor, mask: Tensor, num_experts: int) -> Tensor:
    """Real (unmasked) tokens sent to each expert: (N,)."""
    return torch.bincount(token_expert[mask.bool()], minlength=num_experts)


class MoEBertModel(MoEBertPreTrainedModel):
    FAMILY_HEAD = AutoModel
    OUTPUT = MoEBertModelOutput


class MoEBertForSequenceClassification(MoEBertPreTrainedModel):
    FAMILY_HEAD = AutoModelForSequenceClassification
    OUTPUT = MoEBertSequenceClassifierOutput


class MoEBertForTokenClassification(MoEBertPreTrainedModel):
    FAMILY_HEAD = AutoModelForTokenClassification
    OUTPUT = MoEBertTokenClassifierOutput


class MoEBertForQuestionAnswering(MoEBertPreTrainedModel):
    FAMILY_HEAD = AutoModelForQuestionAnswering
    OUTPUT = MoEBertQuestionAnsweringOutput


AutoConfig.register("moebert", MoEBertConfig, exist_ok=True)
AutoModel.register(MoEBertConfig, MoEBertModel, exist_ok=True)
AutoModelForSequenceClassification.register(MoEBertConfig, MoEBertForSequenceClassification, exist_ok=True)
AutoModelForTokenClassification.register(MoEBertConfig, MoEBertForTokenClassification, exist_ok=True)
AutoModelForQuestionAnswering.register(MoEBertConfig, MoEBertForQuestionAnswering, exist_ok=True)
