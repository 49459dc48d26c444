"""Tasks, raw loading (GLUE TSV, SQuAD JSON, custom files), encoding and SQuAD post-processing."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import datasets
import numpy as np
import pytest
import torch
from transformers import AutoTokenizer

from distillery.config import DataConfig
from distillery.data import (
    TASKS,
    custom_task,
    encode_squad_eval,
    encode_squad_train,
    get_task,
    load_raw,
    postprocess_squad,
    prepare_task_data,
    squad_holdout_split,
)
from distillery.errors import DistilleryError

datasets.disable_progress_bars()
SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"


def cfg(data_dir=None, **kw) -> DataConfig:
    kw.setdefault("doc_stride", 16)
    return DataConfig(data_dir=str(data_dir) if data_dir is not None else None, **kw)


def write(path: Path, text: str, bom: bool = False) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes((b"\xef\xbb\xbf" if bom else b"") + text.encode("utf-8"))
    return path


COLA = (
    "gj04\t1\t\tthe movie was good .\n"
    'bc01\t0\t*\tthe "film was bad .\n'  # a lone quote must not swallow the next rows
    "bc01\t1\t\tthe plot is fun .\n"
)
SST2 = 'sentence\tlabel\na " great movie \t1\nboring film \t0\nvery fun \t1\nawful plot \t0\n'
MRPC = (
    "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
    "1\t1\t2\tthe film was good .\tthe movie was good .\n"
    "0\t3\t4\tparis is a city .\tlondon is a river .\n"
)
STSB = (
    "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"
    "0\tmain\tx\t2012\t0\tnone\tnone\ta good movie .\ta great film .\t4.750\n"
    "1\tmain\tx\t2012\t1\tnone\tnone\tparis .\tlondon .\t0.500\n"
)
MNLI_HEADER = "index\tpromptID\tpairID\tgenre\tsentence1\tsentence2\tlabel1\tgold_label\n"


@pytest.fixture()
def glue_dir(tmp_path):
    write(tmp_path / "glue" / "CoLA" / "train.tsv", COLA)
    write(tmp_path / "glue" / "CoLA" / "dev.tsv", COLA)
    write(tmp_path / "glue" / "SST-2" / "train.tsv", SST2)
    write(tmp_path / "glue" / "SST-2" / "dev.tsv", SST2)
    write(tmp_path / "glue" / "MRPC" / "train.tsv", MRPC, bom=True)
    write(tmp_path / "glue" / "MRPC" / "dev.tsv", MRPC, bom=True)
    write(tmp_path / "glue" / "STS-B" / "train.tsv", STSB)
    write(tmp_path / "glue" / "STS-B" / "dev.tsv", STSB)
    write(tmp_path / "glue" / "QNLI" / "dev.tsv", "index\tquestion\tsentence\tlabel\n0\twho ?\tparis .\tentailment\n")
    matched = MNLI_HEADER + "0\t1\t1\tfiction\tthe film .\tthe movie .\tneutral\tneutral\n"
    mismatched = MNLI_HEADER + "0\t1\t1\tletters\ta city .\ta river .\tcontradiction\tcontradiction\n"
    write(tmp_path / "glue" / "MNLI" / "dev_matched.tsv", matched)
    write(tmp_path / "glue" / "MNLI" / "dev_mismatched.tsv", mismatched)
    return tmp_path


# --- tasks ---------------------------------------------------------------------------------------


def test_registry_describes_every_task():
    assert set(TASKS) == {"cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte", "wnli", "squad", "squad_v2",
                          "conll2003", "embedding"}
    assert get_task("cola").metrics == ("mcc",)
    assert get_task("mrpc").main_metric == "f1" and get_task("qqp").metrics == ("f1", "accuracy")
    assert get_task("stsb").kind == "regression" and get_task("stsb").num_labels == 1
    assert get_task("mnli").num_labels == 3 and get_task("mnli").dev_splits == ("dev_matched", "dev_mismatched")
    assert get_task("sst2").dev_splits == ("dev",) and not get_task("sst2").is_pair
    assert get_task("squad").squad_version == 1 and get_task("squad_v2").squad_version == 2
    assert "NoAns_f1" in get_task("squad_v2").metrics and get_task("squad_v2").main_metric == "f1"
    assert get_task("SST-2") is get_task("sst2")


def test_unknown_task_lists_known_ones():
    with pytest.raises(DistilleryError, match="Unknown task 'sst3'.*sst2.*squad_v2"):
        get_task("sst3")


# --- GLUE TSV ------------------------------------------------------------------------------------


def test_cola_has_no_header_and_keeps_quotes(glue_dir):
    ds = load_raw(get_task("cola"), "train", cfg(glue_dir))
    assert ds.column_names == ["text", "label"]
    assert ds["text"] == ["the movie was good .", 'the "film was bad .', "the plot is fun ."]
    assert ds["label"] == [1, 0, 1]


def test_sst2_quote_does_not_merge_rows(glue_dir):
    ds = load_raw(get_task("sst2"), "train", cfg(glue_dir))
    assert len(ds) == 4 and ds[0] == {"text": 'a " great movie', "label": 1}


def test_mrpc_bom_and_header_names(glue_dir):
    ds = load_raw(get_task("mrpc"), "dev", cfg(glue_dir))
    assert ds.column_names == ["text", "text_pair", "label"]
    assert ds[0] == {"text": "the film was good .", "text_pair": "the movie was good .", "label": 1}
    assert ds.features["label"].dtype == "int64"


def test_stsb_is_float_regression(glue_dir):
    ds = load_raw(get_task("stsb"), "train", cfg(glue_dir))
    assert ds.features["label"].dtype == "float32"
    assert ds["label"] == pytest.approx([4.75, 0.5])
    assert ds[0]["text_pair"] == "a great film ."


def test_mnli_dev_splits_and_label_order(glue_dir):
    task = get_task("mnli")
    matched = load_raw(task, "dev", cfg(glue_dir))
    mismatched = load_raw(task, "dev_mismatched", cfg(glue_dir))
    assert matched["label"] == [task.labels.index("neutral")]
    assert mismatched["label"] == [task.labels.index("contradiction")]
    with pytest.raises(DistilleryError, match="no split 'test'"):
        load_raw(task, "test", cfg(glue_dir))


def test_task_folder_directly_under_data_dir(tmp_path):
    write(tmp_path / "SST-2" / "dev.tsv", SST2)  # download_glue_data.py layout
    assert len(load_raw(get_task("sst2"), "dev", cfg(tmp_path))) == 4


def test_train_limit_is_seeded_and_dev_limit_takes_first(glue_dir):
    a = load_raw(get_task("sst2"), "train", cfg(glue_dir, train_limit=2, seed=1))
    b = load_raw(get_task("sst2"), "train", cfg(glue_dir, train_limit=2, seed=1))
    assert len(a) == 2 and a["text"] == b["text"]
    assert load_raw(get_task("sst2"), "dev", cfg(glue_dir, dev_limit=2))["text"] == ["a \" great movie", "boring film"]


def test_malformed_row_names_file_and_line(tmp_path):
    path = write(tmp_path / "glue" / "SST-2" / "train.tsv", "sentence\tlabel\ngood\t1\nno label here\n")
    with pytest.raises(DistilleryError, match=rf"{path}, line 3: expected 2 tab-separated fields as its header has, found 1"):
        load_raw(get_task("sst2"), "train", cfg(tmp_path))


def test_label_outside_task_labels(tmp_path):
    path = write(tmp_path / "glue" / "RTE" / "train.tsv", "index\tsentence1\tsentence2\tlabel\n0\ta\tb\tmaybe\n")
    with pytest.raises(DistilleryError, match=rf"{path}, line 2: label 'maybe' is not one of .*entailment"):
        load_raw(get_task("rte"), "train", cfg(tmp_path))


def test_non_numeric_score(tmp_path):
    write(tmp_path / "glue" / "STS-B" / "train.tsv", STSB.replace("0.500", "high"))
    with pytest.raises(DistilleryError, match="line 3: score 'high' is not a number"):
        load_raw(get_task("stsb"), "train", cfg(tmp_path))


def test_empty_files(tmp_path):
    write(tmp_path / "glue" / "SST-2" / "train.tsv", "")
    write(tmp_path / "glue" / "SST-2" / "dev.tsv", "sentence\tlabel\n")
    with pytest.raises(DistilleryError, match="train.tsv is empty"):
        load_raw(get_task("sst2"), "train", cfg(tmp_path))
    with pytest.raises(DistilleryError, match="dev.tsv has a header but no examples"):
        load_raw(get_task("sst2"), "dev", cfg(tmp_path))


def test_missing_header_column(tmp_path):
    write(tmp_path / "glue" / "SST-2" / "train.tsv", "text\tlabel\ngood\t1\n")
    with pytest.raises(DistilleryError, match="has no column 'sentence'; its columns are text, label"):
        load_raw(get_task("sst2"), "train", cfg(tmp_path))


def test_data_folder_without_the_task(glue_dir):
    with pytest.raises(DistilleryError, match=r"No QQP folder for task qqp in .*looked in .*glue/QQP"):
        load_raw(get_task("qqp"), "train", cfg(glue_dir))
    with pytest.raises(DistilleryError, match=r"QNLI train.tsv not found in .*QNLI \(it holds dev.tsv\)"):
        load_raw(get_task("qnli"), "train", cfg(glue_dir))
    with pytest.raises(DistilleryError, match="does not exist"):
        load_raw(get_task("sst2"), "train", cfg(glue_dir / "nowhere"))


# --- SQuAD ---------------------------------------------------------------------------------------

CONTEXT_PARIS = "paris is a city in france . it was first named lutetia ."
CONTEXT_LONDON = "london is a city on a river . the river is the thames ."


def squad_json(version: int, bad_offset: bool = False) -> dict:
    def qa(qid, question, answer, context, impossible=False):
        answers = [] if impossible else [{"text": answer, "answer_start": context.index(answer) + bad_offset}]
        item = {"question": question, "id": qid, "answers": answers}
        if version == 2:
            item["is_impossible"] = impossible
        return item

    data = [
        {"title": "Paris", "paragraphs": [{"context": CONTEXT_PARIS, "qas": [
            qa("p1", "where is paris ?", "france", CONTEXT_PARIS),
            qa("p2", "what was paris first named ?", "lutetia", CONTEXT_PARIS),
        ]}]},
        {"title": "London", "paragraphs": [{"context": CONTEXT_LONDON, "qas": [
            qa("l1", "what is the river ?", "the thames", CONTEXT_LONDON),
        ] + ([qa("l2", "who was born in london ?", None, CONTEXT_LONDON, impossible=True)] if version == 2 else [])}]},
    ]
    return {"version": "1.1" if version == 1 else "v2.0", "data": data}


@pytest.fixture()
def squad_dir(tmp_path):
    write(tmp_path / "squad" / "dev-v1.1.json", json.dumps(squad_json(1)))
    write(tmp_path / "squad" / "dev-v2.0.json", json.dumps(squad_json(2)))
    return tmp_path


def test_squad_reads_examples(squad_dir):
    ds = load_raw(get_task("squad"), "dev", cfg(squad_dir))
    assert ds.column_names == ["id", "title", "context", "question", "answers"]
    assert ds["id"] == ["p1", "p2", "l1"]
    assert ds[0]["answers"] == {"text": ["france"], "answer_start": [CONTEXT_PARIS.index("france")]}
    v2 = load_raw(get_task("squad_v2"), "dev", cfg(squad_dir))
    assert v2[3]["answers"] == {"text": [], "answer_start": []}


def test_squad_train_missing_suggests_holdout(squad_dir):
    with pytest.raises(DistilleryError, match=r"SQuAD train-v1.1.json not found in .*squad; use --squad-holdout"):
        load_raw(get_task("squad"), "train", cfg(squad_dir))


def test_squad_folder_missing(tmp_path):
    with pytest.raises(DistilleryError, match=r"No SQuAD v2.0 files"):
        load_raw(get_task("squad_v2"), "dev", cfg(tmp_path))


def test_squad_answer_offset_mismatch(tmp_path):
    path = write(tmp_path / "squad" / "dev-v1.1.json", json.dumps(squad_json(1, bad_offset=True)))
    with pytest.raises(DistilleryError, match=rf"{path}, question p1: answer 'france' is not at its answer_start"):
        load_raw(get_task("squad"), "dev", cfg(tmp_path))


def test_squad_holdout_splits_by_article(squad_dir):
    task = get_task("squad")
    # int(sha1(title)) % 10000: "London" 793, "Paris" 2709, so 0.2 holds out London only.
    train = load_raw(task, "train", cfg(squad_dir, squad_holdout=0.2))
    dev = load_raw(task, "dev", cfg(squad_dir, squad_holdout=0.2))
    assert set(dev["title"]) == {"London"} and set(train["title"]) == {"Paris"}
    assert len(train) + len(dev) == 3
    with pytest.raises(DistilleryError, match="leaves the held-out dev part empty"):
        load_raw(task, "dev", cfg(squad_dir, squad_holdout=0.05))
    with pytest.raises(DistilleryError, match="leaves the train part empty"):
        load_raw(task, "train", cfg(squad_dir, squad_holdout=0.5))


# --- custom files --------------------------------------------------------------------------------


def custom_cfg(tmp_path, train, dev=None, **kw):
    return cfg(task="custom", train_file=str(train), dev_file=str(dev) if dev else None,
               text_column="review", label_column="stars", **kw)


def test_custom_csv_with_quoted_commas(tmp_path):
    train = write(tmp_path / "train.csv", 'review,stars\n"good, really good",pos\nbad,neg\n"a ""fun"" film",pos\n')
    task = custom_task(custom_cfg(tmp_path, train))
    assert task.kind == "classification" and task.labels == ("neg", "pos")
    assert task.metrics == ("accuracy", "macro_f1") and task.main_metric == "accuracy"
    ds = load_raw(task, "train", custom_cfg(tmp_path, train))
    assert ds["text"] == ["good, really good", "bad", 'a "fun" film'] and ds["label"] == [1, 0, 1]


def test_a_custom_file_is_parsed_once_per_version(tmp_path, monkeypatch):
    """The task's labels, its train split and the whole split read one parse of the file; an edited file is read again."""
    import os

    import distillery.data.files as files

    train = tmp_path / "train.csv"
    train.write_text("review,stars\ngood,pos\nbad,neg\n")
    parses = []
    real = files._table_records
    monkeypatch.setattr(files, "_table_records", lambda *a, **k: (parses.append(1), real(*a, **k))[1])
    task = custom_task(custom_cfg(tmp_path, train))
    assert len(load_raw(task, "train", custom_cfg(tmp_path, train))) == 2
    assert len(load_raw(task, "train", custom_cfg(tmp_path, train))) == 2
    assert len(parses) == 1
    train.write_text("review,stars\ngood,pos\nbad,neg\nfine,pos\n")
    os.utime(train, ns=(1, 1))  # a new version even within the file system's time resolution
    assert len(load_raw(task, "train", custom_cfg(tmp_path, train))) == 3 and len(parses) == 2


