"""Hostile data and configs (issue 31) beyond the one-line refusals of test_bad_inputs.py: what is
accepted with a warning, the YAML bomb's time and memory, and scoring a custom-task model."""

from __future__ import annotations

import json
import logging
import re
import time
import tracemalloc

import pytest
from typer.testing import CliRunner

from distillery.cli import app
from distillery.config import ConfigError, DataConfig, TrainConfig, parse_value, read_yaml_mapping
from distillery.data.loading import custom_task, load_raw
from distillery.errors import DistilleryError
from distillery.safe_yaml import MAX_YAML_VALUES, load_yaml
from tests.helpers import assert_one_line_error, run_cli


def test_a_few_empty_texts_are_kept_with_a_warning(tmp_path, caplog):
    rows = ["good movie,1", "bad movie,0"] * 10 + [",1"]  # 1 of 21: under the 10 % that is refused
    train = tmp_path / "train.csv"
    train.write_text("text,label\n" + "\n".join(rows) + "\n")
    data = DataConfig(task="custom", train_file=str(train))
    with caplog.at_level(logging.WARNING, logger="distillery"):
        examples = load_raw(custom_task(data), "train", data)
    assert len(examples) == 21
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "train.csv: 1 of 21 rows have an empty text" in warnings[0] and "line 22" in warnings[0]


@pytest.mark.parametrize("name, separator", [("train.csv", ","), ("train.tsv", "\t"), ("train.jsonl", None)])
def test_a_line_that_is_not_utf8_is_named_by_its_number(name, separator, tmp_path):
    """Issue 52: the files named "a bad byte at offset N", an offset within the decoder's chunk of 8 KiB, not the
    file's; now the line (past the first chunk here)."""
    def row(text, label):
        return (json.dumps({"text": text, "label": label}, ensure_ascii=False) if separator is None
                else f"{text}{separator}{label}")

    lines = ([] if separator is None else [f"text{separator}label"]) + [row(f"good movie {i}", i % 2) for i in range(600)]
    train = tmp_path / name
    train.write_bytes(("\n".join(lines) + "\n").encode() + row("Katarína was good", 1).encode("latin-1") + b"\n")
    data = DataConfig(task="custom", train_file=str(train))
    with pytest.raises(DistilleryError, match=rf"{name}, line {len(lines) + 1}: not UTF-8 text \(byte 0xed\)"):
        load_raw(custom_task(data), "train", data)


def test_a_dev_label_error_names_ten_labels_and_counts_the_rest(tmp_path):
    """Issue 52: a dev file's unknown label listed the train file's 500 labels on one line."""
    from distillery.errors import listed

    train, dev = tmp_path / "train.csv", tmp_path / "dev.csv"
    train.write_text("text,label\n" + "".join(f"text {i},L{i:03d}\n" for i in range(500)))
    dev.write_text("text,label\na text,L000\nanother,unknown\n")
    data = DataConfig(task="custom", train_file=str(train), dev_file=str(dev))
    with pytest.raises(DistilleryError) as caught:
        load_raw(custom_task(data), "dev", data)
    message = str(caught.value)
    assert "dev.csv, line 3: label 'unknown'" in message
    assert "(labels: L000, L001, L002, L003, L004, L005, L006, L007, L008, L009, … and 490 more)." in message
    assert "L010" not in message
    assert listed(["a", "b"]) == "a, b" and listed("abcd", 3) == "a, b, c, … and 1 more"


@pytest.mark.parametrize("cls, name", [(TrainConfig, n) for n in TrainConfig.RANGES] +
                         [(DataConfig, n) for n in DataConfig.RANGES])
def test_a_range_refusal_names_exactly_what_is_accepted(cls, name):
    """Issue 52: --epochs -1 was told "from 0 to 1,000,000", and then --epochs 0 was refused."""
    with pytest.raises(ConfigError) as caught:
        cls(**{name: -1})
    found = re.search(r"must be (from|more than) ([\d,]+) (?:to|and at most) ([\d,]+)", str(caught.value))
    assert found, str(caught.value)
    low, high = (int(found.group(i).replace(",", "")) for i in (2, 3))
    if found.group(1) == "from":
        cls(**{name: low})
    else:
        with pytest.raises(ConfigError, match=re.escape(found.group(0))):
            cls(**{name: low})
        cls(**{name: low + 1})
    cls(**{name: high})
    with pytest.raises(ConfigError, match=re.escape(found.group(0))):
        cls(**{name: high + 1})


