"""Where each encoder family keeps its parts: the one place that knows the Hugging Face layouts.

A method reads a teacher only through :func:`layout_of` and the accessors below, never through a
``model_type`` list of its own: supporting a new family is one :class:`EncoderLayout` entry here.
Paths are attribute paths (``"encoder.layer"``, ``"intermediate.dense"``): ``layers`` and
``embedding_projection`` from the base model (``model.base_model``), the rest from one layer.

The families, as transformers 5 writes them:

- bert, roberta (xlm-roberta, camembert), electra (its embeddings may be narrower than the
  encoder: ``embeddings_project``), mpnet (one relative-attention bias, ``encoder.relative_attention_bias``,
  shared by every layer, with a column per head), deberta-v2 (disentangled relative attention whose
  ``encoder.rel_embeddings`` all layers share): post-LayerNorm layers with ``intermediate.dense`` ->
  activation -> ``output.dense``.
- distilbert: ``transformer.layer``, ``ffn.lin1``/``ffn.lin2``, no token types.
- albert: one shared layer group applied ``num_hidden_layers`` times (``shared_layers``); its layer
  list is the group's, and depth is the number of repeats.
- modernbert: pre-LayerNorm, a fused ``attn.Wqkv``, a GLU FFN whose ``mlp.Wi`` stacks the input rows
  over the gate rows (neuron j is rows j and I + j), rotary positions, alternating local/global
  attention, no token types, no biases.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from distillery.errors import DistilleryError

# How a family encodes positions: what a method that slices heads or drops layers must carry along.
POSITION_SCHEMES = ("absolute", "absolute-after-padding", "relative-bias", "disentangled", "rotary")


@dataclass(frozen=True)
class EncoderLayout:
    """One encoder family's layout (see the module docstring for the path conventions)."""

    family: str
    model_types: tuple[str, ...]
    layers: str  # the ModuleList of layers, from the base model
    query: str | None  # None where the projections are fused (qkv)
    key: str | None
    value: str | None
    attention_out: str
    ffn_in: str
    ffn_out: str
    attention_norm: str | None
    ffn_norm: str | None
    positions: str = "absolute"
    qkv: str | None = None  # a fused [q; k; v] projection (rows stacked in that order)
    glu: bool = False  # ffn_in stacks input rows over gate rows: act(in) * gate
    pre_norm: bool = False
    token_types: bool = True
    activation_key: str = "hidden_act"  # the config field naming the FFN activation
    ffn_width_key: str = "intermediate_size"  # the config field of the FFN width
    embedding_projection: str | None = None  # embeddings narrower than the encoder, projected up
    shared_layers: bool = False  # one group of layers applied num_hidden_layers times (ALBERT)
    relative_bias: str | None = None  # a per-head bias table all layers share (MPNet), from the base model
    # Embeddings, from the base model (an optional path that the model lacks reads as absent: DeBERTa-v2
    # has position or token-type embeddings only when its config asks for them).
    word_embeddings: str = "embeddings.word_embeddings"
    position_embeddings: str | None = "embeddings.position_embeddings"
    token_type_embeddings: str | None = "embeddings.token_type_embeddings"
    embedding_norm: str = "embeddings.LayerNorm"
    final_norm: str | None = None  # a norm after the last layer (pre-norm families), from the base model
    # DeBERTa-v2's shared relative-position embeddings and their norm, from the base model; and a layer's own
    # projections of them when the config does not share the content ones (share_att_key false)
    relative_embeddings: str | None = None
    relative_norm: str | None = None
    position_key: str | None = None
    position_query: str | None = None
    # The sequence-classification head, from the task model: a dense layer on the pooled token (then its
    # activation, and a norm), and the linear layer to the labels; QA reads every token through qa_outputs, token
    # classification through token_classifier (every family's token model names it "classifier").
    pooler_dense: str | None = None
    pooler_activation: str = "tanh"  # a name, or "config:<key>" for the config field naming it
    pooler_norm: str | None = None
    classifier: str = "classifier"
    qa_outputs: str = "qa_outputs"
    token_classifier: str = "classifier"
    # the QA and token-classification models run the pooler's dense / activation / norm on every token first
    qa_token_head: bool = False
    pooling_key: str | None = None  # the config field choosing "cls" or "mean" pooling (default: cls)
    # absolute positions numbered after this fixed padding index whatever pad_token_id is (MPNet's embeddings: 1);
    # "absolute-after-padding" families number them after pad_token_id
    position_padding_idx: int | None = None

    @property
    def offset_positions(self) -> bool:
        """Whether absolute positions count from the embeddings' padding index + 1 (RoBERTa, MPNet)."""
        return self.positions == "absolute-after-padding" or self.position_padding_idx is not None
    # The FFN as one replaceable piece (MoEBERT): ``ffn_block`` receives the FFN input; a module put in its
    # place returns the FFN's output (``ffn_out`` included, before any dropout, residual or LayerNorm the
    # layer adds), and the modules in ``ffn_rest`` (what ran after it up to ``ffn_out``) become identities.
    ffn_block: str | None = None
    ffn_rest: tuple[str, ...] = ()
    # A distillery student's layout: its layers and FFN are where this says (methods that drop layers or
    # replace FFNs read it), but its attention and positions are its config's, not a family's.
    student: bool = False

    def __post_init__(self):
        if self.positions not in POSITION_SCHEMES:
            raise ValueError(f"positions must be one of {POSITION_SCHEMES}, got {self.positions!r}")


