"""Bidirectional CMOW/CBOW-Hybrid: an attention-free student of matrix and vector word embeddings.

Every token id owns a d×d matrix per direction (CMOW) and a vector (CBOW). A sentence is

    h = flatten(X^fw_1 ⋯ X^fw_n) ‖ flatten(X^bw_n ⋯ X^bw_1) ‖ Σ_j x_j          (hybrid, bidirectional)

and the per-token representation used for masked-LM pretraining is, at position i (both directions
include token i, and both halves describe the *same* position — the paper's code pairs mirrored
positions instead):

    h_i = flatten(X^fw_1 ⋯ X^fw_i) ‖ flatten(X^bw_n ⋯ X^bw_i) ‖ Σ_{j≤i} x_j ‖ Σ_{j≥i} x_j

Implementation choices (why):

- Matrices are stored as deviations Δ from the identity (X = I + Δ), in an ``nn.Embedding`` whose
  padding row is Δ = 0: padding is exactly the identity matrix (and the zero vector) — its gradient is
  zero and weight decay pulls a zero row nowhere, so it cannot drift. Masked positions (padding, or
  the other sentence of a DiffCat pair) are mapped to the padding id before the lookup, so "padded ==
  unpadded" holds by construction. Weight decay on Δ regularises towards the identity.
- Embedding dropout acts on Δ, not on X: dropping a diagonal 1 would zero a whole direction of the
  product, which is not "mild" noise.
- The sequence product is a batched tree reduction (adjacent pairs multiplied level by level:
  ⌈log2 n⌉ batched matmuls), the per-token prefix/suffix products a Hillis–Steele scan (⌈log2 n⌉
  steps, no loop over positions). Products are computed in fp32 whatever the model's dtype.
- Sentence pairs: ``joint`` encodes the BERT-style ``[CLS] A [SEP] B [SEP]`` sequence as one;
  ``diffcat`` encodes A and B on their own from the same joint encoding (segments by
  ``token_type_ids``, or by the first separator when a tokenizer has none) and feeds
  ``h_A ‖ |h_A − h_B| ‖ h_B`` to the head. Teacher and student thus read the same encoded examples.
- Regression as classification (STS-B, as in the paper): ``score_bins`` holds the bin values; the
  head predicts a distribution over bins, ``logits`` is its expected score (what metrics read) and
  ``bin_logits`` the distribution's logits.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from huggingface_hub.dataclasses import strict
from huggingface_hub.errors import StrictDataclassClassValidationError
from torch import Tensor, nn
from transformers import (AutoConfig, AutoModel, AutoModelForMaskedLM, AutoModelForSequenceClassification,
                          AutoModelForTokenClassification, PreTrainedConfig, PreTrainedModel)
from transformers import initialization as init
from transformers.loss.loss_utils import ForSequenceClassificationLoss, ForTokenClassification
from transformers.modeling_outputs import ModelOutput, TokenClassifierOutput

from distillery.training.losses import soft_cross_entropy_to
from distillery.errors import DistilleryError
from distillery.modeling import OnnxSpec, wants_dict

from distillery.cmow.heads import TAG_HEADS, BiLSTMHead, CNNHead, make_head, make_tag_head  # noqa: F401 (re-exported)
from distillery.cmow.options import COMPONENTS, HEADS, PAIR_MODES  # noqa: F401 (the options' choices)
from distillery.cmow.products import (  # noqa: F401 (re-exported)
    EXPORT_CHUNK,
    EXPORT_MAX_LENGTH,
    _tree_product_fixed_depth,
    identity_like,
    prefix_products,
    suffix_products,
    tree_product,
)

# Token embeddings past this size cannot be meant: the paper's d = 20 over BERT's 30522 tokens is
# 0.1 GB, while a typo such as matrix_dim=100000 would ask for petabytes (refused before allocating).
MAX_EMBEDDING_BYTES = 64 * 2**30


@strict
class CMOWConfig(PreTrainedConfig):
    """The CMOW/CBOW-Hybrid encoder and its head.

    ``matrix_dim`` is d (each token has a d×d matrix per direction), ``vector_dim`` the CBOW size.
    ``init_std`` is σ of the initial deviation from the identity. ``head``: linear probe, MLP
    (``head_hidden`` units), 2D-CNN over the aggregated matrices, or BiLSTM over the token
    embeddings (``head_hidden`` units per direction).
    """

    model_type = "cmow"
    # The exported graph multiplies in blocks of EXPORT_CHUNK tokens (see tree_product). int8: torch's.
    # ONNX Runtime runs the many small matrix products slower than torch's batched matmul (SST-2
    # student, 2 cores: torch int8 0.8 ms at 1×128 and 8161 sentences/s at 256×64, ORT int8 1.0 ms
    # and 3300/s; benchmarks/deploy.py). A class attribute, not a field: it is not saved in config.json.
    onnx_export = OnnxSpec(seq_multiple=EXPORT_CHUNK, max_length=EXPORT_MAX_LENGTH, int8="torch-int8")

    vocab_size: int = 30522
    component: str = "hybrid"
    bidirectional: bool = True
    matrix_dim: int = 20
    vector_dim: int = 400
    init_std: float = 0.01
    vector_init_std: float = 0.1
    dropout: float = 0.1
    pair_mode: str = "joint"
    head: str = "mlp"
    head_hidden: int = 1000
    lstm_hidden: int = 256  # per direction; the paper's (3 × the embedding size) is hours per epoch on a CPU
    head_dropout: float = 0.2
    score_bins: list[float] | None = None
    pad_token_id: int | None = 0
    sep_token_id: int | None = 102

    def validate_architecture(self):
        super().validate_architecture()
        for name, value, allowed in (("component", self.component, COMPONENTS), ("pair_mode", self.pair_mode, PAIR_MODES),
                                     ("head", self.head, HEADS)):
            if value not in allowed:
                raise ValueError(f"Unknown CMOW {name} {value!r}; choose one of {', '.join(allowed)}.")
        if self.uses_matrices and self.matrix_dim < 1:
            raise ValueError(f"The CMOW matrix side d must be at least 1, got {self.matrix_dim}.")
        if self.uses_vectors and self.vector_dim < 1:
            raise ValueError(f"The CBOW vector size must be at least 1, got {self.vector_dim}.")
        if self.vocab_size < 1:
            raise ValueError(f"The vocabulary must have at least one token, got {self.vocab_size}.")
        if self.embedding_bytes > MAX_EMBEDDING_BYTES:
            raise ValueError(
                f"CMOW with matrix_dim={self.matrix_dim} and vector_dim={self.vector_dim} over {self.vocab_size} tokens "
                f"needs about {_gigabytes(self.embedding_bytes)} of embeddings (4 bytes x vocabulary x "
                f"({self.directions} x matrix_dim^2 + vector_dim)), more than the {_gigabytes(MAX_EMBEDDING_BYTES)} "
                f"allowed; choose a smaller matrix_dim (the paper's is 20).")
        if self.pad_token_id is None or not 0 <= self.pad_token_id < self.vocab_size:
            raise ValueError(f"CMOW needs a padding id inside the vocabulary (its identity row), got {self.pad_token_id}.")
        if not 0 <= self.dropout < 1 or not 0 <= self.head_dropout < 1:
            raise ValueError(f"Dropout must be in [0, 1), got {self.dropout} and {self.head_dropout}.")
        if self.head == "cnn" and self.component != "cmow" and self.uses_vectors and self.vector_dim != self.matrix_dim ** 2:
            raise ValueError(f"The CNN head reads the CBOW vector as a {self.matrix_dim}×{self.matrix_dim} map: "
                             f"vector_dim must be {self.matrix_dim ** 2}, got {self.vector_dim}.")
        if self.score_bins is not None and len(self.score_bins) < 2:
            raise ValueError("score_bins needs at least two bin values.")

    @property
    def uses_matrices(self) -> bool:
        return self.component in ("hybrid", "cmow")

    @property
    def uses_vectors(self) -> bool:
        return self.component in ("hybrid", "cbow")

    @property
    def embedding_bytes(self) -> int:
        """fp32 bytes of the token embeddings (a d×d matrix per direction and a vector per token)."""
        return 4 * self.vocab_size * self.sentence_size

    @property
    def directions(self) -> int:
        return 2 if self.bidirectional else 1

    @property
    def sentence_size(self) -> int:
        """Size of one sentence's representation h."""
        return self.directions * self.matrix_dim ** 2 * self.uses_matrices + self.vector_dim * self.uses_vectors

    @property
    def token_size(self) -> int:
        """Size of the per-token (MLM) representation h_i: prefix and suffix sums when bidirectional."""
        return self.directions * (self.matrix_dim ** 2 * self.uses_matrices + self.vector_dim * self.uses_vectors)

    @property
    def own_size(self) -> int:
        """Size of a token's own embedding beside its per-token state in a tagger: its CBOW vector, else its
        forward matrix."""
        return self.vector_dim if self.uses_vectors else self.matrix_dim ** 2

    @property
    def tag_size(self) -> int:
        """Size of a tagger's per-position input: h_i and the token's own embedding."""
        return self.token_size + self.own_size

    @property
    def embedding_size(self) -> int:
        """Size of one token's own embedding (the BiLSTM head's input per step)."""
        return self.sentence_size