def test_custom_tsv_and_jsonl_pair(tmp_path):
    tsv = write(tmp_path / "train.tsv", 'review\tother\tstars\na "b\tc\t10\nd\te\t2\n')
    task = custom_task(cfg(task="custom", train_file=str(tsv), text_column="review", text_pair_column="other",
                           label_column="stars"))
    assert task.labels == ("2", "10") and task.is_pair  # numeric labels sort by value
    jsonl = write(tmp_path / "dev.jsonl", '{"review": "x", "other": "y", "stars": 10}\n\n{"review": "z", "other": "w", "stars": 2}\n')
    data = cfg(task="custom", train_file=str(tsv), dev_file=str(jsonl), text_column="review",
               text_pair_column="other", label_column="stars")
    ds = load_raw(task, "dev", data)
    assert ds["text_pair"] == ["y", "w"] and ds["label"] == [1, 0]


def test_custom_regression(tmp_path):
    train = write(tmp_path / "train.jsonl", '{"review": "a", "stars": 1.5}\n{"review": "b", "stars": 3}\n')
    data = custom_cfg(tmp_path, train, regression=True)
    task = custom_task(data)
    assert task.kind == "regression" and task.num_labels == 1 and task.main_metric == "pearson"
    assert load_raw(task, "train", data)["label"] == [1.5, 3.0]
    bad = write(tmp_path / "bad.jsonl", '{"review": "a", "stars": 1.5}\n{"review": "b", "stars": "lots"}\n')
    with pytest.raises(DistilleryError, match=r"bad.jsonl, line 2: label 'lots' .* is not a number"):
        custom_task(custom_cfg(tmp_path, bad, regression=True))