def test_zero_epochs_only_with_max_steps():
    with pytest.raises(ConfigError, match=r"epochs must be more than 0 and at most 1,000,000 passes over the train "
                                          r"split \(or 0 with max_steps\), got 0.0"):
        TrainConfig(epochs=0)
    assert TrainConfig(epochs=0, max_steps=5).epochs == 0.0
    with pytest.raises(ConfigError, match="epochs must be from 0 to 1,000,000"):
        TrainConfig(epochs=-1, max_steps=5)


def test_empty_pair_texts_count_too(tmp_path):
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps({"a": "good", "b": "" if i % 2 else "fine", "label": i % 2}) + "\n"
                             for i in range(10)))
    data = DataConfig(task="custom", train_file=str(train), text_column="a", text_pair_column="b")
    with pytest.raises(DistilleryError, match=r"train.jsonl: 5 of 10 rows have an empty text in column 'a' or 'b'"):
        load_raw(custom_task(data), "train", data)


def yaml_bomb(prefix: str = "z: ", flow: bool = False) -> str:
    """A billion-laughs YAML document: 9**10 values once its aliases are expanded, the last level
    written after ``prefix``; ``flow``: in one line (a --option value)."""
    levels = ["a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    levels += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)]
    last = f"[{', '.join(['*a8'] * 9)}]"
    if flow:
        return "{" + ", ".join(levels) + f", {prefix}{last}}}"
    return "\n".join(levels) + f"\n{prefix}{last}\n"


def _refused_quickly(load) -> None:
    """``load()`` refuses the bomb within a second, allocating under 20 MB on the way."""
    tracemalloc.start()
    started = time.perf_counter()
    try:
        with pytest.raises(DistilleryError, match="expands to more than"):
            load()
        seconds, peak = time.perf_counter() - started, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert seconds < 1.0 and peak < 20 * 2**20, (seconds, peak)


@pytest.mark.parametrize("where", ["data:\n  task: ", "z: "])
def test_yaml_bomb_file_is_refused_within_a_second_and_little_memory(tmp_path, where):
    path = tmp_path / "bomb.yaml"
    path.write_text(yaml_bomb(where))
    _refused_quickly(lambda: read_yaml_mapping(path))


def test_yaml_bomb_option_value_is_refused_within_a_second_and_little_memory():
    _refused_quickly(lambda: parse_value(yaml_bomb("z: ", flow=True), "--option x"))


def _settings_file(tmp_path, text: str) -> list[str]:
    (tmp_path / "bomb.yaml").write_text(text)
    return ["--config", str(tmp_path / "bomb.yaml")]


def _saved_run(tmp_path, text: str) -> list[str]:
    from distillery.folders import mark

    (tmp_path / "run").mkdir()
    mark(tmp_path / "run", "run")  # --resume reads only a folder distillery made
    (tmp_path / "run" / "config.yaml").write_text(text)
    return ["--resume"]


# (name, extra compress arguments, fragment of the error line): one loader for every YAML distillery reads
BOMBS = {
    "config-file-under-data-task": (lambda t: _settings_file(t, yaml_bomb("data:\n  task: ")), "bomb.yaml is not valid YAML"),
    "option-value": (lambda t: ["--option", "x=" + yaml_bomb("z: ", flow=True)], "--option x="),
    "resumed-config-yaml": (lambda t: _saved_run(t, yaml_bomb("method_options:\n  x: ")), "config.yaml is not valid YAML"),
}


@pytest.mark.parametrize("case", list(BOMBS))
def test_yaml_bomb_through_the_command_line(case, monkeypatch, capsys, tmp_path):
    build, fragment = BOMBS[case]
    args = ["compress", "--out", str(tmp_path / "run"), *build(tmp_path)]
    run_cli(monkeypatch, capsys, "compress", "--config", str(tmp_path / "none.yaml"))  # imports, outside the timing
    started = time.perf_counter()
    code, _, err = run_cli(monkeypatch, capsys, *args)
    # an expanded bomb takes minutes and gigabytes; refused, it is a fraction of a second (10 s: a busy machine)
    assert time.perf_counter() - started < 10.0
    assert_one_line_error(code, err, fragment)
    assert "expands to more than" in err and len(err) < 2000


def test_yaml_aliases_within_the_bound_still_work():
    text = "lr: &lr 0.0001\nstudent: {lr: *lr}\nteacher: {train: {lr: *lr}}\nlayers: &l [0, 2]\nmore: [*l, *l]\n"
    assert load_yaml(text)["teacher"]["train"]["lr"] == 0.0001
    wide = "a: &a [" + ", ".join(["1"] * 99) + "]\nb: [" + ", ".join(["*a"] * (MAX_YAML_VALUES // 100 - 2)) + "]\n"
    assert len(load_yaml(wide)["b"]) == MAX_YAML_VALUES // 100 - 2


@pytest.fixture
def ordered_model(tmp_path, tiny_bert):
    """A tiny BERT whose head names its classes out of sorted order (zebra, apple) and always says
    "apple" (class id 1): scored in the file's sorted order it would seem always wrong."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model = AutoModelForSequenceClassification.from_pretrained(
        tiny_bert, num_labels=2, id2label={0: "zebra", 1: "apple"}, label2id={"zebra": 0, "apple": 1})
    with torch.no_grad():
        model.classifier.weight.zero_()
        model.classifier.bias.copy_(torch.tensor([0.0, 10.0]))
    folder = tmp_path / "model"
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(tiny_bert).save_pretrained(folder)
    return folder


def test_eval_scores_a_custom_task_model_on_a_dev_file(tmp_path, ordered_model):
    dev = tmp_path / "dev.csv"
    dev.write_text("review,kind\ngood movie,apple\nbad movie,apple\nfun plot,apple\ndull film,zebra\n")
    result = CliRunner().invoke(app, ["eval", str(ordered_model), "--task", "custom", "--dev-file", str(dev),
                                      "--text-column", "review", "--label-column", "kind"])
    assert result.exit_code == 0, result.output
    metrics = json.loads(result.stdout[result.stdout.index("{"):])
    assert metrics["task"] == "custom" and metrics["examples"] == 4
    assert metrics["metrics"]["accuracy"] == pytest.approx(0.75)  # the head's order, not the sorted one (0.25)


def test_eval_refuses_a_dev_label_the_model_does_not_know(monkeypatch, capsys, tmp_path, ordered_model):
    dev = tmp_path / "dev.csv"
    dev.write_text("text,label\ngood movie,apple\nbad movie,pear\n")
    code, _, err = run_cli(monkeypatch, capsys, "eval", str(ordered_model), "--task", "custom", "--dev-file", str(dev))
    assert_one_line_error(code, err, "dev.csv has label(s) 'pear' that the model was not trained on")


def test_teacher_command_fine_tunes_on_custom_files(tmp_path, tiny_bert):
    rows = "".join(f"{'good fun movie' if i % 2 else 'bad dull film'},{'pos' if i % 2 else 'neg'}\n" for i in range(16))
    train, dev = tmp_path / "train.csv", tmp_path / "dev.csv"
    train.write_text("text,label\n" + rows)
    dev.write_text("text,label\n" + rows[: rows.index("\n", 60) + 1])
    result = CliRunner().invoke(app, ["teacher", "--teacher", tiny_bert, "--task", "custom", "--train-file", str(train),
                                      "--dev-file", str(dev), "--epochs", "1", "--max-length", "16"])
    assert result.exit_code == 0, result.output
    info = json.loads(result.stdout[result.stdout.index("{"):])
    assert set(info["metrics"]) >= {"accuracy", "macro_f1"}, info
