"""Token classification's student text: the teacher's logits cached one vector a word (the cached term equals the
live one), carried word by word to a pretrained student with another tokenizer (against a slow per-word
reference), new rows for a tagger (augmentation a word for a word, unlabeled sentences of words, each tagged by the
teacher), the unlabeled token files and their bad inputs, and `compress` end to end with each."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch.testing import assert_close

from distillery.data.loading import load_unlabeled
from distillery.data.tasks import get_task
from distillery.errors import DistilleryError
from tests.helpers import NO_EXTRAS, assert_one_line_error, run_cli, tiny_config, tiny_ner_settings

pytestmark = pytest.mark.usefixtures("steady_pretrained_timing")  # conftest: no timing decides a test

CONLL = get_task("conll2003")


def token_model(folder, seed: int = 0):
    from transformers import AutoModelForTokenClassification

    torch.manual_seed(seed)
    kind = CONLL.kind_object
    return AutoModelForTokenClassification.from_pretrained(str(folder), **kind.head_config(CONLL)).eval()


def context(teacher_folder, data_dir, tmp_path, max_length: int, **more):
    """A MethodContext on the tiny CoNLL fixture whose teacher is a random token classifier of ``teacher_folder``."""
    from distillery.data.encode import prepare_task_data
    from distillery.method_context import MethodContext
    from distillery.teacher import teacher_tokenizer

    config = tiny_config(str(teacher_folder), data_dir, tmp_path / "run", task="conll2003",
                         **{"data.max_length": max_length, **more})
    tokenizer = teacher_tokenizer(str(teacher_folder))
    task_data = prepare_task_data(CONLL, tokenizer, config.data)
    return MethodContext(config=config, teacher=token_model(teacher_folder), tokenizer=tokenizer, task_data=task_data,
                         out_dir=tmp_path)


def first_subwords(tokenizer, words, max_length):
    """The position of each word's first sub-word in ``tokenizer``'s encoding of ``words`` (a slow loop), None for a
    word the length cut, and the encoding."""
    enc = tokenizer(words, is_split_into_words=True, truncation=True, max_length=max_length, return_tensors="pt")
    first, previous = [None] * len(words), None
    for position, word in enumerate(enc.word_ids(0)):
        if word is not None and word != previous:
            first[word] = position
        previous = word
    return first, enc


# -- the per-word cache -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("every_subword", [False, True])
def test_cached_word_logits_are_the_teachers_and_give_the_live_terms(tiny_bert, conll_dir, tmp_path, every_subword):
    from distillery.data.loading import load_raw
    from distillery.kinds.token_classification import WordLogits
    from distillery.training.losses import distillation_loss

    ctx = context(tiny_bert, conll_dir, tmp_path, max_length=9, **{"data.label_all_subwords": every_subword})
    train = ctx.train_with_teacher_logits()
    raw = load_raw(CONLL, "train", ctx.config.data)
    cut = 0
    for i in range(0, len(train), 17):  # each cached vector is the teacher's on the word's first sub-word
        first, enc = first_subwords(ctx.tokenizer, raw[i]["tokens"], 9)
        with torch.no_grad():
            live = ctx.teacher(**enc).logits[0]
        kept = [p for p in first if p is not None]
        cut += len(first) - len(kept)
        assert_close(torch.tensor(train[i]["teacher_logits"]), live[kept])
    assert cut, "the length cuts words, which have no cached vector"

    student = token_model(tiny_bert, seed=1)
    batch = ctx.task_data.collate([train[i] for i in range(8)])
    assert isinstance(CONLL.kind_object.cached_teacher_outputs(batch["teacher_logits"]), WordLogits)
    live_batch = {k: v for k, v in batch.items() if k != "teacher_logits"}
    loss_fn = distillation_loss(CONLL.kind_object, ctx.teacher, 0.7, 2.0)
    cached_loss, cached_logs = loss_fn(student, batch)
    live_loss, live_logs = loss_fn(student, live_batch)
    assert_close(cached_loss, live_loss)
    assert cached_logs.keys() == live_logs.keys() and cached_logs["kd"] > 0
    for name in live_logs:
        assert_close(cached_logs[name], live_logs[name], rtol=1e-5, atol=1e-6)


def test_new_rows_are_tagged_by_the_teachers_word_logits(tiny_bert, conll_dir, tmp_path):
    """A new row's label is the teacher's argmax on each word's first sub-word (a slow loop), -100 elsewhere."""
    import datasets

    from distillery.method_context import _joined, label_new_rows

    ctx = context(tiny_bert, conll_dir, tmp_path, max_length=9)
    new = CONLL.kind_object.unlabelled(datasets.Dataset.from_dict(
        {"tokens": [["paris", "is", "good"], ["the", "actor", "was", "born", "in", "london", "very", "fun"]]}))
    assert new["tags"] == [[0, 0, 0], [0] * 8]
    from dataclasses import replace

    joined = replace(ctx.task_data, train=_joined(ctx.task_data, new))
    labelled = label_new_rows(ctx.train_with_teacher_logits(joined), len(ctx.task_data.train), CONLL.kind_object)
    assert labelled["labels"][: len(ctx.task_data.train)] == ctx.task_data.train["labels"]
    for row, words in zip(labelled.select(range(len(ctx.task_data.train), len(labelled))), new["tokens"]):
        first, enc = first_subwords(ctx.tokenizer, words, 9)
        with torch.no_grad():
            tags = ctx.teacher(**enc).logits[0].argmax(-1)
        expected = [-100] * len(row["input_ids"])
        for p in first:
            if p is not None:
                expected[p] = int(tags[p])
        assert row["labels"] == expected