def test_custom_bad_inputs(tmp_path):
    train = write(tmp_path / "train.csv", "text,label\ngood,pos\nbad,neg\n")
    with pytest.raises(DistilleryError, match=r"train.csv has no column 'review'; its columns are text, label"):
        custom_task(custom_cfg(tmp_path, train))
    empty = write(tmp_path / "empty.csv", "")
    with pytest.raises(DistilleryError, match="empty.csv is empty"):
        custom_task(custom_cfg(tmp_path, empty))
    header_only = write(tmp_path / "header.jsonl", "\n")
    with pytest.raises(DistilleryError, match="header.jsonl has no examples"):
        custom_task(custom_cfg(tmp_path, header_only))
    with pytest.raises(DistilleryError, match="does not exist"):
        custom_task(custom_cfg(tmp_path, tmp_path / "nope.csv"))
    with pytest.raises(DistilleryError, match="unknown data format .txt"):
        custom_task(custom_cfg(tmp_path, write(tmp_path / "a.txt", "x")))
    good = write(tmp_path / "good.csv", "review,stars\ngood,pos\nbad,neg\n")
    dev = write(tmp_path / "dev.csv", "review,stars\nmeh,neutral\n")
    data = custom_cfg(tmp_path, good, dev)
    with pytest.raises(DistilleryError, match=r"dev.csv, line 2: label 'neutral' does not occur in the train file"):
        load_raw(custom_task(data), "dev", data)
    broken = write(tmp_path / "broken.jsonl", '{"review": "a", "stars": 1}\n{"review": \n')
    with pytest.raises(DistilleryError, match="broken.jsonl, line 2: not valid JSON"):
        custom_task(custom_cfg(tmp_path, broken))


