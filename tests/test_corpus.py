"""Unlabelled corpora: WikiExtractor markup stripped, lines packed into MLM blocks, BERT masking."""

from __future__ import annotations

import datasets
import pytest
import torch
from transformers import AutoTokenizer

from distillery.data.corpus import mlm_collator, mlm_dataset, read_corpus
from distillery.errors import DistilleryError

datasets.disable_progress_bars()

WIKI = """<doc id="1" url="?curid=1" title="Paris">
Paris

paris is a city in france .
it was first named lutetia .
</doc>
<doc id="2" url="?curid=2" title="Empty">
Empty


</doc>
<doc id="3" url="?curid=3" title="London">
London
london is a city on a river .
</doc>
"""


def test_read_corpus_strips_wikiextractor_markup(tmp_path):
    wiki = tmp_path / "wiki_00"
    wiki.write_text(WIKI)
    plain = tmp_path / "plain.txt"
    plain.write_text("the movie was good .\n\n  the plot was fun .  \n")
    lines = read_corpus([wiki, str(plain)])
    assert lines == [
        "paris is a city in france .",
        "it was first named lutetia .",
        "london is a city on a river .",
        "the movie was good .",
        "the plot was fun .",
    ]
    assert read_corpus([wiki], max_lines=2) == lines[:2]


def test_read_corpus_errors(tmp_path):
    with pytest.raises(DistilleryError, match="does not exist"):
        read_corpus([tmp_path / "missing.txt"])
    empty = tmp_path / "empty.txt"
    empty.write_text("<doc id=\"1\">\nTitle\n</doc>\n\n")
    with pytest.raises(DistilleryError, match="No text found"):
        read_corpus([empty])


def test_a_corpus_that_is_not_utf8_is_refused_with_its_line(tmp_path):
    """Issue 52: a Latin-1 corpus was read with replacement characters ("Katar\ufffdna") into a transfer set."""
    latin = tmp_path / "latin1.txt"
    latin.write_bytes("the first line is plain .\n\nKatarína Dubovská was born in Prešov .\n".encode("latin-1",
                                                                                                    "replace"))
    with pytest.raises(DistilleryError, match=r"latin1.txt, line 3: not UTF-8 text \(byte 0xed\)") as caught:
        read_corpus([latin])
    assert "\n" not in str(caught.value)
    utf8 = tmp_path / "utf8.txt"  # the same text in UTF-8 (with a byte-order mark) reads as written
    utf8.write_bytes("\ufeffKatarína Dubovská .\r\n".encode("utf-8"))
    assert read_corpus([utf8]) == ["Katarína Dubovská ."]


def test_mlm_blocks_and_collator(tiny_bert):
    tok = AutoTokenizer.from_pretrained(tiny_bert)
    texts = ["the movie was good ."] * 20
    ds = mlm_dataset(tok, texts, max_length=16)
    assert ds.column_names == ["input_ids", "attention_mask"]
    blocks = ds["input_ids"]
    assert all(len(b) <= 16 and b[0] == tok.cls_token_id and b[-1] == tok.sep_token_id for b in blocks)
    assert sum(len(b) - 2 for b in blocks) == 20 * len(tok("the movie was good .", add_special_tokens=False)["input_ids"])
    collate = mlm_collator(tok, mlm_probability=0.5)
    torch.manual_seed(0)
    batch = collate([ds[i] for i in range(len(ds))])
    assert set(batch) >= {"input_ids", "attention_mask", "labels"}
    masked = batch["labels"] != -100
    assert masked.any() and not masked[:, 0].any()  # [CLS] is never a target
    assert (batch["input_ids"][masked] == tok.mask_token_id).float().mean() > 0.5  # mostly [MASK]
