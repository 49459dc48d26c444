"""student/README.md is a Hugging Face model card that huggingface_hub parses, whose model-index holds exactly
metrics.json's scores, that user-named strings cannot break, and whose loading snippet loads the student;
--push-to-hub uploads student/, and answers offline with one sentence."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import ClassVar

import huggingface_hub
import pytest
import yaml
from huggingface_hub import ModelCard, metadata_load

import distillery
from distillery.bench import format_hardware
from distillery.card import base_model, check_push, push_student, write_card
from distillery.config import TEACHER_HUB_IDS
from distillery.errors import DistilleryError
from distillery.folders import MARKER, marker_kind
from distillery.markdown import md
from distillery.pipeline import build_run_config, compress
from distillery.weights import WEIGHTS_RECORD, verify_weights

SRC = str(Path(distillery.__file__).resolve().parent.parent)
# The fewest steps that still make a whole run folder: one epoch, a 16-token window, three timed runs.
QUICKEST = {"data.max_length": 16, "teacher.train.epochs": 1.0, "teacher.train.batch_size": 16,
            "teacher.train.eval_every": None, "student.epochs": 1.0, "student.batch_size": 16,
            "student.eval_every": None, "bench.latency_shape": [1, 16], "bench.throughput_shape": [2, 16],
            "bench.latency_runs": 3, "bench.throughput_runs": 1, "bench.warmup": 1}


def custom_files(folder: Path) -> dict:
    """A custom task's two CSV files (the run needs no GLUE folder); its settings."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, n in (("train.csv", 24), ("dev.csv", 8)):
        rows = [f"the film was {'good' if i % 2 else 'bad'},{'pos' if i % 2 else 'neg'}" for i in range(n)]
        (folder / name).write_text("text,label\n" + "\n".join(rows) + "\n")
    return {"data.train_file": str(folder / "train.csv"), "data.dev_file": str(folder / "dev.csv")}


def tiny_run(teacher, root: Path, method: str = "distill", **more) -> Path:
    config = build_run_config(method=method, task="custom", teacher=str(teacher), out=str(root / "run"),
                              overrides={**QUICKEST, **custom_files(root / "data"), **more})
    return compress(config)


@pytest.fixture(scope="module")
def run(tiny_bert, tmp_path_factory):
    return tiny_run(tiny_bert, tmp_path_factory.mktemp("card"))


def copy_run(run: Path, tmp_path: Path, teacher=None, task=None, **metrics_entries) -> Path:
    """A copy of the run whose config.yaml and metrics.json name another teacher or task (or hold more entries)."""
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    config = yaml.safe_load((copy / "config.yaml").read_text())
    metrics = json.loads((copy / "metrics.json").read_text())
    if teacher is not None:
        config["teacher"]["name"] = teacher
    if task is not None:
        config["data"]["task"] = metrics["task"] = task
    metrics.update(metrics_entries)
    (copy / "config.yaml").write_text(yaml.safe_dump(config))
    (copy / "metrics.json").write_text(json.dumps(metrics))
    write_card(copy)
    return copy


def model_index_metrics(card_path: Path) -> dict:
    results = metadata_load(card_path)["model-index"][0]["results"]
    return {m["type"]: m["value"] for result in results for m in result["metrics"]}


def test_the_card_parses_and_holds_exactly_the_measured_scores(run, tiny_bert):
    card_path = run / "student" / "README.md"
    card = ModelCard.load(card_path)
    meta = metadata_load(card_path)
    metrics = json.loads((run / "metrics.json").read_text())
    assert model_index_metrics(card_path) == metrics["student"]
    assert [r.metric_value for r in card.data.eval_results] == list(model_index_metrics(card_path).values())
    assert card.data.eval_results[0].metric_type == metrics["main_metric"]  # the main metric comes first
    assert meta["library_name"] == "transformers" and meta["pipeline_tag"] == "text-classification"
    assert meta["tags"] == ["distillery", "distill", "custom"]
    assert "base_model" not in meta and "datasets" not in meta  # a local teacher, a custom task
    assert "a local model folder" in card.text and "no `base_model`" in card.text
    assert str(tiny_bert) not in card.content  # a card is for publishing: no path of this machine
    bench = json.loads((run / "bench.json").read_text())
    assert f"{bench['speedup']['latency']:.2f}×" in card.text and md(format_hardware(bench["hardware"])) in card.text
    assert "`distill`" in card.text and "`epochs=1.0`" in card.text and "AutoModelForSequenceClassification" in card.text


