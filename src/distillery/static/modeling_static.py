"""The static embedder, method ``static``'s student: one vector a vocabulary token, a text's vector the mean of its
tokens' vectors (special tokens left out), as sentence-transformers' ``StaticEmbedding`` computes it.

It is a ``PreTrainedModel`` (``save_pretrained``/``from_pretrained``, registered with ``AutoModel`` on import), so that
the run scores, times and reloads it as any student. Its forward returns each token's vector as
``last_hidden_state`` (special tokens and padding as zero vectors) and the text's vector itself as
``sentence_embedding``, the mean over the counted tokens (``StaticEmbedding``'s), which the embedding kind reads and
normalises whatever the run's pooling: a table has no first token's state to read for a CLS-pooled teacher. Its
weights file holds one tensor, ``embedding.weight``, the name ``StaticEmbedding`` reads: the folder's one ``model.safetensors`` serves both."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn
from transformers import AutoConfig, AutoModel, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import BaseModelOutput

from distillery.kinds.embedding import STATIC_MODEL_TYPE, mean_pooled


@dataclass
class StaticEmbedderOutput(BaseModelOutput):
    """Each token's vector (``last_hidden_state``) and the text's (``sentence_embedding``: their mean, specials out)."""

    sentence_embedding: Tensor | None = None


class StaticEmbedderConfig(PretrainedConfig):
    model_type = STATIC_MODEL_TYPE

    def __init__(self, vocab_size: int = 30522, hidden_size: int = 256, special_ids: list[int] | None = None,
                 pca_dims: int | None = None, sif: float | None = None, teacher_dim: int | None = None, **kwargs):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.special_ids = list(special_ids or [])  # the tokens no mean counts ([CLS], [SEP], padding)
        self.pca_dims = pca_dims
        self.sif = sif
        self.teacher_dim = teacher_dim
        super().__init__(**kwargs)


class StaticEmbedder(PreTrainedModel):
    config_class = StaticEmbedderConfig
    config: StaticEmbedderConfig
    base_model_prefix = "static"
    main_input_name = "input_ids"

    def __init__(self, config: StaticEmbedderConfig):
        super().__init__(config)
        self.embedding = nn.Embedding(config.vocab_size, config.hidden_size)
        self.post_init()

    @torch.no_grad()
    def _init_weights(self, module):
        if isinstance(module, nn.Embedding):  # from_pretrained or the recipe sets the vectors; this is a placeholder
            nn.init.normal_(module.weight, 0.0, 0.02)

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embedding

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, token_type_ids: Tensor | None = None,
                **kwargs) -> StaticEmbedderOutput:
        # the special tokens are looked up from the config at each call: a buffer that is not saved is left
        # uninitialised by from_pretrained (transformers builds the model on the meta device)
        special = torch.tensor(self.config.special_ids, dtype=input_ids.dtype, device=input_ids.device)
        keep = ~torch.isin(input_ids, special)  # (B, T)
        if attention_mask is not None:
            keep = keep & attention_mask.bool()
        vectors = self.embedding(input_ids)  # (B, T, d)
        return StaticEmbedderOutput(last_hidden_state=vectors * keep.unsqueeze(-1).to(vectors.dtype),
                                    sentence_embedding=mean_pooled(vectors, keep))


AutoConfig.register(STATIC_MODEL_TYPE, StaticEmbedderConfig, exist_ok=True)
AutoModel.register(StaticEmbedderConfig, StaticEmbedder, exist_ok=True)
