"""Token classification (NER): the token_classification kind's label alignment, per-word distillation term and
seqeval scores, each against a slow reference; CoNLL-2003's files and custom token files (CoNLL columns, token
JSONL), with the bad inputs refused in a sentence naming file and line; `distillery compress --task conll2003` end
to end with the student's int8 export scored and parity-checked, and the student loading in a fresh process
through transformers' token-classification pipeline with entity names."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.testing import assert_close

from distillery.config import DataConfig
from distillery.data.loading import custom_task, load_raw, load_unlabeled, task_for
from distillery.data.tasks import get_task
from distillery.errors import DistilleryError
from tests.helpers import NO_EXTRAS, assert_one_line_error, run_cli, synthetic_sentences, tiny_ner_settings

SHARED_CONLL = Path(__file__).resolve().parents[2] / "shared" / "data" / "ner" / "conll2003"

# -- the tiny CoNLL fixture: conftest's conll_dir (tests/helpers.py's write_conll_dir) --------------------------


def conll(data_dir, **kw) -> DataConfig:
    return DataConfig(task="conll2003", data_dir=str(data_dir), **kw)


# -- label alignment ------------------------------------------------------------------------------------------


def slow_alignment(word_ids, tags, continuation=None):
    labels, mask, previous = [], [], None
    for w in word_ids:
        if w is None:
            labels.append(-100), mask.append(0)
        elif w != previous:
            labels.append(tags[w]), mask.append(1)
        else:
            labels.append(-100 if continuation is None else int(continuation[tags[w]])), mask.append(0)
        previous = w
    return labels, mask


def test_alignment_is_the_first_subword_rule():
    from distillery.data.encode import align_word_labels

    rng = np.random.default_rng(0)
    continuation = np.array([0, 3, 4, 3, 4])  # O, B-A, B-B, I-A, I-B
    for _ in range(50):
        words = int(rng.integers(1, 12))
        tags = rng.integers(0, 5, words).tolist()
        pieces = [w for w in range(words) for _ in range(int(rng.integers(1, 4)))]
        cut = int(rng.integers(0, len(pieces) + 1))  # truncation may stop inside a word
        word_ids = [None] + pieces[:cut] + [None]
        for cont in (None, continuation):
            labels, mask, missing = align_word_labels(word_ids, tags, cont)
            assert (labels, mask) == slow_alignment(word_ids, tags, cont)
            assert missing == words - len(set(pieces[:cut]))


def test_encoding_labels_first_subwords_and_every_one_on_request(tiny_bert, tmp_path):
    from distillery.data.encode import prepare_task_data
    from distillery.modeling import load_tokenizer

    folder = tmp_path / "ner" / "conll2003"
    folder.mkdir(parents=True)
    text = "the O\nparisxy B-LOC\ncityz I-LOC\nwas O\nactorq B-PER\n\nlondon B-LOC\n"  # sub-words: paris ##x ##y
    for split in ("train", "dev"):
        (folder / f"{split}.txt").write_text(text)
    tokenizer = load_tokenizer(tiny_bert)
    task = get_task("conll2003")
    data = prepare_task_data(task, tokenizer, conll(tmp_path, max_length=64), splits=("train",))
    row, raw = data.train[0], load_raw(task, "train", conll(tmp_path))[0]
    enc = tokenizer(raw["tokens"], is_split_into_words=True, truncation=True, max_length=64)
    assert (row["labels"], row["word_mask"]) == slow_alignment(enc.word_ids(), raw["tags"])
    assert sum(row["word_mask"]) == 5 < len(row["input_ids"]) - 2
    every = prepare_task_data(task, tokenizer, conll(tmp_path, max_length=64, label_all_subwords=True),
                              splits=("train", "dev"))
    assert every.train[0]["word_mask"] == row["word_mask"]
    names = task.labels
    expected = [-100 if w is None else raw["tags"][w] if first else
                names.index("I-" + names[raw["tags"][w]][2:]) if names[raw["tags"][w]] != "O" else 0
                for w, first in zip(enc.word_ids(), row["word_mask"])]
    assert every.train[0]["labels"] == expected  # a word's later sub-words continue its tag: B-X as I-X
    # dev is scored on first sub-words, whatever the training labels
    assert every.dev["labels"] == data_dev_labels(tokenizer, tmp_path)


def data_dev_labels(tokenizer, data_dir):
    from distillery.data.encode import prepare_task_data

    return prepare_task_data(get_task("conll2003"), tokenizer, conll(data_dir, max_length=64), splits=("dev",)).dev[
        "labels"]


# -- the task loss and the per-word distillation term ---------------------------------------------------------


def test_per_word_distillation_term_and_loss_equal_a_slow_reference():
    from distillery.kinds import kind_of
    from distillery.training.losses import kd_gap, kl_divergence, prediction_distillation, task_loss

    kind = kind_of("token_classification")
    g = torch.Generator().manual_seed(0)
    student, teacher = torch.randn(3, 7, 5, generator=g), torch.randn(3, 7, 5, generator=g)
    labels = torch.randint(0, 5, (3, 7), generator=g)
    mask = torch.rand(3, 7, generator=g) > 0.4
    mask[2] = False  # a row of no words
    labels[~mask] = -100
    batch = {"labels": labels, "word_mask": mask.long()}
    # slow: one word at a time
    words = [(b, i) for b in range(3) for i in range(7) if mask[b, i]]
    expected = sum(kl_divergence(student[b, i][None], teacher[b, i][None], 2.0) for b, i in words) / len(words)
    got = prediction_distillation(kind, student, teacher, temperature=2.0, loss="kl", batch=batch)
    assert_close(got, expected)
    assert_close(kd_gap(kind, student, teacher, 2.0, batch)["kl"], float(expected) / 4.0 * 4.0, rtol=1e-5, atol=1e-6)
    ce = sum(torch.nn.functional.cross_entropy(student[b, i][None], labels[b, i][None]) for b, i in words) / len(words)
    assert_close(task_loss(kind, student, batch), ce)
    per_row = task_loss(kind, student, batch, reduction="none")
    assert per_row.shape == (3,) and float(per_row[2]) == 0.0
    # rows without gold tags (a teacher-labelled sentence) still have their words: the word mask
    no_gold = {"word_mask": mask.long()}
    assert_close(prediction_distillation(kind, student, teacher, 2.0, "kl", batch=no_gold), expected)
    empty = {"word_mask": torch.zeros(3, 7, dtype=torch.long)}
    assert float(prediction_distillation(kind, student, teacher, 2.0, "kl", batch=empty)) == 0.0
    with pytest.raises(ValueError, match="pass the batch"):
        prediction_distillation(kind, student, teacher, 2.0, "kl")


# -- metrics -------------------------------------------------------------------------------------------------


def test_entity_scores_are_seqevals():
    from seqeval.metrics import f1_score, precision_score, recall_score

    from distillery.metrics import entity_metrics

    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["O", "I-ORG", "I-ORG", "O"]]
    pred = [["B-PER", "I-PER", "O", "O"], ["O", "B-ORG", "I-ORG", "B-LOC"]]
    scores = entity_metrics(gold, pred)
    assert scores["entity_f1"] == pytest.approx(f1_score(gold, pred))
    assert scores["entity_precision"] == pytest.approx(precision_score(gold, pred)) == pytest.approx(2 / 3)
    assert scores["entity_recall"] == pytest.approx(recall_score(gold, pred)) == pytest.approx(2 / 3)
    assert scores["token_accuracy"] == pytest.approx(5 / 8)  # tags compared as written: I-ORG is not B-ORG
    # I- after O starts an entity (seqeval's default mode, conlleval's): the ORG is found
    assert scores["f1_PER"] == 1.0 and scores["f1_ORG"] == 1.0 and scores["f1_LOC"] == 0.0
    # a type's precision and recall: two gold PER, one predicted and right
    by_type = entity_metrics([["B-PER", "O", "B-PER"]], [["B-PER", "O", "O"]])
    assert (by_type["precision_PER"], by_type["recall_PER"], by_type["f1_PER"]) == pytest.approx((1.0, 0.5, 2 / 3))
    assert entity_metrics([["O"]], [["O"]])["entity_f1"] == 0.0  # no entity at all: 0, never NaN


def test_scores_read_first_subwords_and_predict_cut_words_as_O(tiny_bert, conll_dir):
    """The vectorized scoring equals one word at a time, and a sentence cut by the length still has all its
    words scored (the cut ones as O)."""
    from distillery.data.encode import prepare_task_data
    from distillery.metrics import entity_metrics
    from distillery.modeling import load_tokenizer

    task = get_task("conll2003")
    data = prepare_task_data(task, load_tokenizer(tiny_bert), conll(conll_dir, max_length=8), splits=("dev",))
    rng = np.random.default_rng(0)
    longest = max(len(r) for r in data.dev["input_ids"])
    logits = rng.normal(size=(len(data.dev), longest, task.num_labels)).astype(np.float32)
    gold, pred = [], []
    for i, (mask, tags) in enumerate(zip(data.dev["word_mask"], data.dev_examples["tags"])):
        firsts = [p for p, m in enumerate(mask) if m]
        assert len(firsts) <= len(tags)
        pred.append([task.labels[int(logits[i, p].argmax())] for p in firsts] + ["O"] * (len(tags) - len(firsts)))
        gold.append([task.labels[t] for t in tags])
    assert any(len(t) > sum(m) for m, t in zip(data.dev["word_mask"], data.dev_examples["tags"]))  # some were cut
    assert task.kind_object.scores(data, logits) == entity_metrics(gold, pred)


# -- data: CoNLL-2003 and custom token files ------------------------------------------------------------------


@pytest.mark.skipif(not (SHARED_CONLL / "dev.txt").is_file(), reason="the shared CoNLL-2003 copy is not here")
def test_the_shared_conll2003_reads_as_its_readme_counts():
    task = get_task("conll2003")
    data_dir = SHARED_CONLL.parents[1]
    dev = load_raw(task, "dev", conll(data_dir))
    assert len(dev) == 3250 and len(load_raw(task, "test", conll(data_dir))) == 3453
    assert task.dev_splits == ("dev", "test") and task.main_metric == "entity_f1"
    tags = [task.labels[t] for s in dev["tags"] for t in s]
    assert sum(t.startswith("B-") for t in tags) == 1842 + 1837 + 1341 + 922  # IOB2: every entity starts with B-


def test_conll_files_skip_docstart_and_keep_tag_names(conll_dir):
    task = get_task("conll2003")
    train = load_raw(task, "train", conll(conll_dir))
    assert len(train) == 160 and train.column_names == ["tokens", "tags"]
    assert "-DOCSTART-" not in train[0]["tokens"]
    assert task.labels[0] == "O" and task.kind_object.head_config(task)["id2label"][4] == "B-PER"


def test_custom_token_files_conll_columns_and_jsonl(tmp_path):
    rows = synthetic_sentences(12, 3)
    conll_file = tmp_path / "train.txt"
    conll_file.write_text("\n\n".join("\n".join(f"{t}\t{w}" for w, t in s) for s in rows) + "\n")
    task = custom_task(DataConfig(task="custom", train_file=str(conll_file), token_column=1, tag_column=0))
    assert task.kind == "token_classification" and task.labels[0] == "O"
    assert task.labels == ("O", "B-LOC", "B-ORG", "B-PER", "I-LOC", "I-ORG", "I-PER")  # sorted; B- and I- of each
    raw = load_raw(task, "train", DataConfig(task="custom", train_file=str(conll_file), token_column=1, tag_column=0))
    assert raw[0]["tokens"] == [w for w, _ in rows[0]]
    assert [task.labels[t] for t in raw[0]["tags"]] == [t for _, t in rows[0]]
    jsonl = tmp_path / "dev.jsonl"
    jsonl.write_text("\n".join(json.dumps({"tokens": [w for w, _ in s], "tags": [t for _, t in s]}) for s in rows))
    config = DataConfig(task="custom", train_file=str(jsonl), dev_file=str(jsonl))
    spec = task_for(config)
    assert spec.labels == task.labels and spec.kind_object.head_config(spec)["label2id"]["I-ORG"] == 5
    assert load_raw(spec, "dev", config)["tokens"] == raw["tokens"]


# -- bad input: one sentence naming file and line ---------------------------------------------------------------


def bad(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@pytest.mark.parametrize("name, text, words", [
    ("missing.conll", "EU B-ORG\nrejects O\ncall\n", r"missing.conll, line 3: no tag in the last column"),
    ("prefix.conll", "EU B-ORG\nPeter X-PER\n", r"prefix.conll, line 2: tag 'X-PER' is not an IOB tag"),
    ("bare.conll", "EU B-\n", r"bare.conll, line 1: tag 'B-' is not an IOB tag"),
    ("empty.jsonl", '{"tokens": ["a"], "tags": ["B-X"]}\n{"tokens": [], "tags": []}\n',
     r"empty.jsonl, line 2: an empty sentence"),
    ("short.jsonl", '{"tokens": ["a", "b"], "tags": ["O"]}\n', r"short.jsonl, line 1: 2 tokens but 1 tags"),
    ("notlist.jsonl", '{"tokens": "a b", "tags": ["O", "O"]}\n', r"notlist.jsonl, line 1: 'tokens' must be a list"),
])
def test_bad_token_files_are_named_with_their_line(tmp_path, name, text, words):
    path = bad(tmp_path / name, text)
    with pytest.raises(DistilleryError, match=words):
        custom_task(DataConfig(task="custom", train_file=str(path)))


def test_i_after_o_is_accepted(tmp_path):
    path = bad(tmp_path / "iob1.conll", "EU I-ORG\nsaid O\n\nPeter I-PER\n")
    assert custom_task(DataConfig(task="custom", train_file=str(path))).labels == ("O", "B-ORG", "B-PER", "I-ORG",
                                                                                     "I-PER")


def test_a_tag_the_task_does_not_have_is_named(tmp_path, conll_dir):
    folder = tmp_path / "ner" / "conll2003"
    folder.mkdir(parents=True)
    (folder / "train.txt").write_text("EU NNP B-NP B-ORG\nrejects VBZ B-VP B-FOO\n")
    with pytest.raises(DistilleryError, match=r"train.txt, line 2: tag 'B-FOO' does not occur in"):
        load_raw(get_task("conll2003"), "train", conll(tmp_path))
    train = bad(tmp_path / "train.conll", "EU B-ORG\n\nPeter B-PER\n")
    dev = bad(tmp_path / "dev.conll", "Paris B-LOC\n")
    config = DataConfig(task="custom", train_file=str(train), dev_file=str(dev))
    with pytest.raises(DistilleryError, match=r"dev.conll, line 1: tag 'B-LOC' does not occur in the train file"):
        load_raw(task_for(config), "dev", config)


def test_token_files_and_sentence_files_are_not_mixed(tmp_path):
    tokens = bad(tmp_path / "tokens.jsonl", '{"tokens": ["EU"], "tags": ["B-ORG"]}\n')
    sentences = bad(tmp_path / "sentences.csv", "text,label\ngood,pos\nbad,neg\n")
    with pytest.raises(DistilleryError, match=r"--dev-file .*sentences.csv holds sentences, but task custom tags words"):
        task_for(DataConfig(task="custom", train_file=str(tokens), dev_file=str(sentences)))
    with pytest.raises(DistilleryError, match=r"--dev-file .*tokens.jsonl holds tagged words .* task custom labels whole"):
        task_for(DataConfig(task="custom", train_file=str(sentences), dev_file=str(tokens)))
    with pytest.raises(DistilleryError, match=r"--unlabeled-file .*tokens.jsonl holds tagged words .* task sst2"):
        load_unlabeled(tokens, get_task("sst2"))
    with pytest.raises(DistilleryError, match=r"--text-column do not apply"):
        task_for(DataConfig(task="custom", train_file=str(tokens), text_column="text"))


# -- end to end -------------------------------------------------------------------------------------------------


def test_compress_conll2003_end_to_end_with_int8_and_a_fresh_pipeline(monkeypatch, capsys, tiny_bert, conll_dir,
                                                                      tmp_path):
    out = tmp_path / "run"
    code, _, err = run_cli(monkeypatch, capsys, "compress", "--task", "conll2003", "--data-dir", str(conll_dir),
                           "--teacher", tiny_bert, "--out", str(out), "--config", str(tiny_ner_settings(tmp_path / "s.yaml")),
                           "--int8", "--no-baselines")
    assert code == 0, err
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["main_metric"] == "entity_f1" and metrics["task"] == "conll2003"
    assert {"entity_f1", "entity_precision", "entity_recall", "token_accuracy", "f1_LOC", "f1_PER"} <= set(
        metrics["student"])
    assert metrics["teacher"]["entity_f1"] > 0.5  # the synthetic entities are learnt
    assert metrics["chance"]["predictor"] == "always O (no entity)" and metrics["chance"]["main"] == 0.0
    assert set(metrics["other_splits"]) == {"test"}
    (int8,) = [name for name in metrics["others"] if "int8" in name]
    assert set(metrics["others"][int8]) == set(metrics["student"])
    manifest = json.loads(next((out / "exports").glob("*/distillery_export.json")).read_text())
    assert manifest["head"] == "token-classification" and manifest["scores"]["main_metric"] == "entity_f1"
    assert manifest["parity"]["fp32"]["passed"] and manifest["parity"]["int8_vs_fp32"]["argmax_agreement"] > 0.9
    card = (out / "student" / "README.md").read_text()
    assert "pipeline_tag: token-classification" in card
    assert "entity_f1" in (out / "report.md").read_text()
    config = json.loads((out / "student" / "config.json").read_text())
    assert config["architectures"] == ["BertForTokenClassification"] and config["id2label"]["4"] == "B-PER"

    # the fp32 ONNX export: parity-checked against torch and scored on the task like every export
    code, stdout, err = run_cli(monkeypatch, capsys, "export", str(out), "--format", "onnx", "--task", "conll2003",
                                "--data-dir", str(conll_dir))
    assert code == 0, err
    onnx = json.loads((out / "exports" / "student-onnx" / "distillery_export.json").read_text())
    assert onnx["parity"]["fp32"]["passed"] and onnx["outputs"] == ["logits"]
    assert onnx["scores"]["export"]["entity_f1"] == pytest.approx(onnx["scores"]["source"]["entity_f1"], abs=0.02)

    # a fresh process, no distillery: transformers' own pipeline groups the student's tags into named entities, and
    # the export's tokenizer is the student's
    script = ("import sys\nfrom transformers import AutoTokenizer, pipeline\n"
              "tagger = pipeline('token-classification', model=sys.argv[1], aggregation_strategy='simple')\n"
              "found = tagger(['the actor was born in paris', 'where is london', 'first name was very fun'])\n"
              "text = 'the actor was born in paris'\n"
              "assert AutoTokenizer.from_pretrained(sys.argv[2])(text).input_ids == tagger.tokenizer(text).input_ids\n"
              "assert 'distillery' not in sys.modules\n"
              "print(sorted({e['entity_group'] for s in found for e in s}))\n")
    result = subprocess.run([sys.executable, "-c", script, str(out / "student"), str(out / "exports" / "student-onnx")],
                            capture_output=True, text=True, timeout=300,
                            env={"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"})
    assert result.returncode == 0, result.stderr[-2000:]
    groups = eval(result.stdout.strip().splitlines()[-1])
    assert groups and set(groups) <= {"LOC", "ORG", "PER", "MISC"}, result.stdout


def test_a_method_that_does_not_handle_token_classification_refuses_in_a_sentence(monkeypatch, capsys, tiny_bert,
                                                                                   conll_dir, tmp_path):
    """Method.unhandled_kinds: a method listing the kind is refused in a sentence before the run folder is made
    (every method tags now: moebert stands in for one that would not)."""
    from distillery.method import get_method

    monkeypatch.setattr(type(get_method("moebert")), "unhandled_kinds", ("token_classification",))
    code, _, err = run_cli(monkeypatch, capsys, "compress", "--task", "conll2003", "--data-dir", str(conll_dir),
                           "--teacher", tiny_bert, "--method", "moebert", "--out", str(tmp_path / "run"), *NO_EXTRAS)
    assert_one_line_error(code, err, "moebert does not handle token classification yet")
    assert not (tmp_path / "run").exists()


def test_a_file_of_sentences_as_a_taggers_unlabeled_text_is_refused_before_training(monkeypatch, capsys, tiny_bert,
                                                                                     conll_dir, tmp_path):
    unlabeled = bad(tmp_path / "more.jsonl", '{"text": "paris is a city"}\n')
    code, _, err = run_cli(monkeypatch, capsys, "compress", "--task", "conll2003", "--data-dir", str(conll_dir),
                           "--teacher", tiny_bert, "--out", str(tmp_path / "run"), "--unlabeled-file", str(unlabeled),
                           *NO_EXTRAS)
    assert_one_line_error(code, err, "more.jsonl, line 1: 'tokens' must be a non-empty list of words, not missing")
    assert not (tmp_path / "run").exists()


def test_label_all_subwords_with_a_sentence_task_is_refused(monkeypatch, capsys, tiny_bert, glue_dir, tmp_path):
    code, _, err = run_cli(monkeypatch, capsys, "compress", "--task", "sst2", "--data-dir", str(glue_dir),
                           "--teacher", tiny_bert, "--out", str(tmp_path / "run"), "--label-all-subwords", *NO_EXTRAS)
    assert_one_line_error(code, err, "--label-all-subwords labels the sub-words of tagged words, but task sst2")


def test_a_tagger_is_not_scored_on_a_sentence_task(tmp_path):
    from transformers import BertForTokenClassification

    from distillery.evaluation import check_trained_task
    from tests.helpers import tiny_bert_config

    config = tiny_bert_config(num_labels=2, architectures=["BertForTokenClassification"],
                              id2label={0: "O", 1: "B-X"}, label2id={"O": 0, "B-X": 1})
    folder = tmp_path / "tagger"
    BertForTokenClassification(config).save_pretrained(folder)
    (folder / "config.json").write_text(json.dumps({**json.loads((folder / "config.json").read_text()),
                                                    "finetuning_task": "conll2003"}))
    with pytest.raises(DistilleryError, match=r"trained for conll2003 .* with tags O, B-X, and --task sst2 has labels "
                                              r"negative, positive, another head"):
        check_trained_task(folder, config, get_task("sst2"), other_task=True)
