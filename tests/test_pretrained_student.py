"""Method distill with a pretrained student (``--student``): an encoder of another family, with its own tokenizer,
learns from the teacher's outputs; the result is an ordinary model folder."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from distillery.distill.auto import candidate_name
from distillery.errors import DistilleryError
from tests.families import CELL, compress
from tests.helpers import LIVE_EXTRAS, patch_everywhere, write_squad

pytestmark = pytest.mark.usefixtures("steady_pretrained_timing")  # conftest: no timing decides a test

# teacher family, student family: each pair tokenizes differently (WordPiece with or without token types,
# byte-level BPE) and has another hidden layout (ELECTRA's factorised embeddings)
PAIRS = [("bert", "roberta"), ("mpnet", "bert"), ("deberta-v2", "electra")]

FRESH_LOAD = """
import sys, torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer
model = AutoModelForSequenceClassification.from_pretrained(sys.argv[1]).eval()
tok = AutoTokenizer.from_pretrained(sys.argv[1])
with torch.no_grad():
    logits = model(**tok(["a good film", "a bad film"], return_tensors="pt", padding=True)).logits
assert logits.shape == (2, 2), logits.shape
assert not any(m.startswith("distillery") for m in sys.modules)
print(model.config.model_type)
"""


FRESH_LOAD_QA = """
import sys, torch
from transformers import AutoModelForQuestionAnswering, AutoTokenizer

model = AutoModelForQuestionAnswering.from_pretrained(sys.argv[1]).eval()
tok = AutoTokenizer.from_pretrained(sys.argv[1])
with torch.no_grad():
    out = model(**tok(["where is it ?"], ["paris is a city in france ."], return_tensors="pt"))
assert out.start_logits.shape == out.end_logits.shape
assert not any(m.startswith("distillery") for m in sys.modules)
print(model.config.model_type)
"""


@pytest.fixture(scope="module")
def own_tokenizer(tiny_family, tmp_path_factory):
    """``own_tokenizer(family)``: a 2-layer student of ``family`` whose tokenizer is not the teacher's. The tiny
    WordPiece families share one vocabulary, so theirs gets its ordinary tokens renumbered (the same words, other
    ids): any slip that fed the teacher's ids to the student, or the reverse, would read other words."""
    made = {}

    def make(family: str) -> str:
        if family in made:
            return made[family]
        import shutil

        from tokenizers import Tokenizer, models
        from transformers import AutoTokenizer, PreTrainedTokenizerFast

        source = tiny_family(family, 2)
        tok = AutoTokenizer.from_pretrained(source)
        if "WordPiece" not in tok.backend_tokenizer.to_str()[:2000]:
            made[family] = source  # byte-level BPE: already the teacher's opposite
            return source
        folder = tmp_path_factory.mktemp(f"own-{family}")
        shutil.copytree(source, folder, dirs_exist_ok=True)
        backend = Tokenizer.from_str(tok.backend_tokenizer.to_str())
        vocab = backend.get_vocab()
        from transformers import AutoConfig

        rows = AutoConfig.from_pretrained(source).vocab_size  # an id past the embedding (the test vocabulary
        # repeats a word, so its ids have a gap and end at the table's size) stays where it is, unused
        specials = {t for t in vocab if (t.startswith("[") and t.endswith("]")) or vocab[t] >= rows}
        ordinary = sorted((t for t in vocab if t not in specials), key=vocab.get)
        free = sorted(vocab[t] for t in ordinary)
        renumbered = {**{t: vocab[t] for t in specials}, **dict(zip(ordinary[::-1], free))}
        backend.model = models.WordPiece(renumbered, unk_token="[UNK]")
        PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                                sep_token="[SEP]", mask_token="[MASK]", model_max_length=512,
                                model_input_names=tok.model_input_names).save_pretrained(folder)
        made[family] = str(folder)
        return made[family]

    return make