def test_the_card_leaves_the_student_folder_valid(run):
    folder = run / "student"
    assert (folder / "README.md").is_file() and marker_kind(folder) == "model"
    verify_weights(folder)
    assert "README.md" not in json.loads((folder / WEIGHTS_RECORD).read_text())["sha256"]
    assert type(distillery.load_student(run)).__name__ == "BertForSequenceClassification"


@pytest.mark.parametrize("teacher", ["minilm", "mpnet-base"])
def test_a_builtin_teacher_is_named_by_its_hub_id_with_the_glue_dataset(run, tmp_path, teacher):
    copy = copy_run(run, tmp_path, teacher=teacher, task="sst2")
    meta = metadata_load(copy / "student" / "README.md")
    assert meta["base_model"] == TEACHER_HUB_IDS[teacher]
    assert meta["datasets"] == ["nyu-mll/glue"] and "sst2" in meta["tags"]
    dataset = meta["model-index"][0]["results"][0]["dataset"]
    assert dataset == {"name": "GLUE SST-2", "type": "nyu-mll/glue", "config": "sst2", "split": "validation"}
    assert model_index_metrics(copy / "student" / "README.md") == json.loads((copy / "metrics.json").read_text())["student"]


def test_scores_on_part_of_the_dev_split_say_which_part(run, tmp_path):
    copy = copy_run(run, tmp_path, task="mnli", split="dev_matched", dev_limit=8)
    card_path = copy / "student" / "README.md"
    assert metadata_load(card_path)["model-index"][0]["results"][0]["dataset"]["split"] == "validation_matched[:8]"
    assert "dev_matched split (its first 8 examples)" in ModelCard.load(card_path).text


def test_base_model_is_a_hub_id_or_nothing(tmp_path):
    assert base_model("minilm") == "sentence-transformers/all-MiniLM-L6-v2"
    assert base_model("mpnet-base") == "sentence-transformers/all-mpnet-base-v2"
    assert base_model("google-bert/bert-base-uncased") == "google-bert/bert-base-uncased"
    assert base_model(str(tmp_path)) is None  # a folder that exists
    for path in ("/models/mine", "./mine", "~/mine", "a/b/c"):
        assert base_model(path) is None


HOSTILE = 'x"\n---\nevil: [1 | `code` <b>*em*</b> [link](http://e.vil)\u2028# heading'


def test_hostile_task_and_teacher_strings_break_neither_yaml_nor_markdown(run, tmp_path):
    copy = copy_run(run, tmp_path, teacher=f"/no/such/{HOSTILE}", task=HOSTILE)
    card_path = copy / "student" / "README.md"
    card = ModelCard.load(card_path)
    meta = metadata_load(card_path)
    assert set(meta) == {"library_name", "pipeline_tag", "tags", "model-index"}  # nothing injected ("evil")
    assert meta["tags"][2] == " ".join(HOSTILE.split())
    assert model_index_metrics(card_path) == json.loads((copy / "metrics.json").read_text())["student"]
    title = card.text.strip().splitlines()[0]
    assert title.startswith("# distill student on") and "evil" in title  # one heading line, the text shown
    assert "&lt;b&gt;" in title and "\\[link\\](http" in title  # shown as text: no live HTML, no link
    prose = re.sub(r"`[^`]*`", "", re.sub(r"``.*?``", "", card.text))  # code spans show their text literally
    assert "<b>" not in prose and "[link](http" not in prose
    assert "\n# heading" not in card.text  # no heading made from the task name


