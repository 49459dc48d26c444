"""`distillery transfer-set`: sentence pairs (or texts) from a corpus for --unlabeled-file, deterministic, each
kind of pair made as documented, and the file reads back as a pair task's unlabeled rows."""

from __future__ import annotations

import json

import pytest

from distillery.data.loading import load_unlabeled
from distillery.data.tasks import get_task
from distillery.data.transfer import PAIR_KINDS, paragraph_sentences, transfer_rows
from tests.helpers import assert_one_line_error, run_cli, run_ok

WIKI = "\n".join([
    '<doc id="1" url="?curid=1" title="Paris">', "Paris", "",
    "Paris is the capital city of France in Europe. It was first named Lutetia by the Romans long ago. "
    "The river Seine runs through the middle of the city.",
    "History.",
    "In 1889 the Eiffel Tower was built for the World Fair. It stood as the tallest structure in the world for years.",
    "</doc>",
    '<doc id="2" url="?curid=2" title="London">', "London", "",
    "London is a large city on the river Thames in England. Its bridge was rebuilt in 1831 by John Rennie. "
    "Millions of people visit the Tower of London every single year.",
    "</doc>", ""])


def paragraphs():
    return paragraph_sentences(WIKI.splitlines())


def test_paragraphs_keep_prose_of_two_sentences_or_more():
    paras = paragraphs()
    assert [len(p) for p in paras] == [3, 2, 3]  # the tags, titles and the heading "History." are no paragraph
    assert paras[0][1] == "It was first named Lutetia by the Romans long ago."


def test_pairs_are_deterministic_and_of_every_kind():
    rows = transfer_rows(paragraphs(), 40, seed=3)
    assert rows == transfer_rows(paragraphs(), 40, seed=3)
    assert rows != transfer_rows(paragraphs(), 40, seed=4)
    sentences = {s for p in paragraphs() for s in p}
    for i, row in enumerate(rows):
        first = row["text"]
        assert first in sentences or any(first == f"{a} {b}" for p in paragraphs() for a, b in zip(p, p[1:]))
        assert row["text_pair"] not in [s for s in sentences if s in first]  # never a copy of a first-side sentence
        kind = PAIR_KINDS[i % len(PAIR_KINDS)]
        if kind == "part":
            assert row["text_pair"].rstrip(".") in first
        if kind in ("next", "far"):
            assert row["text_pair"] in sentences
        if kind == "swap":  # one word differs from a first-side sentence
            words = row["text_pair"].split()
            assert any(len(s.split()) == len(words) and sum(a != b for a, b in zip(s.split(), words)) == 1
                       for s in sentences if s in first)


def test_single_texts():
    rows = transfer_rows(paragraphs(), 10, seed=0, pairs=False)
    assert all(set(r) == {"text"} for r in rows)


def test_cli_writes_rows_an_unlabeled_file_reads(tmp_path, monkeypatch, capsys):
    corpus, out = tmp_path / "wiki_00", tmp_path / "pairs.jsonl"
    corpus.write_text(WIKI)
    said = run_ok(monkeypatch, capsys, "transfer-set", "--corpus", str(corpus), "--out", str(out), "--rows", "12")
    assert "12 sentence pairs from 3 paragraphs" in said and "--unlabeled-file" in said
    rows = load_unlabeled(out, get_task("rte"))
    assert rows.column_names == ["text", "text_pair"] and len(rows) == 12
    first = out.read_text()
    code, _, err = run_cli(monkeypatch, capsys, "transfer-set", "--corpus", str(corpus), "--out", str(out))
    assert_one_line_error(code, err, "exists")
    assert out.read_text() == first  # nothing lost
    run_ok(monkeypatch, capsys, "transfer-set", "--corpus", str(corpus), "--out", str(out), "--rows", "5",
           "--single", "--overwrite")
    assert [set(json.loads(line)) for line in out.read_text().splitlines()] == [{"text"}] * 5


