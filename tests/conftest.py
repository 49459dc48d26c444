"""Shared fixtures: tiny random BERT and RoBERTa encoders with their own tokenizers, offline.

Sizes follow the transformers test convention (hidden 32, 2 layers, 4 heads, intermediate 37).
The vocabularies are written here so that no test needs the Hub or the packaged teacher.
"""

from __future__ import annotations

import json
import os
import string

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
torch.set_num_threads(1)

WORDS = (
    "the a an is was good bad great awful movie film plot actor not very really fun boring "
    "what who where when why how many paris france london city river born year first name"
).split()


def _bert_vocab() -> list[str]:
    letters = list(string.ascii_lowercase) + list(string.digits) + list(".,!?'-()")
    return (
        ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
        + WORDS
        + letters
        + ["##" + c for c in string.ascii_lowercase + string.digits]
    )


def make_tiny_bert(path, num_layers: int = 2, seed: int = 0, dropout: float = 0.1):
    """Save a tiny random ``BertModel`` and its WordPiece tokenizer in ``path``; return the path.
    ``dropout`` 0 makes training a function of the data alone (several processes draw other masks)."""
    from transformers import BertConfig, BertModel, BertTokenizer

    path = str(path)
    os.makedirs(path, exist_ok=True)
    vocab = _bert_vocab()
    with open(os.path.join(path, "vocab.txt"), "w") as f:
        f.write("\n".join(vocab) + "\n")
    tok = BertTokenizer(os.path.join(path, "vocab.txt"), do_lower_case=True, model_max_length=512)
    tok.save_pretrained(path)
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=len(vocab),
        hidden_size=32,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        intermediate_size=37,
        max_position_embeddings=512,
        type_vocab_size=2,
        hidden_dropout_prob=dropout,
        attention_probs_dropout_prob=dropout,
    )
    BertModel(config).save_pretrained(path)
    return path


def _write_byte_bpe(path: str) -> dict:
    """vocab.json and merges.txt of a byte-level BPE with no merges in ``path``; returns the vocab."""
    os.makedirs(path, exist_ok=True)
    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    # GPT-2's byte-to-printable-character table: every byte has a token, so any text encodes.
    printable = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    byte_chars = [chr(b) for b in printable] + [chr(256 + i) for i in range(256 - len(printable))]
    vocab = {t: i for i, t in enumerate(specials + byte_chars)}
    with open(os.path.join(path, "vocab.json"), "w") as f:
        json.dump(vocab, f)
    with open(os.path.join(path, "merges.txt"), "w") as f:
        f.write("#version: 0.2\n")
    return vocab


def make_tiny_roberta(path, num_layers: int = 2, seed: int = 0):
    """Save a tiny random ``RobertaModel`` with a byte-level BPE tokenizer (no merges) in ``path``."""
    from transformers import RobertaConfig, RobertaModel, RobertaTokenizer

    path = str(path)
    vocab = _write_byte_bpe(path)
    tok = RobertaTokenizer(os.path.join(path, "vocab.json"), os.path.join(path, "merges.txt"), model_max_length=512)
    tok.save_pretrained(path)
    torch.manual_seed(seed)
    config = RobertaConfig(
        vocab_size=len(vocab),
        hidden_size=32,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        intermediate_size=37,
        max_position_embeddings=520,
        type_vocab_size=1,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
    )
    RobertaModel(config).save_pretrained(path)
    return path


@pytest.fixture(autouse=True, scope="session")
def _isolated_cache(tmp_path_factory):
    """Fine-tuned teachers are cached; tests must never read or fill the user's cache."""
    os.environ["DISTILLERY_CACHE"] = str(tmp_path_factory.mktemp("distillery-cache"))


@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory):
    """Folder of a tiny random 2-layer BERT encoder (no task head) with its tokenizer."""
    return make_tiny_bert(tmp_path_factory.mktemp("tiny-bert"))


@pytest.fixture(scope="session")
def tiny_bert4(tmp_path_factory):
    """A 4-layer tiny BERT, for layer-dropping students."""
    return make_tiny_bert(tmp_path_factory.mktemp("tiny-bert4"), num_layers=4)


@pytest.fixture(scope="session")
def tiny_roberta(tmp_path_factory):
    return make_tiny_roberta(tmp_path_factory.mktemp("tiny-roberta"))


@pytest.fixture(scope="session")
def tiny_gpt2(tmp_path_factory):
    """A tiny random ``GPT2Model`` with a byte-level tokenizer: a decoder no method distils."""
    from transformers import GPT2Config, GPT2Model, GPT2Tokenizer

    path = str(tmp_path_factory.mktemp("tiny-gpt2"))
    vocab = _write_byte_bpe(path)
    GPT2Tokenizer(os.path.join(path, "vocab.json"), os.path.join(path, "merges.txt")).save_pretrained(path)
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=len(vocab), n_embd=32, n_layer=2, n_head=4, n_positions=64)
    GPT2Model(config).save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_family(tmp_path_factory):
    """``tiny_family(name)``: the folder of a tiny random encoder of family ``name`` (tests/families.py),
    made once per session."""
    from tests.families import make_tiny_family

    made = {}

    def make(family: str, num_layers: int = 4) -> str:
        if (family, num_layers) not in made:
            made[family, num_layers] = make_tiny_family(family, tmp_path_factory.mktemp(f"tiny-{family}"), num_layers)
        return made[family, num_layers]

    return make
