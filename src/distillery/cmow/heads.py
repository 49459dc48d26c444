"""CMOW's heads (the paper's appendix A): over the sentence representation (linear, MLP, the 2D-CNN over the
aggregated matrices, a BiLSTM over the token embeddings) and, for a tagger, over each token's own state."""

from __future__ import annotations

import torch
from torch import Tensor, nn
from transformers import PreTrainedConfig

# ``config`` below is a distillery.cmow.modeling_cmow.CMOWConfig (which imports this module)


class CNNHead(nn.Module):
    """The paper's 2D-CNN over the aggregated d×d maps (fw, bw, CBOW reshaped; ×3 with DiffCat):
    a 4× transposed-conv upsampling, three convolutions, batch norm, dropout 0.4, linear."""

    def __init__(self, channels: int, d: int, num_outputs: int):
        super().__init__()
        c = channels
        self.d = d
        self.net = nn.Sequential(
            nn.ConvTranspose2d(c, c, 4, stride=4), nn.Conv2d(c, c, 4), nn.ReLU(),
            nn.Conv2d(c, c + 2, 3, stride=2), nn.ReLU(), nn.Conv2d(c + 2, c + 2, 3, stride=2), nn.ReLU(),
            nn.BatchNorm2d(c + 2), nn.Flatten(), nn.Dropout(0.4),
        )
        with torch.no_grad():
            size = self.net(torch.zeros(2, c, d, d)).shape[1]
        self.out = nn.Linear(size, num_outputs)

    def forward(self, h: Tensor) -> Tensor:
        return self.out(self.net(h.view(h.shape[0], -1, self.d, self.d)))


class BiLSTMHead(nn.Module):
    """A BiLSTM over each sentence's token embeddings (the paper's appendix A), final states of both
    directions as the sentence, then DiffCat for pairs, then two linear layers (ReLU, dropout 0.5)."""

    def __init__(self, config: PreTrainedConfig, num_outputs: int, pieces: int):
        super().__init__()
        hidden = config.lstm_hidden
        self.lstm = nn.LSTM(config.embedding_size, hidden, batch_first=True, bidirectional=True)
        self.mlp = nn.Sequential(nn.Linear(2 * hidden * pieces, config.head_hidden), nn.ReLU(), nn.Dropout(0.5),
                                 nn.Linear(config.head_hidden, num_outputs))

    def sentence(self, tok: dict[str, Tensor], keep: Tensor) -> Tensor:
        x = torch.cat([v.flatten(2) for v in tok.values()], dim=-1).to(self.lstm.weight_ih_l0.dtype)  # (B, T, embedding_size)
        order = torch.argsort((~keep).int(), dim=1, stable=True)  # the sentence's tokens first, in order
        x = x.gather(1, order.unsqueeze(-1).expand_as(x))
        lengths = keep.sum(1).clamp_min(1).cpu()
        packed = nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        _, (h, _) = self.lstm(packed)  # h: (2, B, hidden)
        return torch.cat([h[0], h[1]], dim=-1)


def make_head(config: PreTrainedConfig, num_outputs: int) -> nn.Module:
    pieces = 3 if config.pair_mode == "diffcat" else 1
    size = config.sentence_size * pieces
    if config.head == "linear":
        return nn.Sequential(nn.LayerNorm(size), nn.Linear(size, num_outputs))
    if config.head == "mlp":
        return nn.Sequential(nn.Linear(size, config.head_hidden), nn.LayerNorm(config.head_hidden), nn.ReLU(),
                             nn.Dropout(config.head_dropout), nn.Linear(config.head_hidden, num_outputs))
    if config.head == "cnn":
        maps = config.directions * config.uses_matrices + config.uses_vectors
        return CNNHead(maps * pieces, config.matrix_dim, num_outputs)
    return BiLSTMHead(config, num_outputs, pieces)


# the heads a tagger offers: one tag distribution a position, from that position's state alone (a sentence's
# CNN over aggregated maps or its BiLSTM read a whole sentence, not a token)
TAG_HEADS = ("linear", "mlp")


def make_tag_head(config: PreTrainedConfig, num_outputs: int) -> nn.Module:
    """The tagger's head, applied at every position of (B, T, tag_size): a LayerNorm and a linear map (``linear``),
    or the sentence MLP's layers (``mlp``). The per-token states mix products (entries near 1) and CBOW sums
    (growing with the position), hence the normalisation first."""
    size = config.tag_size
    if config.head == "linear":
        return nn.Sequential(nn.LayerNorm(size), nn.Linear(size, num_outputs))
    if config.head == "mlp":
        return nn.Sequential(nn.LayerNorm(size), nn.Linear(size, config.head_hidden), nn.ReLU(),
                             nn.Dropout(config.head_dropout), nn.Linear(config.head_hidden, num_outputs))
    raise ValueError(f"A CMOW tagger's head is one of {', '.join(TAG_HEADS)}, not {config.head!r}.")