# --- encoding ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bert_tok(tiny_bert):
    return AutoTokenizer.from_pretrained(tiny_bert)


@pytest.fixture(scope="module")
def roberta_tok(tiny_roberta):
    return AutoTokenizer.from_pretrained(tiny_roberta)


def test_encode_single_and_collate(glue_dir, bert_tok):
    data = prepare_task_data(get_task("sst2"), bert_tok, cfg(glue_dir))
    assert data.train.column_names == ["input_ids", "attention_mask", "token_type_ids", "labels"]
    assert data.dev_examples["text"][0] == 'a " great movie'
    batch = data.collate([data.train[i] for i in range(3)])
    assert set(batch) == {"input_ids", "attention_mask", "token_type_ids", "labels"}
    lengths = [len(data.train[i]["input_ids"]) for i in range(3)]
    assert batch["input_ids"].shape == (3, max(lengths)) and batch["labels"].dtype == torch.long
    short = int(np.argmin(lengths))
    assert batch["input_ids"][short, -1] == bert_tok.pad_token_id and batch["attention_mask"][short, -1] == 0


def test_encode_pair_joint_roberta_has_no_token_types(glue_dir, roberta_tok, bert_tok):
    data = prepare_task_data(get_task("mrpc"), roberta_tok, cfg(glue_dir), splits=("dev",))
    assert data.train is None and data.dev.column_names == ["input_ids", "attention_mask", "labels"]
    data = prepare_task_data(get_task("mrpc"), bert_tok, cfg(glue_dir), splits=("dev",))
    ids = data.dev[0]["input_ids"]
    assert ids[0] == bert_tok.cls_token_id and ids.count(bert_tok.sep_token_id) == 2
    assert 1 in data.dev[0]["token_type_ids"]