def checked_config(**kwargs) -> CMOWConfig:
    """``CMOWConfig(**kwargs)`` with a failed check of its own as a sentence (DistilleryError), not
    huggingface_hub's wrapper: for settings checked before anything is trained or written."""
    try:
        return CMOWConfig(**kwargs)
    except StrictDataclassClassValidationError as e:
        raise DistilleryError(str(e.__cause__ or e)) from None


def _gigabytes(n: int) -> str:
    for unit, power in (("PiB", 50), ("TiB", 40)):
        if n >= 2**power:
            return f"{n / 2**power:,.1f} {unit}"
    return f"{n / 2**30:,.1f} GiB"


# ------------------------------------------------------------------------------------------------
# The encoder


def segment_masks(input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor | None, sep_token_id: int | None) -> tuple[Tensor, Tensor]:
    """(keep_a, keep_b), each (B, T) bool: the real tokens of the first and second sentence of a
    joint pair encoding. Segments come from ``token_type_ids`` when the tokenizer makes them, else
    everything after the first separator is the second sentence (RoBERTa-style ``<s> A </s></s> B </s>``)."""
    real = attention_mask.bool()
    if sep_token_id is None:
        if token_type_ids is None or (not torch.compiler.is_exporting() and not bool((token_type_ids * attention_mask).any())):
            raise ValueError("DiffCat needs token_type_ids or a separator id to split the pair.")
        second = token_type_ids.bool()
    else:
        sep = (input_ids == sep_token_id).long()
        second = (sep.cumsum(1) - sep) >= 1
        if token_type_ids is not None:  # per row, without a data-dependent branch (ONNX export traces this)
            typed = (token_type_ids * attention_mask).bool()
            has_types = typed.any(dim=1, keepdim=True)  # (ORT has no Where on bools)
            second = (has_types & typed) | (~has_types & second)
    return real & ~second, real & second