_BERT_LIKE = dict(query="attention.self.query", key="attention.self.key", value="attention.self.value",
                  attention_out="attention.output.dense", ffn_in="intermediate.dense", ffn_out="output.dense",
                  attention_norm="attention.output.LayerNorm", ffn_norm="output.LayerNorm", layers="encoder.layer",
                  ffn_block="intermediate", ffn_rest=("output.dense",))

LAYOUTS = (
    EncoderLayout("bert", ("bert",), pooler_dense="bert.pooler.dense", **_BERT_LIKE),
    EncoderLayout("roberta", ("roberta", "xlm-roberta", "camembert"), positions="absolute-after-padding",
                  pooler_dense="classifier.dense", classifier="classifier.out_proj",
                  **_BERT_LIKE),
    EncoderLayout("electra", ("electra",), embedding_projection="embeddings_project", pooler_dense="classifier.dense",
                  pooler_activation="gelu", classifier="classifier.out_proj", **_BERT_LIKE),
    EncoderLayout("distilbert", ("distilbert",), layers="transformer.layer", query="attention.q_lin",
                  key="attention.k_lin", value="attention.v_lin", attention_out="attention.out_lin",
                  ffn_in="ffn.lin1", ffn_out="ffn.lin2", attention_norm="sa_layer_norm",
                  ffn_norm="output_layer_norm", token_types=False, activation_key="activation",
                  ffn_width_key="hidden_dim", token_type_embeddings=None, pooler_dense="pre_classifier",
                  pooler_activation="relu", ffn_block="ffn.lin1", ffn_rest=("ffn.activation", "ffn.lin2")),
    EncoderLayout("albert", ("albert",), layers="encoder.albert_layer_groups.0.albert_layers",
                  query="attention.query", key="attention.key", value="attention.value",
                  attention_out="attention.dense", ffn_in="ffn", ffn_out="ffn_output",
                  attention_norm="attention.LayerNorm", ffn_norm="full_layer_layer_norm",
                  embedding_projection="encoder.embedding_hidden_mapping_in", shared_layers=True,
                  pooler_dense="albert.pooler", ffn_block="ffn", ffn_rest=("activation", "ffn_output")),
    EncoderLayout("deberta-v2", ("deberta-v2",), positions="disentangled", relative_embeddings="encoder.rel_embeddings",
                  relative_norm="encoder.LayerNorm", position_key="attention.self.pos_key_proj",
                  position_query="attention.self.pos_query_proj", pooler_dense="pooler.dense",
                  pooler_activation="config:pooler_hidden_act",
                  **{**_BERT_LIKE, "query": "attention.self.query_proj", "key": "attention.self.key_proj",
                     "value": "attention.self.value_proj"}),
    EncoderLayout("mpnet", ("mpnet",), positions="relative-bias", relative_bias="encoder.relative_attention_bias",
                  token_types=False, token_type_embeddings=None, position_padding_idx=1,
                  pooler_dense="classifier.dense", classifier="classifier.out_proj",
                  **{**_BERT_LIKE, "query": "attention.attn.q", "key": "attention.attn.k", "value": "attention.attn.v",
                     "attention_out": "attention.attn.o", "attention_norm": "attention.LayerNorm"}),
    EncoderLayout("modernbert", ("modernbert",), layers="layers", query=None, key=None, value=None,
                  qkv="attn.Wqkv", attention_out="attn.Wo", ffn_in="mlp.Wi", ffn_out="mlp.Wo",
                  attention_norm="attn_norm", ffn_norm="mlp_norm", positions="rotary", glu=True, pre_norm=True,
                  token_types=False, activation_key="hidden_activation", word_embeddings="embeddings.tok_embeddings",
                  position_embeddings=None, token_type_embeddings=None, embedding_norm="embeddings.norm",
                  final_norm="final_norm", pooler_dense="head.dense", pooler_activation="config:classifier_activation",
                  pooler_norm="head.norm", pooling_key="classifier_pooling", qa_outputs="classifier",
                  qa_token_head=True, ffn_block="mlp", ffn_rest=()),
)
# The AutoTinyBERT student: BERT's parameter names; unsliced, it calls its FFN pieces as modules (act included).
STUDENT_LAYOUTS = (
    EncoderLayout("autotinybert", ("autotinybert",), student=True,
                  **{**_BERT_LIKE, "ffn_block": "intermediate.dense", "ffn_rest": ("act", "output.dense")}),
)
FAMILIES = tuple(layout.family for layout in LAYOUTS)
_BY_TYPE = {model_type: layout for layout in LAYOUTS + STUDENT_LAYOUTS for model_type in layout.model_types}


