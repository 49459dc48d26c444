"""The CMOW embedder, method ``cmow``'s student for ``--task embedding``: the CMOW/CBOW-Hybrid sentence
representation ``h`` (:mod:`distillery.cmow.modeling_cmow`) through a sentence head onto the teacher's width, one
vector a text (``sentence_embedding``), which the embedding kind normalises.

The head is part of the embedder, not a projection used in the loss only as for a narrower transformer student
(``TaskKind.projects_width``): ``h`` itself is no embedding to compare by cosine. Its matrix products start at the
identity (each token's matrix is ``I + Δ``) and its CBOW part is a sum that grows with the text, so the cosine of two
texts' ``h`` is near 1 whatever they say; the head learns the map from ``h`` to the teacher's vector space.

A model type of its own (``cmow-embedder``, registered with ``AutoModel``), so that ``AutoModel`` gives the embedder
(``AutoModel`` of ``cmow`` is the bare encoder, :class:`~distillery.cmow.modeling_cmow.CMOWModel`) and
sentence-transformers' ``Transformer`` module loads it after ``distillery.register_models()``
(``Embedding.write_files``)."""

from __future__ import annotations

from huggingface_hub.dataclasses import strict
from torch import Tensor, nn
from transformers import AutoConfig, AutoModel

from distillery.cmow.modeling_cmow import CMOWConfig, CMOWEncoder, CMOWPreTrainedModel, SentenceReader, make_head
from distillery.modeling import SentenceEmbeddingOutput, wants_dict

EMBEDDER_MODEL_TYPE = "cmow-embedder"


@strict
class CMOWEmbedderConfig(CMOWConfig):
    """A CMOW encoder and a sentence head giving ``output_dim`` numbers a text (the teacher's sentence vector's
    width). It reads one text: ``pair_mode`` is ``joint``, with nothing to pair."""

    model_type = EMBEDDER_MODEL_TYPE

    output_dim: int = 384

    def validate_architecture(self):
        super().validate_architecture()
        if self.output_dim < 1:
            raise ValueError(f"A CMOW embedder gives at least one number a text, got output_dim={self.output_dim}.")
        if self.pair_mode != "joint":
            raise ValueError(f"A CMOW embedder reads one text: its pair_mode is joint, not {self.pair_mode!r}.")


class CMOWForSentenceEmbedding(SentenceReader, CMOWPreTrainedModel):
    """h (the CMOW/CBOW-Hybrid sentence representation) → dropout → the sentence head → ``sentence_embedding``,
    (B, output_dim), not normalised (the embedding kind, its exports and sentence-transformers' ``Normalize`` are)."""

    config_class = CMOWEmbedderConfig
    config: CMOWEmbedderConfig

    def __init__(self, config: CMOWEmbedderConfig):
        super().__init__(config)
        self.encoder = CMOWEncoder(config)
        self.head_dropout = nn.Dropout(config.dropout)  # on the aggregated representation, as the classifier's
        self.head = make_head(config, config.output_dim)
        self.post_init()

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, token_type_ids: Tensor | None = None,
                return_dict: bool | None = None, **kwargs) -> SentenceEmbeddingOutput:
        out = SentenceEmbeddingOutput(sentence_embedding=self.head_outputs(input_ids, attention_mask, token_type_ids))
        return out if wants_dict(return_dict, self.config) else out.to_tuple()


AutoConfig.register(EMBEDDER_MODEL_TYPE, CMOWEmbedderConfig, exist_ok=True)
AutoModel.register(CMOWEmbedderConfig, CMOWForSentenceEmbedding, exist_ok=True)