def kept_tokens(input_ids: Tensor, attention_mask: Tensor | None) -> Tensor:
    """(B, T) bool: the real tokens (all of them without an attention mask)."""
    return attention_mask.bool() if attention_mask is not None else torch.ones_like(input_ids, dtype=torch.bool)


class CMOWEncoder(nn.Module):
    """Three embedding tables (forward Δ, backward Δ, CBOW vectors), each with a padding row of zeros.

    Three tables rather than one wide one: a (256·64, 1200) lookup result is over glibc's 32 MB mmap
    ceiling, so every call would fault in fresh pages (measured 28.6 ms against 3 × ~2 ms)."""

    def __init__(self, config: CMOWConfig):
        super().__init__()
        self.config = config
        d2, pad = config.matrix_dim ** 2, config.pad_token_id
        self.fw = nn.Embedding(config.vocab_size, d2, padding_idx=pad) if config.uses_matrices else None
        self.bw = nn.Embedding(config.vocab_size, d2, padding_idx=pad) if config.uses_matrices and config.bidirectional else None
        self.vec = nn.Embedding(config.vocab_size, config.vector_dim, padding_idx=pad) if config.uses_vectors else None
        self.dropout = nn.Dropout(config.dropout)

    def _matrices(self, table: nn.Embedding, ids: Tensor) -> Tensor:
        """(B, T) ids -> (B, T, d, d) fp32 matrices I + dropout(Δ)."""
        d = self.config.matrix_dim
        x = self.dropout(table(ids).float()).view(*ids.shape, d, d)
        # in place: a fresh (B, T, d, d) tensor per call cost more than the lookup (page faults; 2× on
        # the whole forward at 256×64); the lookup's and dropout's backward do not read their outputs
        if torch.compiler.is_exporting():  # an exported graph must be functional
            return x + torch.eye(d, dtype=x.dtype, device=x.device)
        x.diagonal(dim1=-2, dim2=-1).add_(1.0)
        return x

    def masked_ids(self, input_ids: Tensor, keep: Tensor) -> Tensor:
        """The ids with every position not kept mapped to the padding row (identity, zero vector)."""
        return input_ids.masked_fill(~keep, self.config.pad_token_id)

    def tokens(self, input_ids: Tensor, keep: Tensor, vectors: bool = True) -> dict[str, Tensor]:
        """Each token's own matrices and (with ``vectors``) vector, masked positions mapped to the padding row."""
        return self._lookup(self.masked_ids(input_ids, keep), vectors)

    def _lookup(self, ids: Tensor, vectors: bool) -> dict[str, Tensor]:
        out = {}
        if self.fw is not None:
            out["fw"] = self._matrices(self.fw, ids)
        if self.bw is not None:
            out["bw"] = self._matrices(self.bw, ids)
        if self.vec is not None and vectors:
            out["vec"] = self.dropout(self.vec(ids).float())  # (B, T, d_vec); padding rows are 0
        return out

    def sentence(self, input_ids: Tensor, keep: Tensor, need_tokens: bool = False) -> tuple[Tensor, dict[str, Tensor]]:
        """h (B, sentence_size) for the kept tokens of each row, and the token embeddings (all of them
        with ``need_tokens``; the CBOW vectors are otherwise summed without being gathered)."""
        # Without dropout the CBOW sum is an embedding bag: no (B, T, d_vec) tensor written and read back.
        bag = (self.vec is not None and not need_tokens and not (self.training and self.dropout.p > 0)
               and not torch.compiler.is_exporting())  # ONNX has no embedding bag
        ids = self.masked_ids(input_ids, keep)
        tok = self._lookup(ids, vectors=not bag)
        parts = []
        if "fw" in tok:
            parts.append(tree_product(tok["fw"]).flatten(1))  # X_1 ⋯ X_n
        if "bw" in tok:
            parts.append(tree_product(tok["bw"], reverse=True).flatten(1))  # X_n ⋯ X_1 (padding at the end is I)
        if bag:
            parts.append(F.embedding_bag(ids, self.vec.weight, mode="sum").float())
        elif "vec" in tok:
            parts.append(tok["vec"].sum(1))
        return torch.cat(parts, dim=-1), tok

    def per_token(self, input_ids: Tensor, keep: Tensor, own: bool = False) -> Tensor:
        """h_i for every position (B, T, token_size): prefix (and suffix) products and sums; with ``own`` the
        token's own embedding too (B, T, tag_size): a prefix and a suffix both hold token i, but only mixed
        with its context (its vector in a sum whose total a linear map cannot take apart), and a tagger reads
        the word itself first."""
        tok = self.tokens(input_ids, keep)
        parts = [(tok["vec"] if "vec" in tok else tok["fw"].flatten(2))] if own else []
        if "fw" in tok:
            parts.append(prefix_products(tok["fw"]).flatten(2))  # X_1 ⋯ X_i
        if "bw" in tok:
            parts.append(suffix_products(tok["bw"]).flatten(2))  # X_n ⋯ X_i, aligned at i
        if "vec" in tok:
            prefix = tok["vec"].cumsum(1)
            parts.append(prefix)
            if self.config.bidirectional:
                parts.append(tok["vec"].sum(1, keepdim=True) - prefix + tok["vec"])  # Σ_{j ≥ i}
        return torch.cat(parts, dim=-1)