def test_encode_separate_pair(glue_dir, bert_tok):
    data = prepare_task_data(get_task("mrpc"), bert_tok, cfg(glue_dir), pair_mode="separate")
    assert data.train.column_names == ["input_ids", "attention_mask", "input_ids_b", "attention_mask_b", "labels"]
    assert data.train[0]["input_ids"] == bert_tok("the film was good .")["input_ids"]
    batch = data.collate([data.train[0], data.train[1]])
    assert batch["input_ids_b"].shape[0] == 2 and batch["attention_mask_b"].shape == batch["input_ids_b"].shape


def test_regression_labels_are_float32(glue_dir, bert_tok):
    data = prepare_task_data(get_task("stsb"), bert_tok, cfg(glue_dir))
    assert data.train.features["labels"].dtype == "float32"
    assert data.collate([data.train[0]])["labels"].dtype == torch.float32


def test_truncation_is_counted_once(tmp_path, bert_tok, caplog):
    # Out-of-vocabulary words split into one token per character: "xyzzy plugh" needs 10 + 2 tokens.
    write(tmp_path / "glue" / "SST-2" / "train.tsv", "sentence\tlabel\nxyzzy plugh\t1\ngood movie\t0\nbad film\t1\n")
    assert [len(bert_tok(t)["input_ids"]) for t in ("xyzzy plugh", "good movie")] == [12, 4]
    with caplog.at_level(logging.WARNING, logger="distillery"):
        data = prepare_task_data(get_task("sst2"), bert_tok, cfg(tmp_path, max_length=8, doc_stride=4), splits=("train",))
    warnings = [r.getMessage() for r in caplog.records if "truncated" in r.getMessage()]
    assert warnings == ["1 of 3 train examples were truncated to 8 tokens"]
    assert [len(x) for x in data.train["input_ids"]] == [8, 4, 4]
    assert data.train[0]["input_ids"][-1] == bert_tok.sep_token_id