@pytest.mark.parametrize("teacher_family,student_family", PAIRS)
def test_pretrained_student_on_squad_across_tokenizers(tiny_family, own_tokenizer, tmp_path, teacher_family,
                                                      student_family):
    import distillery

    data = write_squad(tmp_path / "data")
    overrides = {**CELL, "data.max_length": 48, "data.doc_stride": 16, "data.squad_holdout": 0.5,
                 "data.train_limit": 8, "method_options.student": own_tokenizer(student_family)}
    run = distillery.compress(method="distill", task="squad", teacher=tiny_family(teacher_family, 4),
                              data_dir=str(data), out=str(tmp_path / "run"), overrides=overrides)
    metrics = json.loads((run / "metrics.json").read_text())
    assert 0.0 <= metrics["student"]["f1"] <= 100.0
    done = subprocess.run([sys.executable, "-c", FRESH_LOAD_QA, str(run / "student")], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == student_family
    # the QA student exports, parity-checked, as the others do: once (a student's graph is its family's, whatever
    # taught it; the families' own exports are tests/test_families.py's)
    if (teacher_family, student_family) == PAIRS[0] and importlib.util.find_spec("onnxruntime"):
        from transformers import AutoTokenizer

        from distillery.export import export
        from distillery.runtime import load_model

        folder = export(load_model(run / "student"), AutoTokenizer.from_pretrained(run / "student"), "onnx",
                        tmp_path / "onnx")
        assert json.loads((folder / "distillery_export.json").read_text())["parity"]


@pytest.mark.parametrize("teacher_family,student_family", PAIRS)
def test_pretrained_student_across_tokenizers(tiny_family, own_tokenizer, glue_dir, tmp_path, teacher_family,
                                             student_family):
    teacher = tiny_family(teacher_family, 4)
    student = own_tokenizer(student_family)
    run = compress("distill", teacher, glue_dir, tmp_path / "run", **{"method_options.student": student})
    folder = run / "student"
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == student_family and config["num_hidden_layers"] == 2
    # the student keeps its own tokenizer, not the teacher's
    from transformers import AutoTokenizer

    own = AutoTokenizer.from_pretrained(student)
    saved = AutoTokenizer.from_pretrained(folder)
    assert saved.get_vocab() == own.get_vocab()
    metrics = json.loads((run / "metrics.json").read_text())
    assert 0.0 <= metrics["student"]["accuracy"] <= 1.0
    train = json.loads((run / "train.json").read_text())
    assert train["train_examples"] == 96  # the whole split, labelled by the teacher past the budget's 32
    assert any("pretrained encoder" in note and "its own tokenizer" in note for note in train["notes"])
    # it keeps its own layers: of the deep-cut rule only the temperature, read from the teacher's logits
    chosen = [n for n in train["notes"] if n.startswith("Defaults for this student: T = ")]
    assert len(chosen) == 1 and "from the teacher's logits" in chosen[0], train["notes"]
    temperature = chosen[0].split("T = ")[1].split()[0]
    assert any("pretrained encoder" in n and f"KD(T={temperature})" in n for n in train["notes"]), train["notes"]
    # loads in a fresh process with plain transformers, no distillery import
    done = subprocess.run([sys.executable, "-c", FRESH_LOAD, str(folder)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == student_family
    # its export is its family's class with its own tokenizer's inputs: tests/test_families.py's distill cells


def test_student_head_kept_when_it_fits(tiny_family, tmp_path, caplog):
    import logging

    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from distillery.data.tasks import get_task
    from distillery.distill.pretrained import load_student

    source = tiny_family("bert", 2)
    with caplog.at_level(logging.INFO, logger="distillery"):
        load_student(source, get_task("sst2"))
    assert "gets a new one" in caplog.text
    headed = tmp_path / "headed"
    AutoModelForSequenceClassification.from_pretrained(source, num_labels=2).save_pretrained(headed)
    AutoTokenizer.from_pretrained(source).save_pretrained(headed)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="distillery"):
        load_student(str(headed), get_task("sst2"))
    assert "keeps its own" in caplog.text


def test_bad_students_get_one_sentence(tiny_family, tiny_gpt2, glue_dir, tmp_path, monkeypatch, capsys):
    import shutil

    from tests.helpers import assert_one_line_error, run_cli

    bare = tmp_path / "bare"  # a model folder whose tokenizer files were left behind
    shutil.copytree(tiny_family("bert", 2), bare)
    for path in bare.iterdir():
        if "token" in path.name or path.name.startswith(("vocab", "special")):
            path.unlink()
    out = tmp_path / "run"
    common = ["compress", "--teacher", tiny_family("bert", 4), "--data-dir", str(glue_dir), "--out", str(out)]
    for student, words in ((tiny_gpt2, "is a 'gpt2' model, not an encoder family distillery knows"),
                           (str(bare), "tokenizer"),
                           (tiny_family("roberta", 4), "no fewer than the teacher's"),
                           (str(tmp_path / "nowhere"), "Student path"),
                           (tiny_family("bert", 2), "exclude each other")):
        extra = ["--student-layers", "1"] if words == "exclude each other" else []
        code, _, err = run_cli(monkeypatch, capsys, *common, "--student", student, *extra)
        assert_one_line_error(code, err, words)
        assert not out.exists()


def test_student_no_smaller_than_teacher_is_refused(tiny_family, glue_dir, tmp_path):
    with pytest.raises(DistilleryError, match=r"parameters, no fewer than the teacher"):
        compress("distill", tiny_family("bert", 2), glue_dir, tmp_path / "run",
                 **{"method_options.student": tiny_family("roberta", 4)})
    assert not (tmp_path / "run").exists()  # refused before the teacher is fine-tuned


def test_slower_student_is_refused_with_its_speed(tiny_family, monkeypatch):
    import distillery.bench as bench
    from distillery.distill.pretrained import check_smaller
    from transformers import AutoModel

    teacher, student = AutoModel.from_pretrained(tiny_family("bert", 4)), AutoModel.from_pretrained(tiny_family("bert", 2))
    patch_everywhere(monkeypatch, bench, "latency_ms", lambda models, *args, **kw: {"teacher": 1.0, "student": 3.5})
    with pytest.raises(DistilleryError, match=r"slower than the teacher: 3.50 ms per forward pass"):
        check_smaller(teacher, student, "slow", (1, 8))


def test_squad_targets_with_the_teachers_own_tokenizer_are_its_distribution(tiny_family, tmp_path):
    """Carried onto identical windows, the teacher's start/end distribution comes back unchanged on the context;
    what it put on the question and special tokens moves to [CLS]."""
    import numpy as np
    from transformers import AutoModelForQuestionAnswering, AutoTokenizer

    from distillery.data.encode import prepare_task_data, squad_window_offsets
    from distillery.data.loading import load_raw
    from distillery.evaluation import predict
    from distillery.pipeline import build_run_config
    from distillery.distill.pretrained import squad_distillation_train
    from distillery.method_context import MethodContext

    source = tiny_family("bert", 2)
    data = write_squad(tmp_path / "data")
    config = build_run_config(task="squad", teacher=source, data_dir=str(data), out=str(tmp_path / "run"),
                              overrides={"data.max_length": 27, "data.doc_stride": 4, "data.squad_holdout": 0.5,
                                         "data.train_limit": None})
    tokenizer = AutoTokenizer.from_pretrained(source)
    teacher = AutoModelForQuestionAnswering.from_pretrained(source).eval()
    task_data = prepare_task_data(__import__("distillery.data.tasks").data.tasks.get_task("squad"), tokenizer,
                                  config.data)
    ctx = MethodContext(config=config, teacher=teacher, tokenizer=tokenizer, task_data=task_data, out_dir=tmp_path,
                        student_tokenizer=tokenizer, student_data=task_data)
    train = squad_distillation_train(ctx, whole=False, temperature=1.0)
    windows = squad_window_offsets(load_raw(task_data.task, "train", config.data), tokenizer, 27, 4)
    start, _ = predict(teacher, task_data, split="train")
    counts = np.bincount(windows["sample"])
    assert (counts == 1).any() and (counts > 1).any()  # examples in one window, and examples in several
    for w, row in enumerate(train["teacher_start"]):
        n = len(row)
        p = np.exp(start[w, :n] - start[w, :n].max())
        p /= p.sum()
        context = windows["offsets"][w, :n, 0] >= 0
        if (windows["sample"] == windows["sample"][w]).sum() == 1:  # one window: nothing averaged in
            np.testing.assert_allclose(np.asarray(row)[context], p[context], atol=1e-6)
        assert abs(sum(row) - 1.0) < 1e-5


def test_report_and_card_name_the_students_origin(tiny_family, glue_dir, tmp_path):
    import yaml

    student = tiny_family("electra", 2)
    run = compress("distill", tiny_family("bert", 4), glue_dir, tmp_path / "run",
                   **{"method_options.student": student})
    report = (run / "report.md").read_text()
    assert f"into the pretrained student `{student}`" in report
    assert f"- student: the pretrained encoder `{student}`, distilled from the teacher" in report
    card = (run / "student" / "README.md").read_text()
    front = yaml.safe_load(card.split("---")[1])
    assert "base_model" not in front  # a local folder has no Hub id to name
    assert "the pretrained encoder `" in card and "distilled from the teacher" in card


def test_card_base_model_is_the_students_hub_origin(tmp_path):
    import yaml
    from transformers import BertConfig

    from distillery.card import card_data, card_text
    from distillery.run_record import load_run
    from tests.helpers import make_run

    run = make_run(tmp_path / "run", method="distill")
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["method_options"] = {"student": "google/electra-small-discriminator"}
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    loaded = load_run(run)
    data = card_data(loaded, BertConfig(architectures=["BertForSequenceClassification"]))
    assert data.base_model == "google/electra-small-discriminator"  # the weights' own origin, not the teacher
    assert "teacher:sentence-transformers/all-MiniLM-L6-v2" in data.tags
    text = card_text(loaded, BertConfig(architectures=["BertForSequenceClassification"]))
    assert "pretrained encoder [google/electra-small-discriminator]" in text
    assert "distilled from the teacher [sentence-transformers/all-MiniLM-L6-v2]" in text


def test_auto_plans_each_given_student_as_a_candidate(tiny_family):
    from distillery.auto import plan_for
    from distillery.distill.auto import WHY

    student = tiny_family("roberta", 2)
    settings = {"teacher.name": tiny_family("bert", 4), "bench.latency_shape": [1, 16], "bench.latency_runs": 3,
                "method_options.student": student, "method_options.kd_weight": 0.7}
    # int8 gain as if measured: this plan's candidates do not depend on it
    candidates, skipped, _ = plan_for({"target": {"speedup": 2.0, "latency_ms": None}, "settings": settings,
                                       "int8_gain": 1.0})
    by_name = {c.name: c for c in candidates}
    name = candidate_name(str(student))  # the fixture's folder is numbered by the tests before it
    assert name == f"pretrained-{Path(student).name}" and name in by_name, list(by_name)
    mine = by_name[name]
    assert mine.method == "distill" and mine.options == {"kd_weight": 0.7, "student": student}
    assert WHY in mine.why
    # the distill candidates built from teacher layers stay so: the student is not every distill candidate's
    assert all("student" not in c.options for c in candidates if c.name.startswith("distill-"))
    # MiniLM (22M parameters) is no smaller than this tiny teacher: no candidate, and not listed as one left out
    assert "pretrained-minilm" not in by_name and "pretrained-minilm" not in [s["name"] for s in skipped]


def test_a_packaged_encoder_smaller_and_faster_than_the_teacher_is_a_default_candidate(monkeypatch):
    import distillery.bench
    import distillery.distill.auto as ap
    from distillery.method import AutoAsk
    from transformers import BertConfig

    monkeypatch.setattr(ap, "_available", lambda name: name == "minilm")
    base = BertConfig(num_hidden_layers=12, hidden_size=768, intermediate_size=3072, num_attention_heads=12)
    patch_everywhere(monkeypatch, distillery.bench, "latency_ms", lambda models, shape, runs: {"teacher": 60.0, "student": 10.0})
    found, left = ap.pretrained_candidates(AutoAsk(base, 4.0, 128, {}, teacher="mpnet-base", runs=3))
    assert [c["name"] for c in found] == ["pretrained-minilm"] and not left
    assert found[0]["options"] == {"student": "minilm"} and "6.00× faster" in found[0]["why"]
    patch_everywhere(monkeypatch, distillery.bench, "latency_ms", lambda models, shape, runs: {"teacher": 30.0, "student": 10.0})
    found, left = ap.pretrained_candidates(AutoAsk(base, 4.0, 128, {}, teacher="mpnet-base", runs=3))
    assert not found and "below the 4.00× needed" in left[0]["reason"]


def test_auto_with_a_student_runs_it_and_chooses_it(tiny_family, glue_dir, tmp_path, monkeypatch, capsys):
    """End to end through the command line, the plan cut down to the given student (the other methods' candidates
    are tested in test_auto.py): it is listed as a pretrained student and, meeting the target, chosen."""
    import yaml

    from distillery.distill.auto import WHY
    from distillery.config import nested_settings
    from tests.helpers import TINY_RUN, run_ok

    for planned in ("distillery.distill.auto.layer_candidates", "distillery.moebert.auto.candidates",
                    "distillery.cmow.auto.candidates", "distillery.autotinybert.auto.candidates",
                    "distillery.prune.auto.candidates"):
        monkeypatch.setattr(planned, lambda ask: ([], []))
    # nothing timed when planning decides what this test reads: the int8 gain, the packaged encoders as students
    monkeypatch.setattr("distillery.auto.int8_gain", lambda *args: 1.0)
    monkeypatch.setattr("distillery.distill.auto._available", lambda name: False)
    settings = tmp_path / "tiny.yaml"
    settings.write_text(yaml.safe_dump(nested_settings({**TINY_RUN, "student.epochs": 1.0, "teacher.train.epochs": 1.0,
                                                        "bench.latency_runs": 9})))
    out = tmp_path / "auto"
    student = tiny_family("roberta", 2)
    run_ok(monkeypatch, capsys, "compress", "--method", "auto", "--speedup", "1.05", "--teacher",
           tiny_family("bert", 4), "--student", student, "--data-dir", str(glue_dir), "--out", str(out),
           "--config", str(settings))
    summary = json.loads((out / "auto.json").read_text())
    name = candidate_name(str(student))
    assert [c["name"] for c in summary["candidates"]] == [name]
    assert summary["chosen"]["candidate"] == name, summary["why"]
    report = (out / "report.md").read_text()
    assert WHY in report
    chosen_config = yaml.safe_load((out / "candidates" / name / "config.yaml").read_text())
    assert chosen_config["method_options"]["student"] == student


def test_layer_maps_spread_evenly_or_as_given():
    from distillery.distill.pretrained import layer_map_for

    assert layer_map_for(2, 4, None) == [1, 3] and layer_map_for(3, 12, None) == [3, 7, 11]
    assert layer_map_for(2, 4, [0, 2]) == [0, 2]
    for bad in ([0], [0, 4], [-1, 1]):
        with pytest.raises(DistilleryError, match="layer_map"):
            layer_map_for(2, 4, bad)


@pytest.mark.parametrize("student_family,words", [("bert", "student layers onto teacher layers [0, 2]"),
                                                  ("roberta", "mean-pooled sentence vectors")])
def test_hidden_states_distil_per_layer_when_tokenizers_match_else_as_sentence_vectors(
        tiny_family, glue_dir, tmp_path, student_family, words):
    options = {"method_options.student": tiny_family(student_family, 2), "method_options.hidden_weight": 0.5}
    if student_family == "bert":  # the same WordPiece tokenizer as the teacher's
        options["method_options.layer_map"] = [0, 2]
    run = compress("distill", tiny_family("bert", 4), glue_dir, tmp_path / "run", **options)
    notes = json.loads((run / "train.json").read_text())["notes"]
    assert any(words in note for note in notes), notes
    # the projection trained beside the student is a training aid: the saved student is the plain model
    config = json.loads((run / "student" / "config.json").read_text())
    assert config["model_type"] == student_family


def test_layer_map_without_a_pretrained_student_is_one_sentence():
    from distillery.distill.options import DistillOptions

    with pytest.raises(DistilleryError, match="layer_map maps a pretrained student"):
        DistillOptions.read({"layer_map": [0, 1], "hidden_weight": 1.0})
    with pytest.raises(DistilleryError, match="list of teacher layer indices"):
        DistillOptions.read({"student": "x", "hidden_weight": 1.0, "layer_map": 3})
    with pytest.raises(DistilleryError, match="attention_weight is for a student copied"):
        DistillOptions.read({"student": "x", "attention_weight": 1.0})


def test_same_tokenizer_reads_what_the_tokenizer_is_not_its_last_call(tiny_family):
    from transformers import AutoTokenizer

    from distillery.distill.pretrained import same_tokenizer

    bert, other_bert = (AutoTokenizer.from_pretrained(tiny_family("bert", n)) for n in (4, 2))
    other_bert("some words", truncation=True, max_length=8, padding="max_length")  # leaves call state behind
    assert same_tokenizer(bert, other_bert)
    assert not same_tokenizer(bert, AutoTokenizer.from_pretrained(tiny_family("roberta", 2)))


def test_the_run_exports_and_scores_the_student_with_its_own_tokenizer(tiny_family, glue_dir, tmp_path):
    """--export onnx, the student's int8 export and the live baselines in one run: each model is exported and
    scored on its own tokenizer's encoding (teacher: WordPiece; student: byte-level BPE)."""
    pytest.importorskip("onnxruntime")
    run = compress("distill", tiny_family("bert", 4), glue_dir, tmp_path / "run", export=["onnx"],
                   **{**LIVE_EXTRAS, "method_options.student": tiny_family("roberta", 2)})
    metrics = json.loads((run / "metrics.json").read_text())
    assert {"teacher-onnx", "student-onnx"} <= set(metrics["others"])
    # an fp32 ONNX graph scores as its torch model does, on the same encoding
    assert metrics["others"]["student-onnx"]["accuracy"] == pytest.approx(metrics["student"]["accuracy"])
    assert metrics["others"]["teacher-onnx"]["accuracy"] == pytest.approx(metrics["teacher"]["accuracy"])
    assert any("int8" in name and name.startswith("student-") for name in metrics["others"])
    from transformers import AutoTokenizer

    exported = AutoTokenizer.from_pretrained(run / "exports" / "student-onnx")
    assert exported.get_vocab() == AutoTokenizer.from_pretrained(run / "student").get_vocab()


def test_sentence_vectors_on_squad_across_tokenizers_are_refused_before_training(tiny_family, tmp_path):
    import distillery

    data = write_squad(tmp_path / "data")
    with pytest.raises(DistilleryError, match="drop hidden_weight for SQuAD"):
        distillery.compress(method="distill", task="squad", teacher=tiny_family("bert", 4), data_dir=str(data),
                            out=str(tmp_path / "run"), overrides={**CELL, "data.squad_holdout": 0.5,
                                                                  "method_options.student": tiny_family("roberta", 2),
                                                                  "method_options.hidden_weight": 1.0})
    assert not (tmp_path / "run").exists()


def test_pretrained_student_on_a_regression_task(tiny_family, glue_dir, tmp_path):
    """STS-B (a sentence pair, one score): the student learns the teacher's scores, read through its own tokenizer."""
    import distillery

    run = distillery.compress(method="distill", task="stsb", teacher=tiny_family("mpnet", 4), data_dir=str(glue_dir),
                              out=str(tmp_path / "run"),
                              overrides={**CELL, "method_options.student": tiny_family("roberta", 2)})
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["main_metric"] in metrics["student"]
    config = json.loads((run / "student" / "config.json").read_text())
    assert len(config["id2label"]) == 1 and config["problem_type"] == "regression"
    notes = json.loads((run / "train.json").read_text())["notes"]
    assert not any(n.startswith("Defaults for this student") for n in notes), "a score has no temperature to read"


def test_a_pretrained_student_learns_from_augmented_and_unlabeled_pairs_in_its_own_encoding(tiny_family, glue_dir,
                                                                                           tmp_path):
    """The new rows are made once from the raw text, the teacher labels its own encoding of them, and the student
    reads its own encoding of the same rows: every row of each side has a partner in the other's order."""
    import distillery

    unlabeled = tmp_path / "more.jsonl"
    unlabeled.write_text('{"text": "a cat sat", "text_pair": "a cat sat down"}\n'
                         '{"text": "the film was long", "text_pair": "the show was short"}\n')
    run = distillery.compress(method="distill", task="stsb", teacher=tiny_family("mpnet", 4), data_dir=str(glue_dir),
                              out=str(tmp_path / "run"),
                              overrides={**CELL, "method_options.student": tiny_family("roberta", 2),
                                         "method_options.augment": 2, "data.unlabeled_file": str(unlabeled),
                                         # the teacher's sentence vectors of the new rows too, on its own encoding
                                         "method_options.hidden_weight": 0.5})
    text = json.loads((run / "train.json").read_text())["student_text"]
    assert text["augmented"] == 2 * text["labelled"] and text["unlabeled"] == 2
    assert "embeddings" in text["augment_source"]
    train = json.loads((run / "train.json").read_text())
    assert train["train_examples"] == text["labelled"] + text["augmented"] + text["unlabeled"]


def test_augmenting_squad_for_a_pretrained_student_is_refused_before_training(tiny_family, tmp_path):
    import distillery

    write_squad(tmp_path / "data")
    with pytest.raises(DistilleryError, match="SQuAD"):
        distillery.compress(method="distill", task="squad", teacher=tiny_family("bert", 2), data_dir=str(tmp_path / "data"),
                            out=str(tmp_path / "run"),
                            overrides={**CELL, "method_options.student": tiny_family("roberta", 2),
                                       "method_options.augment": 2})


def test_the_teachers_sentence_vectors_are_cached_beside_its_logits(tiny_family, glue_dir, tmp_path, monkeypatch):
    import os

    monkeypatch.setenv("DISTILLERY_CACHE", str(tmp_path / "cache"))
    options = {"method_options.student": tiny_family("roberta", 2), "method_options.hidden_weight": 0.5}
    compress("distill", tiny_family("bert", 4), glue_dir, tmp_path / "a", **options)
    entries = sorted(os.listdir(tmp_path / "cache" / "logits"))
    assert len(entries) == 2 and sum("-pooled-" in e for e in entries) == 1, entries
    import distillery.distill.pretrained as pretrained

    monkeypatch.setattr(pretrained, "_pooled_pass", lambda *a: pytest.fail("the cached vectors were computed again"))
    compress("distill", tiny_family("bert", 4), glue_dir, tmp_path / "b", **options)


def test_a_run_whose_student_changed_is_not_resumed(tiny_family, glue_dir, tmp_path):
    import shutil

    import distillery
    from tests.helpers import tiny_config

    student = tmp_path / "student"
    shutil.copytree(tiny_family("roberta", 2), student)
    config = tiny_config(tiny_family("bert", 4), glue_dir, tmp_path / "run", **{"method_options.student": str(student),
                                                                               "student.epochs": 1.0})
    distillery.compress(config)
    identity = json.loads((tmp_path / "run" / "teacher_identity.json").read_text())
    assert identity["student"]["files"]  # the student's files by content, beside the teacher's
    settings = student / "tokenizer_config.json"  # changed in place: another student, the same path
    settings.write_text(json.dumps({**json.loads(settings.read_text()), "model_max_length": 256}))
    with pytest.raises(DistilleryError, match="The student .* is not the one this run started with"):
        distillery.compress(tiny_config(tiny_family("bert", 4), glue_dir, tmp_path / "run",
                                        **{"method_options.student": str(student), "student.epochs": 1.0}), resume=True)