# ------------------------------------------------------------------------------------------------
# Models


@dataclass
class CMOWModelOutput(ModelOutput):
    pooler_output: Tensor | None = None  # (B, sentence_size) the sentence representation h
    last_hidden_state: Tensor | None = None  # (B, T, token_size) per-token h_i, when asked for
    # what transformers' models return with output_hidden_states: CMOW has no layers, so the one
    # per-token state (h_i above), once
    hidden_states: tuple[Tensor, ...] | None = None


@dataclass
class CMOWSequenceClassifierOutput(ModelOutput):
    loss: Tensor | None = None
    logits: Tensor | None = None
    bin_logits: Tensor | None = None  # regression as classification: logits over score_bins


@dataclass
class CMOWMaskedLMOutput(ModelOutput):
    loss: Tensor | None = None
    logits: Tensor | None = None
    hidden_states: Tensor | None = None  # (B, T, token_size)


class CMOWPreTrainedModel(PreTrainedModel):
    config_class = CMOWConfig
    config: CMOWConfig
    base_model_prefix = "cmow"
    main_input_name = "input_ids"

    @torch.no_grad()
    def _init_weights(self, module):
        # transformers' init functions leave alone what from_pretrained loaded
        if isinstance(module, nn.Embedding):  # Δ ~ N(0, σ²) for matrices, N(0, σ_vec²) for CBOW vectors
            vec = module is getattr(getattr(self, "encoder", None), "vec", None)
            init.normal_(module.weight, 0.0, self.config.vector_init_std if vec else self.config.init_std)
            init.zeros_(module.weight[self.config.pad_token_id])  # the identity matrix / the zero vector
        elif isinstance(module, nn.Linear):
            init.xavier_uniform_(module.weight)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, (nn.LayerNorm, nn.BatchNorm2d)):
            init.ones_(module.weight)
            init.zeros_(module.bias)
            if isinstance(module, nn.BatchNorm2d):
                init.zeros_(module.running_mean)
                init.ones_(module.running_var)
                init.zeros_(module.num_batches_tracked)
        elif isinstance(module, CMOWForSequenceClassification):
            # not saved (it is the config's score_bins): from_pretrained builds the model on the meta
            # device, so without this the bins of a loaded regression student are uninitialised memory
            init.copy_(module.bin_values, bin_values(self.config))

    def get_input_embeddings(self):
        encoder = self.encoder
        return encoder.vec if encoder.vec is not None else encoder.fw

    def set_input_embeddings(self, value: nn.Embedding):
        setattr(self.encoder, "vec" if self.encoder.vec is not None else "fw", value)

    def _resize_token_embeddings(self, new_num_tokens, pad_to_multiple_of=None, mean_resizing=True):
        """Every token table of the encoder (forward and backward matrices, CBOW vectors) to the new
        vocabulary; an MLM head's output rows too. New rows of a matrix table are drawn around its mean
        deviation Δ (mean_resizing) or as the initialisation draws them."""
        for name in ("fw", "bw", "vec"):
            table = getattr(self.encoder, name)
            if table is not None:
                new = self._get_resized_embeddings(table, new_num_tokens, pad_to_multiple_of, mean_resizing)
                new.padding_idx = self.config.pad_token_id
                new.requires_grad_(table.weight.requires_grad)
                setattr(self.encoder, name, new)
        head = self.get_output_embeddings()
        if head is not None:
            self.set_output_embeddings(self._get_resized_lm_head(head, self.get_input_embeddings().num_embeddings,
                                                                 mean_resizing=mean_resizing))
        return self.get_input_embeddings()

    def _cast_for_head(self, h: Tensor) -> Tensor:
        """The fp32 products in the dtype of the head's weights (fp16 / bf16 models)."""
        return h.to(self.dtype)

    def num_effective_parameters(self) -> int:
        """Parameters one sentence uses: one row of each embedding table per token, plus the head."""
        total = 0
        for module in self.modules():
            for p in module.parameters(recurse=False):
                total += p.shape[1] if isinstance(module, nn.Embedding) else p.numel()
        return total