def supported_types() -> tuple[str, ...]:
    return tuple(_BY_TYPE)


def layout_of(config_or_type, name: str = "the teacher") -> EncoderLayout:
    """The layout of a config's (or a model type's) family; a sentence naming it when it has none."""
    model_type = config_or_type if isinstance(config_or_type, str) else getattr(config_or_type, "model_type", None)
    if model_type not in _BY_TYPE:
        raise DistilleryError(f"{name} is a {model_type!r} model, not an encoder family distillery knows "
                              f"({', '.join(FAMILIES)}; a decoder such as GPT-2 has no encoder layout).")
    return _BY_TYPE[model_type]


def submodule(root: nn.Module, path: str) -> nn.Module:
    """``root``'s module at the attribute path ``path`` (``"encoder.layer"``; digits index lists)."""
    module = root
    for part in path.split("."):
        module = module[int(part)] if part.isdigit() else getattr(module, part)
    return module


def optional_submodule(root: nn.Module, path: str | None) -> nn.Module | None:
    """``root``'s module at ``path``, or None where the path is None or the model lacks it (or holds None)."""
    if path is None:
        return None
    try:
        return submodule(root, path)
    except (AttributeError, IndexError):
        return None


def replace_submodule(root: nn.Module, path: str, new: nn.Module) -> None:
    """Put ``new`` at ``path`` under ``root``."""
    parent_path, _, last = path.rpartition(".")
    parent = submodule(root, parent_path) if parent_path else root
    if last.isdigit():
        parent[int(last)] = new
    else:
        setattr(parent, last, new)


def encoder_layers(model: nn.Module) -> nn.ModuleList:
    """The ModuleList of a model's transformer layers (for ALBERT: the shared group's layers)."""
    layout = layout_of(model.config)
    return submodule(model.base_model, layout.layers)


def layers_prefix(model: nn.Module) -> str:
    """The state-dict prefix of the layer list in ``model`` (``bert.encoder.layer``, ``model.layers``)."""
    layout = layout_of(model.config)
    base = getattr(model, "base_model_prefix", "")
    return f"{base}.{layout.layers}" if base and model.base_model is not model else layout.layers


def ffn_linears(layout: EncoderLayout, layer: nn.Module) -> tuple[nn.Linear, nn.Linear]:
    """A layer's FFN projections (in, out); with ``layout.glu`` the in projection's rows are the
    input rows followed by the gate rows."""
    return submodule(layer, layout.ffn_in), submodule(layer, layout.ffn_out)


def layer_calls(model: nn.Module) -> list[int]:
    """The index into :func:`encoder_layers` of each layer call of one forward pass, in order: each
    layer once, or for shared layers (ALBERT) the group's layers once per repeat."""
    n = len(encoder_layers(model))
    if not layout_of(model.config).shared_layers:
        return list(range(n))
    return [k for _ in range(model.config.num_hidden_layers) for k in range(n)]


def ffn_width(layout: EncoderLayout, config) -> int:
    return int(getattr(config, layout.ffn_width_key))


def encoder_flops(config, seq: int) -> float:
    """Multiply-adds a token of ``config``'s encoder at ``seq`` tokens: per layer the Q, K, V and output
    projections, attention scores and mixing, and the FFN (1.5× for a GLU); what ``--method auto``'s FLOP-ideal
    speed-ups divide."""
    layout = layout_of(config)
    layers, d = int(config.num_hidden_layers), int(config.hidden_size)
    glu = 1.5 if layout.glu else 1.0
    return float(layers * (4 * d * d + 2 * seq * d + glu * 2 * d * ffn_width(layout, config)))


def is_distillery_student(config) -> bool:
    """Whether ``config`` is one of distillery's own student types (registered by its method packages)."""
    return type(config).__module__.startswith("distillery.")


def require(config, families: tuple[str, ...] | None, user: str) -> EncoderLayout:
    """The teacher's layout, for a method (``user``) that restructures it; a sentence when the teacher has
    none (a distillery student without a layout, a decoder) or is not among ``families`` (None: any)."""
    if is_distillery_student(config) and getattr(config, "model_type", None) not in _BY_TYPE:
        raise DistilleryError(f"{user} restructures the teacher's encoder layers, and a distillery "
                              f"{config.model_type!r} student has no encoder layout it can read: use a method that "
                              f"needs only the teacher's outputs (cmow) on it.")
    layout = layout_of(config)
    if families is not None and layout.family not in families:
        raise DistilleryError(f"{user} supports {', '.join(families)} encoders only, and the teacher is a "
                              f"{config.model_type!r} ({layout.family} family) model.")
    return layout
