"""Shared fixtures: tiny random encoders with their own tokenizers (built by tests/helpers.py), offline,
and a private distillery cache for the session."""

from __future__ import annotations

import gc
import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# One thread a process, here and in every command a test starts: the suite runs one worker per core, and
# tiny models on two threads each only wait on one another (an op's hand-off costs more than the op).
for _threads in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_threads, "1")
torch.set_num_threads(1)
# A worker's heap grows to millions of objects over a thousand tests (models, traced graphs); the collector's
# default thresholds then rescan it every few hundred allocations, which the ONNX exporter makes by the
# million: collecting less often took a tenth off the family cells.
gc.set_threshold(50_000, 50, 1000)

from tests.helpers import (TINY_BERT, make_tiny_bert, make_tiny_roberta, write_byte_bpe, write_conll_dir,  # noqa: E402
                           write_embedding_data, write_glue, write_sentence_transformer)


@pytest.fixture(autouse=True, scope="session")
def _isolated_cache(tmp_path_factory):
    """Fine-tuned teachers are cached; tests must never read or fill the user's cache. (One exception, made
    at collection, before this: tests/test_conformance.py keeps transformers' source distribution, which
    holds its common model tests, in the user's cache, to fetch it once.)"""
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
def glue_dir(tmp_path_factory):
    """Tiny SST-2 and STS-B files in GLUE's layout (tests/helpers.py's write_glue)."""
    return write_glue(tmp_path_factory.mktemp("glue"))


@pytest.fixture(scope="session")
def conll_dir(tmp_path_factory):
    """A tiny synthetic CoNLL-2003 in its folder layout (tests/helpers.py's write_conll_dir)."""
    return write_conll_dir(tmp_path_factory.mktemp("conll"))


@pytest.fixture(scope="session")
def tiny_roberta(tmp_path_factory):
    return make_tiny_roberta(tmp_path_factory.mktemp("tiny-roberta"))


@pytest.fixture(scope="session")
def tiny_gpt2(tmp_path_factory):
    """A tiny random ``GPT2Model`` with a byte-level tokenizer: a decoder no method distils."""
    from transformers import GPT2Config, GPT2Model, GPT2Tokenizer

    path = str(tmp_path_factory.mktemp("tiny-gpt2"))
    vocab = write_byte_bpe(path)
    GPT2Tokenizer(os.path.join(path, "vocab.json"), os.path.join(path, "merges.txt")).save_pretrained(path)
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=len(vocab), n_embd=TINY_BERT["hidden_size"], n_layer=TINY_BERT["num_hidden_layers"],
                        n_head=TINY_BERT["num_attention_heads"], n_positions=64)
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


@pytest.fixture
def steady_pretrained_timing(monkeypatch):
    """A pretrained student's speed check (distill.pretrained.check_smaller) timed by parameter count: tiny models'
    sub-millisecond timings on a busy machine have refused a smaller student as slower than its teacher. The
    check's refusal itself is tested with fixed timings (test_pretrained_student.py)."""
    import distillery.bench as bench
    import distillery.distill.pretrained  # noqa: F401  (bound before the patch: see helpers.flop_timed)
    from tests.helpers import patch_everywhere

    def parameters(model):  # an export (auto's int8 timing) counts as the fp32 architecture it carries
        exported = getattr(model, "exported_architecture", None)
        return bench.count_parameters(exported.fp32_model() if exported is not None else model)[0]

    patch_everywhere(monkeypatch, bench, "latency_ms", lambda models, *args, **kwargs: {
        name: 1e-4 * parameters(model) for name, model in models.items()})


@pytest.fixture(scope="module")
def embedder(tmp_path_factory):
    """A tiny 2-layer sentence-transformers embedder (mean pooling, normalised), one per test module."""
    root = tmp_path_factory.mktemp("embedder")
    return write_sentence_transformer(make_tiny_bert(root / "bert", num_layers=2), root / "st")


@pytest.fixture(scope="module")
def embedding_data(tmp_path_factory):
    """A data folder with STS-B dev and SQuAD dev, and an unlabeled file of 64 texts, one per test module."""
    return write_embedding_data(tmp_path_factory.mktemp("embedding-data"))