def test_bad_pair_mode(glue_dir, bert_tok):
    with pytest.raises(DistilleryError, match="pair_mode"):
        prepare_task_data(get_task("mrpc"), bert_tok, cfg(glue_dir), pair_mode="sideways")


# --- SQuAD encoding and post-processing ----------------------------------------------------------


def _peaked_logits(eval_features, train_features):
    """Logits that put all mass on the gold start/end of each window (CLS where no answer)."""
    width = max(len(x) for x in eval_features["input_ids"])
    start = np.zeros((len(eval_features), width), dtype=np.float32)
    end = np.zeros_like(start)
    for i, (s, e) in enumerate(zip(train_features["start_positions"], train_features["end_positions"])):
        start[i, s] = end[i, e] = 10.0
    return start, end


@pytest.mark.parametrize("version", [1, 2])
def test_squad_encode_then_postprocess_recovers_gold(squad_dir, bert_tok, version):
    task = get_task("squad" if version == 1 else "squad_v2")
    examples = load_raw(task, "dev", cfg(squad_dir))
    # Windows of 24 tokens: each context (about 18 tokens) needs two overlapping windows.
    train = encode_squad_train(examples, bert_tok, max_length=24, doc_stride=6)
    evalf = encode_squad_eval(examples, bert_tok, max_length=24, doc_stride=6)
    assert len(train) == len(evalf) > len(examples)
    assert "example_id" in evalf.column_names and "offset_mapping" in evalf.column_names
    for i, offsets in enumerate(evalf["offset_mapping"]):
        assert offsets[0] is None  # [CLS] is never part of the context
        s = train[i]["start_positions"]
        if s:  # the window holds the answer: offsets point at its text
            ex = examples[examples["id"].index(evalf[i]["example_id"])]
            text = ex["context"][offsets[s][0] : offsets[train[i]["end_positions"]][1]]
            assert text == ex["answers"]["text"][0]
    start, end = _peaked_logits(evalf, train)
    preds = postprocess_squad(examples, evalf, start, end, version_2=version == 2)
    gold = {e["id"]: (e["answers"]["text"][0] if e["answers"]["text"] else "") for e in examples}
    assert preds == gold