class CMOWModel(CMOWPreTrainedModel):
    def __init__(self, config: CMOWConfig):
        super().__init__(config)
        self.encoder = CMOWEncoder(config)
        self.post_init()

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, token_type_ids: Tensor | None = None,
                output_hidden_states: bool | None = None, return_dict: bool | None = None, **kwargs) -> CMOWModelOutput:
        if output_hidden_states is None:
            output_hidden_states = self.config.output_hidden_states
        mask = kept_tokens(input_ids, attention_mask)
        h, _ = self.encoder.sentence(input_ids, mask)
        per_token = self._cast_for_head(self.encoder.per_token(input_ids, mask)) if output_hidden_states else None
        out = CMOWModelOutput(pooler_output=self._cast_for_head(h), last_hidden_state=per_token,
                              hidden_states=(per_token,) if output_hidden_states else None)
        return out if wants_dict(return_dict, self.config) else out.to_tuple()


class SentenceReader:
    """A CMOW model with a sentence head (the classifier, the embedder): the head (``head``, after ``head_dropout``)
    reads the encoder's (``encoder``) sentence representation."""

    def sentence_features(self, input_ids: Tensor, attention_mask: Tensor | None, token_type_ids: Tensor | None) -> Tensor:
        """The head's input: h, or h_A ‖ |h_A − h_B| ‖ h_B for DiffCat (both from one joint encoding)."""
        mask = kept_tokens(input_ids, attention_mask)
        bilstm = isinstance(self.head, BiLSTMHead)
        if bilstm and torch.compiler.is_exporting():
            raise DistilleryError("The BiLSTM head does not export to ONNX (torch.export has no packed sequences); "
                                  "use --format torch-int8, or the linear, mlp or cnn head.")
        if self.config.pair_mode == "joint":
            h, tok = self.encoder.sentence(input_ids, mask, need_tokens=bilstm)
            return self.head.sentence(tok, mask) if bilstm else h
        keep_a, keep_b = segment_masks(input_ids, mask.long(), token_type_ids, self.config.sep_token_id)
        if torch.compiler.is_exporting():  # the one-pass batch below would fix the graph's batch size
            a, b = self.encoder.sentence(input_ids, keep_a)[0], self.encoder.sentence(input_ids, keep_b)[0]
        else:
            both, tok = self.encoder.sentence(input_ids.repeat(2, 1), torch.cat([keep_a, keep_b]), need_tokens=bilstm)  # A and B in one pass
            if bilstm:
                both = self.head.sentence(tok, torch.cat([keep_a, keep_b]))
            a, b = both.chunk(2)
        return torch.cat([a, (a - b).abs(), b], dim=-1)

    def head_outputs(self, input_ids: Tensor, attention_mask: Tensor | None, token_type_ids: Tensor | None) -> Tensor:
        """The head's outputs on :meth:`sentence_features`, dropout first (on the aggregated representation, §2.1)."""
        h = self._cast_for_head(self.sentence_features(input_ids, attention_mask, token_type_ids))
        head = self.head.mlp if isinstance(self.head, BiLSTMHead) else self.head
        return head(self.head_dropout(h))