def test_report_command_rebuilds_the_card(run, tmp_path, capsys):
    from distillery.cli import report

    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    (copy / "student" / "README.md").unlink()
    report([str(copy)], None)
    capsys.readouterr()
    assert model_index_metrics(copy / "student" / "README.md") == json.loads((copy / "metrics.json").read_text())["student"]


class FakeApi:
    """HfApi with its two calls recorded instead of sent."""

    calls: ClassVar[list] = []

    def create_repo(self, repo_id, **kw):
        FakeApi.calls.append(("create_repo", repo_id, kw))
        return f"https://huggingface.co/{repo_id}"

    def upload_folder(self, **kw):
        FakeApi.calls.append(("upload_folder", kw["repo_id"], kw))
        assert (Path(kw["folder_path"]) / "README.md").is_file()


@pytest.fixture
def online(monkeypatch):
    """huggingface_hub online with a token, its HfApi recording calls."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: "hf_test")
    monkeypatch.setattr(huggingface_hub, "HfApi", FakeApi)
    FakeApi.calls = []
    return FakeApi


def test_push_uploads_the_student_folder_with_a_card_naming_the_repository(run, tmp_path, online):
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    assert push_student(copy, "someone/tiny-student") == "https://huggingface.co/someone/tiny-student"
    (_, repo, create), (_, _, upload) = online.calls
    assert repo == "someone/tiny-student" and create["exist_ok"] is True
    assert Path(upload["folder_path"]) == copy / "student" and MARKER in upload["ignore_patterns"]
    assert "model_id = 'someone/tiny-student'" in (copy / "student" / "README.md").read_text()


def test_a_failed_upload_is_one_sentence(run, tmp_path, online, monkeypatch):
    def refuse(self, repo_id, **kw):
        raise OSError("[Errno -2] Name or service not known")

    monkeypatch.setattr(FakeApi, "create_repo", refuse)
    with pytest.raises(DistilleryError, match=r"Could not push .* Name or service not known\. The run is kept; push it"):
        push_student(run, "someone/tiny-student")


def test_push_is_refused_before_training_without_a_token_or_a_valid_repository(online, monkeypatch):
    with pytest.raises(DistilleryError, match="is not a Hub repository id"):
        check_push("a/b/c")
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: None)
    with pytest.raises(DistilleryError, match="no Hugging Face token"):
        check_push("someone/tiny-student")


def test_compress_push_to_hub_offline_is_one_plain_sentence_before_any_training(tmp_path, monkeypatch, capsys):
    from distillery import cli

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(sys, "argv", ["distillery", "compress", "--teacher", "/no/such/teacher", "--out",
                                      str(tmp_path / "run"), "--push-to-hub", "someone/tiny-student"])
    with pytest.raises(SystemExit) as stopped:
        cli.main()
    err = capsys.readouterr().err
    assert stopped.value.code not in (0, None) and "Traceback" not in err
    assert err.strip().splitlines() == [
        ("distillery: error: Cannot push to the Hugging Face Hub repository someone/tiny-student: offline mode is on "
         "(HF_HUB_OFFLINE); unset it, then push the run with `distillery push RUN someone/tiny-student`.")]
    assert not (tmp_path / "run").exists()  # refused before the teacher was even looked for


def test_a_moebert_student_loads_with_its_cards_snippet_in_a_fresh_process(tiny_bert, tmp_path):
    out = tiny_run(tiny_bert, tmp_path, method="moebert", **{"method_options.experts": 2,
                                                           "method_options.importance_examples": 8,
                                                           "baselines": False, "int8": False})  # the snippet alone
    text = (out / "student" / "README.md").read_text()
    snippet = re.search(r"```python\n(.*?)```", text, re.DOTALL).group(1)
    assert "distillery.register_models()" in snippet
    snippet = snippet.replace("'your-name/your-model'", repr(str(out / "student")))
    snippet += "print(type(model).__name__, tuple(logits.shape))\n"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": SRC}
    done = subprocess.run([sys.executable, "-c", snippet], capture_output=True, text=True, env=env, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["MoEBertForSequenceClassification", "(1,", "2)"]


def test_a_custom_task_run_measures_the_free_baselines_live(run):
    """The report compares the student with the teacher's int8 copy and static embeddings measured in this run,
    on this custom task (no constant reference points): scored on its dev set, timed in its bench process."""
    metrics = json.loads((run / "metrics.json").read_text())
    bench = json.loads((run / "bench.json").read_text())
    assert set(metrics["baselines"]) == {"teacher-int8", "static-embeddings"}
    assert {"teacher-int8", "static-embeddings"} <= set(bench["models"])
    report = (run / "report.md").read_text()
    assert "## Against what you can get for free" in report
    assert "| teacher-int8 |" in report and "| static-embeddings |" in report


@pytest.mark.parametrize("damage", ["tampered", "nan", "no-record"])
def test_push_checks_the_weights_before_writing_or_sending_anything(run, tmp_path, online, damage):
    """Issue 41: a student whose weights changed after distillery saved them, whose weights are NaN, or
    whose weights record was deleted is refused before the card is rewritten or the Hub is called."""
    from safetensors.torch import load_file, save_file

    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    student = copy / "student"
    weights = student / "model.safetensors"
    state = load_file(str(weights))
    if damage == "no-record":
        (student / "distillery_weights.json").unlink()
        expected = "has no weights record"
    else:
        factor = 1.5 if damage == "tampered" else float("nan")
        save_file({k: v * factor if v.is_floating_point() else v for k, v in state.items()}, str(weights),
                  metadata={"format": "pt"})
        if damage == "nan":  # the record made to match: the finiteness check refuses it on its own
            from distillery.weights import record_weights

            record_weights(student)
        expected = "was changed after distillery saved it" if damage == "tampered" else "non-finite weights"
    card = (student / "README.md").read_bytes()
    with pytest.raises(DistilleryError, match=expected):
        push_student(copy, "someone/tiny-student")
    assert online.calls == [] and (student / "README.md").read_bytes() == card


def test_the_card_carries_the_teachers_licence_and_the_datas_language(run, tmp_path, tiny_bert):
    """Issue 41: license from the teacher's own card (a built-in teacher's: Apache-2.0), language from the data
    (GLUE: English) or else from the teacher's card; nothing when neither says."""
    meta = metadata_load(copy_run(run, tmp_path / "builtin", teacher="minilm", task="sst2") / "student" / "README.md")
    assert (meta["license"], meta["language"]) == ("apache-2.0", "en")
    teacher = tmp_path / "teacher"
    shutil.copytree(tiny_bert, teacher)
    (teacher / "README.md").write_text("---\nlicense: mit\nlanguage: fr\n---\n\n# a French encoder\n")
    meta = metadata_load(copy_run(run, tmp_path / "local", teacher=str(teacher)) / "student" / "README.md")
    assert (meta["license"], meta["language"]) == ("mit", "fr")
    assert "license" not in metadata_load(run / "student" / "README.md")  # tiny_bert has no card: not guessed