def test_squad_v2_threshold_and_v1_never_empty(squad_dir, bert_tok):
    examples = load_raw(get_task("squad_v2"), "dev", cfg(squad_dir))
    evalf = encode_squad_eval(examples, bert_tok, max_length=40, doc_stride=12)
    width = max(len(x) for x in evalf["input_ids"])
    start = np.zeros((len(evalf), width), dtype=np.float32)
    end = np.zeros_like(start)
    start[:, 0] = end[:, 0] = 1.0  # null score 2.0 beats every span (0.0)
    assert set(postprocess_squad(examples, evalf, start, end, version_2=True).values()) == {""}
    # A high threshold keeps the best span; v1 always answers with a span.
    assert "" not in postprocess_squad(examples, evalf, start, end, version_2=True, null_score_threshold=5.0).values()
    assert "" not in postprocess_squad(examples, evalf, start, end, version_2=False).values()


def test_squad_collate_drops_postprocessing_columns(squad_dir, bert_tok):
    data = prepare_task_data(get_task("squad"), bert_tok, cfg(squad_dir, max_length=24, doc_stride=6, squad_holdout=0.2))
    assert {"start_positions", "end_positions"} <= set(data.train.column_names)
    assert len(data.dev) >= 2 and set(data.dev["example_id"]) == {"l1"}
    batch = data.collate([data.dev[0], data.dev[1]])
    assert set(batch) == {"input_ids", "attention_mask", "token_type_ids"}
    train_batch = data.collate([data.train[0], data.train[1]])
    assert train_batch["start_positions"].dtype == torch.long


def test_long_question_is_cut_not_refused(squad_dir, bert_tok):
    examples = load_raw(get_task("squad"), "dev", cfg(squad_dir))
    long_q = examples.map(lambda e: {"question": "what " * 200})
    features = encode_squad_eval(long_q, bert_tok, max_length=32, doc_stride=16)
    assert max(len(x) for x in features["input_ids"]) <= 32
    assert all(any(o is not None for o in offs) for offs in features["offset_mapping"])