# -- a pretrained student with another tokenizer ---------------------------------------------------------------


def test_a_student_of_another_tokenizer_learns_each_word_from_the_teachers_same_word(tiny_bert, tiny_family,
                                                                                   conll_dir, tmp_path):
    """The KD term on the student's batch equals a slow per-word reference: both models run on their own encoding,
    word i's teacher distribution (its first sub-word) against the student's on its first sub-word of word i, over
    the words both encodings kept (the byte-level student and WordPiece teacher cut different words)."""
    from distillery.data.encode import prepare_task_data
    from distillery.data.loading import load_raw
    from distillery.modeling import load_tokenizer
    from distillery.training.losses import pretrained_distillation_loss, soft_cross_entropy

    ctx = context(tiny_bert, conll_dir, tmp_path, max_length=9)
    folder = tiny_family("roberta", 2)
    student, student_tokenizer = token_model(folder, seed=2), load_tokenizer(folder)
    ctx.student_tokenizer = student_tokenizer
    ctx.student_data = prepare_task_data(CONLL, student_tokenizer, ctx.config.data)
    train = ctx.student_distillation_train(False)
    assert train["input_ids"] == ctx.student_data.train["input_ids"]
    rows = list(range(0, 40, 3))
    batch = ctx.student_data.collate([train[i] for i in rows])
    loss_fn = pretrained_distillation_loss(CONLL.kind_object, ctx.teacher, kd_weight=1.0, temperature=2.0)
    _, logs = loss_fn(student, batch)

    raw = load_raw(CONLL, "train", ctx.config.data)
    terms, differ = [], 0
    for i in rows:
        words = raw[i]["tokens"]
        t_first, t_enc = first_subwords(ctx.tokenizer, words, 9)
        s_first, s_enc = first_subwords(student_tokenizer, words, 9)
        differ += t_first.count(None) != s_first.count(None)
        with torch.no_grad():
            t_logits, s_logits = ctx.teacher(**t_enc).logits[0], student(**s_enc).logits[0]
        for t, s in zip(t_first, s_first):
            if t is not None and s is not None:
                terms.append(soft_cross_entropy(s_logits[s][None], t_logits[t][None], 2.0))
    assert differ, "the two tokenizers cut different words somewhere"
    assert_close(torch.tensor(logs["kd"]), torch.stack(terms).mean(), rtol=1e-5, atol=1e-6)