class CMOWForSequenceClassification(SentenceReader, CMOWPreTrainedModel):
    def __init__(self, config: CMOWConfig):
        super().__init__(config)
        self.encoder = CMOWEncoder(config)
        self.num_labels = config.num_labels
        bins = config.score_bins
        self.register_buffer("bin_values", bin_values(config), persistent=False)
        self.head_dropout = nn.Dropout(config.dropout)  # on the aggregated representation (§2.1)
        self.head = make_head(config, len(bins) if bins else config.num_labels)
        self.post_init()

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, token_type_ids: Tensor | None = None,
                labels: Tensor | None = None, return_dict: bool | None = None, **kwargs) -> CMOWSequenceClassifierOutput:
        out = self.head_outputs(input_ids, attention_mask, token_type_ids)
        bin_logits = None
        if self.config.score_bins:  # (B, 1) expected score, in fp32 over the fp32 bins
            bin_logits, out = out, (out.float().softmax(-1) @ self.bin_values.float()).unsqueeze(-1).to(out.dtype)
        loss = None
        if labels is not None:
            if bin_logits is not None:
                loss = soft_cross_entropy_to(bin_logits, two_hot(labels.float(), self.bin_values))
            else:  # transformers' loss of its own classifiers: the config's problem_type, else by labels
                loss = ForSequenceClassificationLoss(labels, out, self.config)
        result = CMOWSequenceClassifierOutput(loss=loss, logits=out, bin_logits=bin_logits)
        return result if wants_dict(return_dict, self.config) else result.to_tuple()