def test_labels_keep_their_names_through_pipeline(run, tiny_bert, glue_dir, tmp_path):
    """Issue 41: a GLUE task's classes carry their names (SST-2: negative/positive), custom data its own label
    strings, so that transformers' pipeline() prints them."""
    from transformers import pipeline

    from distillery.data.tasks import get_task
    from distillery.teacher import name_classes
    from tests.helpers import tiny_config, tiny_bert_config

    custom = pipeline("text-classification", model=str(run / "student"))
    assert {r["label"] for r in custom(["the film was good", "the film was bad"])} <= {"neg", "pos"}
    sst2 = compress(tiny_config(tiny_bert, glue_dir, tmp_path / "sst2", **{"student.epochs": 1.0}))
    classify = pipeline("text-classification", model=str(sst2 / "student"))
    assert classify("a fine movie")[0]["label"] in ("negative", "positive")
    assert distillery.load_student(sst2).config.id2label == {0: "negative", 1: "positive"}
    # and the task they learned, which eval reads (issue 52)
    assert distillery.load_student(sst2).config.finetuning_task == "sst2"
    assert distillery.load_student(run).config.finetuning_task == "custom"
    # a teacher fine-tuned before the names (digits) or given with a generic head is named; a head of its own is kept
    task = get_task("sst2")
    for given, named in (({0: "0", 1: "1"}, {0: "negative", 1: "positive"}),
                         ({0: "LABEL_0", 1: "LABEL_1"}, {0: "negative", 1: "positive"}),
                         ({0: "bad", 1: "good"}, {0: "bad", 1: "good"})):
        config = tiny_bert_config(id2label=given, label2id={v: k for k, v in given.items()})
        name_classes(config, task)
        assert config.id2label == named and config.label2id == {v: k for k, v in named.items()}