def test_a_student_of_the_teachers_tokenizer_reads_the_teachers_cache_as_it_is(tiny_bert, conll_dir, tmp_path):
    from distillery.data.encode import prepare_task_data
    from distillery.distill.pretrained import same_tokenizer
    from distillery.training.losses import distillation_loss, pretrained_distillation_loss

    ctx = context(tiny_bert, conll_dir, tmp_path, max_length=9)
    ctx.student_tokenizer = ctx.tokenizer
    ctx.student_data = prepare_task_data(CONLL, ctx.tokenizer, ctx.config.data)
    assert same_tokenizer(ctx.tokenizer, ctx.student_tokenizer)
    train = ctx.student_distillation_train(False)
    assert train["teacher_logits"] == ctx.train_with_teacher_logits()["teacher_logits"]
    student = token_model(tiny_bert, seed=3)
    batch = ctx.student_data.collate([train[i] for i in range(10)])
    _, logs = pretrained_distillation_loss(CONLL.kind_object, ctx.teacher, 0.5, 2.0)(student, batch)
    live = {k: v for k, v in batch.items() if k != "teacher_logits"}
    _, live_logs = distillation_loss(CONLL.kind_object, ctx.teacher, 0.5, 2.0)(student, live)
    assert_close(logs["kd"], live_logs["kd"], rtol=1e-5, atol=1e-6)


# -- augmentation a word for a word -----------------------------------------------------------------------------