class CMOWForMaskedLM(CMOWPreTrainedModel):
    """Per-token h_i → dropout → a linear MLM head (general distillation, §2.2)."""

    def __init__(self, config: CMOWConfig):
        super().__init__(config)
        self.encoder = CMOWEncoder(config)
        self.head_dropout = nn.Dropout(config.dropout)
        self.mlm_head = nn.Linear(config.token_size, config.vocab_size)
        self.post_init()

    def get_output_embeddings(self):
        return self.mlm_head

    def set_output_embeddings(self, value: nn.Linear):
        self.mlm_head = value

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, labels: Tensor | None = None,
                return_dict: bool | None = None, **kwargs) -> CMOWMaskedLMOutput:
        mask = kept_tokens(input_ids, attention_mask)
        hidden = self._cast_for_head(self.encoder.per_token(input_ids, mask))  # (B, T, token_size)
        logits = self.mlm_head(self.head_dropout(hidden))
        loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100) if labels is not None else None
        result = CMOWMaskedLMOutput(loss=loss, logits=logits, hidden_states=hidden)
        return result if wants_dict(return_dict, self.config) else result.to_tuple()


class CMOWForTokenClassification(CMOWPreTrainedModel):
    """A tagger with no attention: at each position, the token's own embedding and its bidirectional per-token
    state h_i (the products of the tokens up to it and from it, and the CBOW sums; :meth:`CMOWEncoder.per_token`,
    the scans of the MLM pretraining) → dropout → a tag head at every position (:func:`make_tag_head`).
    Padding is the identity, so a real position's tags do not depend on how much padding follows."""

    def __init__(self, config: CMOWConfig):
        super().__init__(config)
        self.encoder = CMOWEncoder(config)
        self.num_labels = config.num_labels
        self.head_dropout = nn.Dropout(config.dropout)
        self.head = make_tag_head(config, config.num_labels)
        self.post_init()

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, token_type_ids: Tensor | None = None,
                labels: Tensor | None = None, output_hidden_states: bool | None = None, return_dict: bool | None = None,
                **kwargs) -> TokenClassifierOutput:
        if output_hidden_states is None:
            output_hidden_states = self.config.output_hidden_states
        hidden = self._cast_for_head(self.encoder.per_token(input_ids, kept_tokens(input_ids, attention_mask), own=True))
        logits = self.head(self.head_dropout(hidden))  # (B, T, num_labels)
        loss = ForTokenClassification(logits, labels, self.config) if labels is not None else None  # -100 ignored
        result = TokenClassifierOutput(loss=loss, logits=logits, hidden_states=(hidden,) if output_hidden_states else None)
        return result if wants_dict(return_dict, self.config) else result.to_tuple()


def bin_values(config: CMOWConfig) -> Tensor:
    """The regression bins' values (fp32), or a placeholder for a classifier."""
    return torch.tensor(config.score_bins or [0.0], dtype=torch.float32)


def two_hot(scores: Tensor, bins: Tensor) -> Tensor:
    """(B,) scores -> (B, K) distributions over the sorted bin values whose expected value is the
    score (clamped to the bins' range): the weight is split between the two nearest bins."""
    scores = scores.clamp(bins[0], bins[-1])
    upper = torch.searchsorted(bins, scores.contiguous()).clamp(1, len(bins) - 1)
    lo, hi = bins[upper - 1], bins[upper]
    w = ((scores - lo) / (hi - lo)).clamp(0, 1)
    target = torch.zeros(scores.shape[0], len(bins), dtype=scores.dtype, device=scores.device)
    target.scatter_(1, (upper - 1).unsqueeze(1), (1 - w).unsqueeze(1))
    target.scatter_add_(1, upper.unsqueeze(1), w.unsqueeze(1))
    return target


AutoConfig.register("cmow", CMOWConfig, exist_ok=True)
AutoModel.register(CMOWConfig, CMOWModel, exist_ok=True)
AutoModelForSequenceClassification.register(CMOWConfig, CMOWForSequenceClassification, exist_ok=True)
AutoModelForMaskedLM.register(CMOWConfig, CMOWForMaskedLM, exist_ok=True)
AutoModelForTokenClassification.register(CMOWConfig, CMOWForTokenClassification, exist_ok=True)