def test_the_usage_snippet_passes_a_sentence_pair_where_the_task_reads_pairs():
    from transformers import BertConfig

    from distillery.card import _usage_section, is_pair_task
    from distillery.run_record import Bench, Metrics, Run

    def run(task, **data):
        return Run(dir=Path("run"), config={"data": {"task": task, **data}}, metrics=Metrics(task=task), bench=Bench())

    assert is_pair_task(run("mrpc"))
    assert not is_pair_task(run("sst2"))
    assert is_pair_task(run("custom", text_pair_column="b"))
    config = BertConfig(num_labels=2, architectures=["BertForSequenceClassification"])
    pair = "\n".join(_usage_section(config, None, pair=True))
    single = "\n".join(_usage_section(config, None))
    assert 'tokenizer("The cat sat on the mat.", "A cat was sitting on the mat."' in pair
    assert 'tokenizer("a sentence to classify"' in single


def test_an_embedders_card_loads_it_with_sentence_transformers():
    """An embedding run's card shows ``SentenceTransformer(...).encode``, the embedding kind's own snippet
    (``TaskKind.usage_code``): after ``distillery.register_models()`` for a transformer of distillery's own type
    only, never for a plain transformers student or the static student (sentence-transformers' StaticEmbedding);
    its front matter names sentence-transformers. Other kinds keep transformers' Auto class of their head.
    (The snippets run in a fresh process in the embedding methods' tests: helpers.card_snippet.)"""
    from transformers import BertConfig

    from distillery.autotinybert.modeling_autotinybert import AutoTinyBertConfig
    from distillery.card import _usage_section, card_data
    from distillery.cmow.modeling_embedder import CMOWEmbedderConfig
    from distillery.kinds import kind_of
    from distillery.moebert.modeling_moebert import MoEBertConfig
    from distillery.run_record import Bench, Metrics, Run
    from distillery.static.modeling_static import StaticEmbedderConfig

    embedding = kind_of("embedding")

    def snippet(config, kind=embedding):
        return "\n".join(_usage_section(config, "me/model", kind=kind))

    plain = snippet(BertConfig(architectures=["BertModel"]))
    assert "model = SentenceTransformer('me/model')" in plain and "model.encode([" in plain
    assert "import distillery" not in plain and "AutoModel" not in plain
    for config in (MoEBertConfig(), AutoTinyBertConfig(), CMOWEmbedderConfig(vocab_size=99)):
        own = snippet(config)
        assert own.index("import distillery") < own.index("distillery.register_models()") < own.index(
            "SentenceTransformer('me/model')"), own
    static = snippet(StaticEmbedderConfig())
    assert "SentenceTransformer('me/model')" in static and "StaticEmbedding" in static
    assert "register_models" not in static and "import distillery" not in static
    classifier = snippet(BertConfig(num_labels=2, architectures=["BertForSequenceClassification"]),
                         kind_of("classification"))
    assert "AutoModelForSequenceClassification.from_pretrained(model_id)" in classifier
    assert "SentenceTransformer" not in classifier

    run = Run(dir=Path("run"), config={"data": {"task": "embedding"}, "method": "distill"},
              metrics=Metrics(task="embedding"), bench=Bench())
    data = card_data(run, BertConfig(architectures=["BertModel"]))
    assert (data.library_name, data.pipeline_tag) == ("sentence-transformers", "sentence-similarity")