def test_augmented_sentences_keep_one_word_for_one_word(tiny_bert, tmp_path):
    from transformers import BertModel

    from distillery.data.augment import WordSource, augmented_word_rows
    from distillery.modeling import load_tokenizer

    source = WordSource("neighbours", load_tokenizer(tiny_bert), BertModel.from_pretrained(tiny_bert)
                        .get_input_embeddings().weight)
    sentences = [["the", "actor", "was", "born", "in", "paris", "."], ["U.N.-backed", "film", "1996", "New York"],
                 ["first", "name", "is", "very", "good"]]
    rows = augmented_word_rows(sentences, source, 4, seed=0, cache=tmp_path / "cache", p=0.9)["tokens"]
    assert len(rows) == 4 * len(sentences)
    changed = 0
    for k, new in enumerate(rows):
        old = sentences[k // 4]
        assert len(new) == len(old) and all(w and " " not in w or " " in o for w, o in zip(new, old))
        changed += sum(w != o for w, o in zip(new, old))
        assert new[-2 if k // 4 == 1 else 0] != "" and ("1996" in new) == (k // 4 == 1)  # digits stay as they are
    assert changed > len(rows)  # p = 0.9: most words replaced
    again = augmented_word_rows(sentences, source, 4, seed=0, cache=tmp_path / "other", p=0.9)["tokens"]
    assert again == rows  # deterministic for the seed


# -- unlabeled token files --------------------------------------------------------------------------------------


def test_unlabeled_token_files_jsonl_and_a_word_a_line(tmp_path):
    jsonl = tmp_path / "more.jsonl"
    jsonl.write_text('{"tokens": ["paris", "is", "big"]}\n{"tokens": ["an", "actor"], "tags": ["O", "B-PER"]}\n')
    assert load_unlabeled(jsonl, CONLL)["tokens"] == [["paris", "is", "big"], ["an", "actor"]]
    lines = tmp_path / "more.txt"
    lines.write_text("-DOCSTART-\n\nparis\nis\nbig\n\n\nan\nactor\n")
    assert load_unlabeled(lines, CONLL)["tokens"] == [["paris", "is", "big"], ["an", "actor"]]
    columns = tmp_path / "more.conll"  # CoNLL's columns: the word is the first, the rest is not read
    columns.write_text("paris NNP B-NP B-LOC\nis VBZ O O\n\nan DT O O\n")
    assert load_unlabeled(columns, CONLL)["tokens"] == [["paris", "is"], ["an"]]


@pytest.mark.parametrize("name, text, words", [
    ("a.jsonl", '{"tokens": ["a"]}\n{"text": "a sentence"}\n', r"a.jsonl, line 2: 'tokens' must be a non-empty list "
                                                                 r"of words, not missing"),
    ("b.jsonl", '{"tokens": []}\n', r"b.jsonl, line 1: 'tokens' must be a non-empty list of words, not empty"),
    ("c.jsonl", '{"tokens": ["new york"]}\n', r"c.jsonl, line 1: every token must be one word .* 'new york'"),
    ("d.jsonl", '{"tokens": ["a", 3]}\n', r"d.jsonl, line 1: every token must be one word .* found 3"),
    ("e.txt", "paris\nis big\n", r"e.txt, line 2: 2 words on one line \('is big'\); an unlabeled file of a token task "
                                 r"holds one word a line"),
    ("f.csv", "text\na b\n", r"f.csv holds sentences \(a CSV/TSV file\), but a token-classification task tags words"),
    ("g.txt", "\n\n-DOCSTART-\n", r"g.txt holds no sentences"),
    ("h.txt", "par\xe9s\n", None),
])
def test_bad_unlabeled_token_files_are_named_with_their_line(tmp_path, name, text, words):
    path = tmp_path / name
    if words is None:  # not UTF-8: refused with its line
        path.write_bytes(text.encode("latin-1"))
        words = r"h.txt, line 1: not UTF-8 text"
    else:
        path.write_text(text)
    with pytest.raises(DistilleryError, match=words) as caught:
        load_unlabeled(path, CONLL)
    assert "\n" not in str(caught.value)


# -- end to end -------------------------------------------------------------------------------------------------


def test_compress_a_tagger_with_augmented_and_unlabeled_sentences(monkeypatch, capsys, tiny_bert4, conll_dir,
                                                                   tmp_path):
    from distillery import method_context

    seen = {}
    real = method_context.label_new_rows

    def spy(train, originals, kind):
        seen["train"], seen["originals"] = real(train, originals, kind), originals
        return seen["train"]

    monkeypatch.setattr(method_context, "label_new_rows", spy)
    unlabeled = tmp_path / "more.txt"
    unlabeled.write_text("the\nactor\nwas\nborn\nin\nparis\n\nwhere\nis\nlondon\n")
    out = tmp_path / "run"
    code, _, err = run_cli(monkeypatch, capsys, "compress", "--task", "conll2003", "--data-dir", str(conll_dir),
                           "--teacher", tiny_bert4, "--out", str(out), "--option", "augment=1", "--unlabeled-file",
                           str(unlabeled), "--config", str(tiny_ner_settings(tmp_path / "s.yaml")), *NO_EXTRAS)
    assert code == 0, err
    text = json.loads((out / "train.json").read_text())["student_text"]
    n = text["labelled"]
    assert text["augmented"] == n and text["unlabeled"] == 2
    train = seen["train"]
    assert len(train) == 2 * n + 2
    new = train.select(range(n, len(train)))  # each new word tagged by the teacher: the argmax of its vector
    for row in new:
        tags = [label for label, word in zip(row["labels"], row["word_mask"]) if word]
        assert tags == np.asarray(row["teacher_logits"]).argmax(-1).tolist()
        assert all(label == -100 for label, word in zip(row["labels"], row["word_mask"]) if not word)
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["main_metric"] == "entity_f1" and 0.0 <= metrics["student"]["entity_f1"] <= 1.0
    assert "unlabeled" in (out / "report.md").read_text()


def test_compress_a_tagger_into_a_student_of_another_tokenizer(monkeypatch, capsys, tiny_family, conll_dir, tmp_path):
    student = tiny_family("roberta", 2)
    unlabeled = tmp_path / "more.jsonl"
    unlabeled.write_text('{"tokens": ["the", "actor", "was", "born", "in", "paris"]}\n')
    out = tmp_path / "run"
    code, _, err = run_cli(monkeypatch, capsys, "compress", "--task", "conll2003", "--data-dir", str(conll_dir),
                           "--teacher", tiny_family("bert", 4), "--out", str(out), "--option", f"student={student}",
                           "--option", "augment=1", "--option", "hidden_weight=0.5", "--unlabeled-file", str(unlabeled),
                           "--config", str(tiny_ner_settings(tmp_path / "s.yaml")), *NO_EXTRAS)
    assert code == 0, err
    metrics = json.loads((out / "metrics.json").read_text())
    assert {"entity_f1", "entity_precision", "entity_recall", "token_accuracy"} <= set(metrics["student"])
    assert metrics["teacher"]["entity_f1"] > 0.5
    config = json.loads((out / "student" / "config.json").read_text())
    assert config["model_type"] == "roberta" and config["architectures"] == ["RobertaForTokenClassification"]
    train = json.loads((out / "train.json").read_text())
    assert any("its own tokenizer" in note and "mean-pooled sentence vectors" in note for note in train["notes"])
    assert train["student_text"]["unlabeled"] == 1


def test_compress_a_tagger_into_a_pretrained_student_of_the_teachers_tokenizer(monkeypatch, capsys, tiny_family,
                                                                              conll_dir, tmp_path):
    out = tmp_path / "run"
    code, _, err = run_cli(monkeypatch, capsys, "compress", "--task", "conll2003", "--data-dir", str(conll_dir),
                           "--teacher", tiny_family("bert", 4), "--out", str(out), "--option",
                           f"student={tiny_family('bert', 2)}", "--option", "hidden_weight=0.5",
                           "--config", str(tiny_ner_settings(tmp_path / "s.yaml")), *NO_EXTRAS)
    assert code == 0, err
    metrics = json.loads((out / "metrics.json").read_text())
    assert {"entity_f1", "f1_LOC", "token_accuracy"} <= set(metrics["student"])
    notes = json.loads((out / "train.json").read_text())["notes"]
    assert any("the teacher's tokenizer" in note and "student layers onto teacher layers" in note for note in notes)


def test_a_tagger_distils_from_the_cache_not_the_live_teacher(monkeypatch, capsys, tiny_bert4, conll_dir, tmp_path):
    """Without a hidden-state term the student reads the cached logits: the teacher runs once, over the train split."""
    from distillery.training import losses

    calls, steps = [], []
    real = losses.distillation_loss

    def counting(kind, teacher, *args, **kwargs):
        loss_fn = real(kind, teacher, *args, **kwargs)

        def counted(model, batch):
            steps.append(1)
            handle = teacher.register_forward_hook(lambda *a: calls.append(1))
            try:
                return loss_fn(model, batch)
            finally:
                handle.remove()

        return counted

    monkeypatch.setattr("distillery.distill.recipe.distillation_loss", counting)
    code, _, err = run_cli(monkeypatch, capsys, "compress", "--task", "conll2003", "--data-dir", str(conll_dir),
                           "--teacher", tiny_bert4, "--out", str(tmp_path / "run"), "--option", "hidden_weight=0",
                           "--config", str(tiny_ner_settings(tmp_path / "s.yaml")), *NO_EXTRAS)
    assert code == 0, err
    assert steps and not calls, "the student's loss ran the teacher"


def test_new_rows_for_squad_are_still_refused(monkeypatch, capsys, tiny_bert, tmp_path):
    from tests.helpers import write_squad

    data = write_squad(tmp_path / "data")
    code, _, err = run_cli(monkeypatch, capsys, "compress", "--task", "squad", "--data-dir", str(data), "--teacher",
                           tiny_bert, "--out", str(tmp_path / "run"), "--option", "augment=2", *NO_EXTRAS)
    assert_one_line_error(code, err, "drop --augment for task squad")