# --- the real shared data ------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.skipif(not (SHARED / "glue" / "SST-2" / "train.tsv").is_file(), reason="shared data not present")
def test_real_shared_data_row_counts():
    data = cfg(SHARED)
    assert len(load_raw(get_task("sst2"), "train", data)) == 67349
    assert len(load_raw(get_task("sst2"), "dev", data)) == 872
    assert len(load_raw(get_task("mrpc"), "train", data)) == 3668
    assert len(load_raw(get_task("cola"), "train", data)) == 8551
    assert len(load_raw(get_task("stsb"), "dev", data)) == 1500
    squad = load_raw(get_task("squad"), "dev", data)
    assert len(squad) == 10570
    train, dev = squad_holdout_split(squad, 0.1)
    assert len(train) + len(dev) == 10570 and not set(train["title"]) & set(dev["title"])
    held = load_raw(get_task("squad"), "dev", cfg(SHARED, squad_holdout=0.1))
    assert held["id"] == dev["id"]
    with pytest.raises(DistilleryError, match="not found"):
        load_raw(get_task("qnli"), "train", data)


# --- the Hub fallback (load_dataset replaced by a stand-in: tests are offline) --------------------


def test_hub_fallback_maps_columns_and_labels(monkeypatch):
    monkeypatch.delenv("DISTILLERY_DATA", raising=False)
    calls = []

    def fake_load_dataset(path, name=None, split=None):
        calls.append((path, name, split))
        if path == "nyu-mll/glue":
            features = datasets.Features({
                "premise": datasets.Value("string"), "hypothesis": datasets.Value("string"),
                "label": datasets.ClassLabel(names=["entailment", "neutral", "contradiction"]),
                "idx": datasets.Value("int32"),
            })
            return datasets.Dataset.from_dict(
                {"premise": ["a", "b"], "hypothesis": ["c", "d"], "label": [2, 0], "idx": [0, 1]}, features=features)
        return datasets.Dataset.from_dict({
            "id": ["x"], "title": ["T"], "context": ["paris is in france"], "question": ["where ?"],
            "answers": [{"text": ["france"], "answer_start": [12]}],
        })

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    task = get_task("mnli")
    ds = load_raw(task, "dev_mismatched", cfg())
    assert calls[-1] == ("nyu-mll/glue", "mnli", "validation_mismatched")
    assert ds.column_names == ["text", "text_pair", "label"]
    assert [task.labels[i] for i in ds["label"]] == ["contradiction", "entailment"]
    squad = load_raw(get_task("squad"), "dev", cfg())
    assert calls[-1] == ("rajpurkar/squad", None, "validation") and squad[0]["answers"]["text"] == ["france"]


def test_hub_failure_is_a_sentence(monkeypatch):
    monkeypatch.delenv("DISTILLERY_DATA", raising=False)

    def offline(*args, **kwargs):
        raise ConnectionError("no network")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(DistilleryError, match=r"Could not load nyu-mll/glue/sst2 \(train\).*--data-dir"):
        load_raw(get_task("sst2"), "train", cfg())


def test_custom_is_not_a_registered_task():
    with pytest.raises(DistilleryError, match="custom_task"):
        get_task("custom")


def test_length_batches_cover_every_example_once_with_bounded_padding():
    from distillery.data.encode import length_batches

    lengths = np.random.default_rng(0).integers(3, 60, size=500)
    batches = length_batches(lengths, max_batch=32, slack=16)
    flat = [i for b in batches for i in b]
    assert sorted(flat) == list(range(500))
    assert all(1 <= len(b) <= 32 for b in batches)
    assert [lengths[b].max() for b in batches] == sorted(lengths[b].max() for b in batches)  # shortest first
    for b in batches:  # each step up in length was taken with at most `slack` padding tokens added
        steps = np.diff(lengths[b])
        assert all(s * (k + 1) <= 16 for k, s in enumerate(steps))
    padded = sum(len(b) * lengths[b].max() for b in batches)
    fixed = sum(len(c) * lengths[c].max() for c in np.array_split(np.argsort(lengths, kind="stable"), 500 // 32 + 1))
    assert padded < fixed
    assert length_batches(lengths, 8, slack=0) and all(len(set(lengths[b])) == 1 for b in length_batches(lengths, 8, slack=0))
    with pytest.raises(ValueError, match="max_batch"):
        length_batches(lengths, 0)