def test_cli_refuses_a_corpus_without_prose_and_its_own_input(tmp_path, monkeypatch, capsys):
    headings = tmp_path / "headings.txt"
    headings.write_text("History.\nEarly life.\nA single sentence of prose is not a paragraph of two.\n")
    code, _, err = run_cli(monkeypatch, capsys, "transfer-set", "--corpus", str(headings),
                           "--out", str(tmp_path / "o.jsonl"))
    assert_one_line_error(code, err, "two sentences")
    assert not (tmp_path / "o.jsonl").exists()
    code, _, err = run_cli(monkeypatch, capsys, "transfer-set", "--corpus", str(headings), "--out", str(headings),
                           "--overwrite")
    assert_one_line_error(code, err, "input of this command")
    code, _, err = run_cli(monkeypatch, capsys, "transfer-set", "--corpus", str(headings),
                           "--out", str(tmp_path / "o.jsonl"), "--rows", "0")
    assert_one_line_error(code, err, "--rows")
    code, _, err = run_cli(monkeypatch, capsys, "transfer-set", "--corpus", str(headings),
                           "--out", str(tmp_path / "o.tsv"))
    assert_one_line_error(code, err, "*.jsonl")  # --unlabeled-file would read it as TSV
    assert not (tmp_path / "o.tsv").exists()


def test_cli_refuses_a_corpus_that_is_not_utf8(tmp_path, monkeypatch, capsys):
    """Issue 52: a Latin-1 corpus wrote "Katar\ufffdna" into the transfer set."""
    corpus, out = tmp_path / "latin1.txt", tmp_path / "pairs.jsonl"
    corpus.write_bytes(WIKI.replace("John Rennie", "Katarína Dubovská").encode("latin-1"))
    code, _, err = run_cli(monkeypatch, capsys, "transfer-set", "--corpus", str(corpus), "--out", str(out))
    line = WIKI.splitlines().index(next(s for s in WIKI.splitlines() if "John Rennie" in s)) + 1
    assert_one_line_error(code, err, f"latin1.txt, line {line}: not UTF-8 text")
    assert not out.exists()


@pytest.mark.parametrize("rows, single", [("99999999999999999999", False), ("41", False), ("11", True)])
def test_cli_refuses_more_rows_than_the_corpus_gives_before_drawing(rows, single, tmp_path, monkeypatch, capsys):
    """Issue 52: --rows 99999999999999999999 drew rows without end (1 GB after 20 s). WIKI's paragraphs of 3, 2 and
    3 sentences hold 4 + 2 + 4 spans of one or two sentences: 40 pairs (a kind each), 10 single texts."""
    import distillery.data.transfer as transfer

    corpus, out = tmp_path / "wiki_00", tmp_path / "pairs.jsonl"
    corpus.write_text(WIKI)
    monkeypatch.setattr(transfer, "transfer_rows", lambda *a, **k: pytest.fail("rows were drawn"))
    code, _, err = run_cli(monkeypatch, capsys, "transfer-set", "--corpus", str(corpus), "--out", str(out),
                           "--rows", rows, *(["--single"] if single else []))
    assert_one_line_error(code, err, f"--rows {int(rows):,} is more than")
    assert ("give --rows 10 or fewer" if single else "give --rows 40 or fewer") in err
    assert not out.exists()


def test_an_interrupted_transfer_set_names_no_resume(tmp_path, monkeypatch, capsys):
    """Issue 52: the stop message named a --resume that transfer-set does not have; compress has it."""
    import distillery.cli as cli
    import distillery.data.transfer as transfer

    corpus = tmp_path / "wiki_00"
    corpus.write_text(WIKI)
    monkeypatch.setattr(cli, "_terminated", False)  # restored after: the SIGTERM below sets it

    def stopped(*args, **kwargs):
        cli._stop_on_sigterm(None, None)  # what SIGTERM runs: a KeyboardInterrupt where the process is

    monkeypatch.setattr(transfer, "write_transfer_set", stopped)
    code, _, err = run_cli(monkeypatch, capsys, "transfer-set", "--corpus", str(corpus), "--out",
                           str(tmp_path / "o.jsonl"))
    assert code == 143 and err.strip().startswith("distillery: terminated (SIGTERM). Run the command again")
    assert "--resume" not in err
    assert cli.takes_resume(["compress", "--task", "rte"]) and cli.takes_resume(["autotinybert", "pretrain"])
    assert not cli.takes_resume(["transfer-set", "--rows", "5"]) and not cli.takes_resume(["export", "m"])
