"""End to end on a tiny teacher and tiny GLUE-layout files: every run folder file, resume, refusals."""

import json
import random

import pytest
import torch
import yaml
from safetensors.torch import load_file

import distillery
from distillery.errors import DistilleryError
from distillery.pipeline import build_run_config, compress
from tests.helpers import (LIVE_EXTRAS, MNLI_HEADER, TINY_RUN, assert_one_line_error, run_cli, sentence, tiny_config,
                           write_squad)


def test_compress_writes_a_complete_run_folder(tiny_bert4, glue_dir, tmp_path):
    out = compress(tiny_config(tiny_bert4, glue_dir, tmp_path / "run"))
    for name in ("config.yaml", "metrics.json", "bench.json", "train.json", "report.md", "plot.png"):
        assert (out / name).is_file(), name
    assert not (out / "checkpoints").exists()
    assert (out / "student" / "model.safetensors").is_file()
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["task"] == "sst2" and metrics["main_metric"] == "accuracy"
    assert set(metrics) >= {"split", "teacher", "student", "retention"}
    bench = json.loads((out / "bench.json").read_text())
    assert bench["models"]["student"]["params"] < bench["models"]["teacher"]["params"]
    assert bench["speedup"]["latency"] > 0
    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert saved["method"] == "distill" and saved["data"]["task"] == "sst2"
    student = distillery.load_student(out)
    assert student.config.num_hidden_layers == 2
    assert "accuracy" in (out / "report.md").read_text()


def test_compress_regression_task(tiny_bert, glue_dir, tmp_path):
    out = compress(tiny_config(tiny_bert, glue_dir, tmp_path / "run", task="stsb"))
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["main_metric"] == "pearson"
    assert set(metrics["student"]) >= {"pearson", "spearman"}


def test_teacher_is_cached_between_runs(tiny_bert4, glue_dir, tmp_path):
    compress(tiny_config(tiny_bert4, glue_dir, tmp_path / "a"))
    out = compress(tiny_config(tiny_bert4, glue_dir, tmp_path / "b"))
    assert json.loads((out / "train.json").read_text())["teacher_cached"] is True


def test_existing_run_folder_is_refused(tiny_bert4, glue_dir, tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "x").write_text("keep me")
    with pytest.raises(DistilleryError, match="already exists"):
        compress(tiny_config(tiny_bert4, glue_dir, tmp_path / "run"))
    assert (tmp_path / "run" / "x").read_text() == "keep me"


def test_unknown_method_and_task():
    with pytest.raises(DistilleryError, match="Unknown method"):
        build_run_config(method="no-such-method")
    with pytest.raises(DistilleryError, match="sst2"):
        build_run_config(task="sst3")


def test_interrupted_student_training_resumes_to_the_same_student(tiny_bert4, glue_dir, tmp_path, monkeypatch):
    full = compress(tiny_config(tiny_bert4, glue_dir, tmp_path / "full"))

    import distillery.distill.recipe as baseline

    original = baseline.distillation_loss

    def interrupting(*args, **kwargs):
        inner = original(*args, **kwargs)
        calls = {"n": 0}

        def loss_fn(model, batch):
            calls["n"] += 1
            if calls["n"] == 8:  # after the checkpoint written at step 6 (eval_every=3)
                raise KeyboardInterrupt
            return inner(model, batch)

        return loss_fn

    monkeypatch.setattr(baseline, "distillation_loss", interrupting)
    with pytest.raises(KeyboardInterrupt):
        compress(tiny_config(tiny_bert4, glue_dir, tmp_path / "cut"))
    assert (tmp_path / "cut" / "checkpoints").is_dir()
    monkeypatch.setattr(baseline, "distillation_loss", original)
    resumed = compress(build_run_config(out=str(tmp_path / "cut")), resume=True)

    a = load_file(full / "student" / "model.safetensors")
    b = load_file(resumed / "student" / "model.safetensors")
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=1e-6, msg=k)


def test_resume_without_a_run_is_a_sentence(tmp_path):
    with pytest.raises(DistilleryError, match="Cannot resume"):
        compress(build_run_config(out=str(tmp_path / "nothing")), resume=True)


def test_compress_squad_with_holdout(tiny_bert, tmp_path):
    data = write_squad(tmp_path / "data")
    config = build_run_config(method="distill", task="squad", budget="quick", teacher=tiny_bert,
                              data_dir=str(data), out=str(tmp_path / "run"),
                              overrides={**TINY_RUN, "data.max_length": 48, "data.doc_stride": 16,
                                         "data.squad_holdout": 0.5, "data.train_limit": None})
    out = compress(config)
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["main_metric"] == "f1"
    assert {"exact_match", "f1"} <= set(metrics["student"])
    assert 0.0 <= metrics["student"]["f1"] <= 100.0


def test_compress_custom_csv_with_no_code_change(tiny_bert, tmp_path):
    rng = random.Random(1)
    for name, n in (("train.csv", 48), ("dev.csv", 12)):
        rows = ["review,stars"] + [f"\"{sentence(rng, i % 3 == 0)}, really\",{['low', 'mid', 'high'][i % 3]}"
                                   for i in range(n)]
        (tmp_path / name).write_text("\n".join(rows) + "\n")
    config = build_run_config(method="distill", task="custom", budget="quick", teacher=tiny_bert,
                              out=str(tmp_path / "run"),
                              overrides={**TINY_RUN, "data.train_file": str(tmp_path / "train.csv"),
                                         "data.dev_file": str(tmp_path / "dev.csv"),
                                         "data.text_column": "review", "data.label_column": "stars"})
    out = compress(config)
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["task"] == "custom" and metrics["main_metric"] == "accuracy"
    student = distillery.load_student(out)
    assert student.config.num_labels == 3
    # eval on another file records that file as what was scored, not a split named "dev"
    (tmp_path / "test.csv").write_text((tmp_path / "dev.csv").read_text())
    scored = distillery.evaluate(out, task="custom", dev_file=str(tmp_path / "test.csv"), text_column="review",
                                 label_column="stars", max_length=32)
    assert scored["split"] == str(tmp_path / "test.csv")


def test_mnli_scores_matched_and_mismatched(tiny_bert, tmp_path):
    rng = random.Random(2)
    labels = ["entailment", "neutral", "contradiction"]
    mnli = tmp_path / "data" / "glue" / "MNLI"
    mnli.mkdir(parents=True)
    for name, n in (("train.tsv", 36), ("dev_matched.tsv", 9), ("dev_mismatched.tsv", 6)):
        rows = [f"{i}\t{i}\t{i}\tfiction\t{sentence(rng, 1)}\t{sentence(rng, 0)}\t{labels[i % 3]}\t{labels[i % 3]}"
                for i in range(n)]
        (mnli / name).write_text(MNLI_HEADER + "\n".join(rows) + "\n")
    out = compress(tiny_config(tiny_bert, tmp_path / "data", tmp_path / "run", task="mnli"))
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["split"] == "dev_matched"
    assert set(metrics["other_splits"]["dev_mismatched"]) == {"teacher", "student"}
    assert "accuracy" in metrics["other_splits"]["dev_mismatched"]["student"]


def test_compress_with_a_roberta_teacher(tiny_roberta, glue_dir, tmp_path):
    out = compress(tiny_config(tiny_roberta, glue_dir, tmp_path / "run"))
    student = distillery.load_student(out)
    assert student.config.model_type == "roberta" and student.config.num_hidden_layers == 1
    assert json.loads((out / "metrics.json").read_text())["student"]["accuracy"] >= 0.0


def test_report_says_the_best_checkpoint_was_chosen_on_dev(tiny_bert, glue_dir, tmp_path):
    out = compress(tiny_config(tiny_bert, glue_dir, tmp_path / "run"))
    assert "best evaluation on this same dev split" in (out / "report.md").read_text()


def test_reported_teacher_metrics_equal_a_fresh_score_of_the_saved_teacher(tiny_bert4, glue_dir, tmp_path):
    """compress reuses the trainer's evaluation of the teacher instead of scoring it again."""
    out = compress(tiny_config(tiny_bert4, glue_dir, tmp_path / "run"))
    teacher_path = json.loads((out / "train.json").read_text())["teacher_path"]
    fresh = distillery.evaluate(teacher_path, "sst2", data_dir=str(glue_dir), max_length=32)
    reported = json.loads((out / "metrics.json").read_text())["teacher"]
    assert reported == pytest.approx(fresh["metrics"], abs=1e-9)


def test_resume_refuses_settings_given_differently(tmp_path, monkeypatch, capsys):
    """--resume runs with the saved settings: a flag that disagrees with them is refused by name
    (rather than silently ignored); flags that agree, and another data folder, are accepted."""
    from distillery.folders import claim
    from distillery.pipeline import run_folder_config

    run = claim(tmp_path / "run", "run")
    saved = build_run_config(out=str(run), overrides={"student.epochs": 3.0, "student.lr": 1e-4})
    saved.save(run / "config.yaml")
    code, _, err = run_cli(monkeypatch, capsys, "compress", "--out", str(run), "--resume", "--epochs", "5",
                           "--lr", "1e-4")
    assert_one_line_error(code, err, "student.epochs (saved 3.0, given 5.0)")
    assert "student.lr" not in err
    code, _, err = run_cli(monkeypatch, capsys, "compress", "--out", str(run), "--resume", "--method", "moebert")
    assert_one_line_error(code, err, "method (saved 'distill', given 'moebert')")

    # issue 52: `moebert train --resume` checked nothing; a task left at its default is not a given one
    moebert = claim(tmp_path / "moebert", "run")
    build_run_config(method="moebert", task="rte", out=str(moebert),
                     overrides={"method_options.init": str(tmp_path), "student.lr": 1e-4}).save(moebert / "config.yaml")
    code, _, err = run_cli(monkeypatch, capsys, "moebert", "train", "--init", str(tmp_path), "--out", str(moebert),
                           "--resume", "--lr", "0.5")
    assert_one_line_error(code, err, "these were given differently: student.lr (saved 0.0001, given 0.5).")
    code, _, err = run_cli(monkeypatch, capsys, "moebert", "train", "--init", str(tmp_path), "--out", str(moebert),
                           "--resume", "--task", "sst2")
    assert_one_line_error(code, err, "data.task (saved 'rte', given 'sst2')")

    again = build_run_config(out=str(run), data_dir=str(tmp_path / "moved"), overrides={"student.epochs": 3})
    _, config = run_folder_config(again, True, {"student.epochs": 3, "data.data_dir": str(tmp_path / "moved")})
    assert config.student.epochs == 3.0 and config.data.data_dir == str(tmp_path / "moved")


def test_compress_reads_a_settings_file_and_flags_override_it(monkeypatch, tiny_bert4, glue_dir, tmp_path):
    """``compress --config FILE.yaml``: the file's settings (config.yaml's shape) are the run's, and a
    flag given on the command line wins over the file."""
    import sys

    from distillery import cli

    def section(prefix):  # TINY_RUN's dotted settings under ``prefix``, as a nested mapping
        return {k[len(prefix):]: v for k, v in TINY_RUN.items() if k.startswith(prefix) and "." not in k[len(prefix):]}

    settings = {"method": "distill", "out": str(tmp_path / "from-file"),
                "teacher": {"name": str(tiny_bert4), "train": section("teacher.train.")},
                "data": {"data_dir": str(glue_dir), **section("data.")}, "student": section("student."),
                "bench": section("bench."), "method_options": {"kd_weight": 0.25, "temperature": 3.0},
                "baselines": TINY_RUN["baselines"], "int8": TINY_RUN["int8"]}  # TINY_RUN's top-level settings too
    path = tmp_path / "settings.yaml"
    path.write_text(yaml.safe_dump(settings))
    monkeypatch.setattr(sys, "argv", ["distillery", "compress", "--config", str(path), "--lr", "5e-4",
                                      "--option", "temperature=4", "--out", str(tmp_path / "run")])
    cli.main()
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert saved["student"]["lr"] == 5e-4  # the flag
    assert saved["student"]["batch_size"] == TINY_RUN["student.batch_size"]  # the file
    assert saved["method_options"] == {"kd_weight": 0.25, "temperature": 4}  # the file, then the flag
    assert saved["data"]["max_length"] == 32 and saved["teacher"]["name"] == str(tiny_bert4)
    assert not (tmp_path / "from-file").exists()  # --out on the command line won


@pytest.mark.parametrize("limit, whole, expected", [(40, True, 96), (40, False, 40), (200, True, 96)])
def test_distillation_train_takes_the_whole_split_only_when_asked_and_limited(tiny_bert, glue_dir, tmp_path,
                                                                              limit, whole, expected):
    # The teacher, fine-tuned on the budget's examples, labels the rest for the student; below the limit
    # the run already holds every example and nothing is encoded again.
    from transformers import AutoModelForSequenceClassification

    from distillery.data.encode import prepare_task_data
    from distillery.data.tasks import get_task
    from distillery.method_context import MethodContext
    from distillery.teacher import teacher_tokenizer

    config = tiny_config(tiny_bert, glue_dir, tmp_path / "run", **{"data.train_limit": limit})
    tokenizer = teacher_tokenizer(str(tiny_bert))
    task_data = prepare_task_data(get_task("sst2"), tokenizer, config.data)
    teacher = AutoModelForSequenceClassification.from_pretrained(str(tiny_bert), num_labels=2).eval()
    ctx = MethodContext(config=config, teacher=teacher, tokenizer=tokenizer, task_data=task_data, out_dir=tmp_path)
    train = ctx.distillation_train(whole)
    assert len(train) == expected and "teacher_logits" in train.column_names
    assert any(n.startswith("Student data: all 96") for n in ctx.notes) == (expected > len(task_data.train))
    # the rows the budget kept carry the same teacher logits in both encodings
    budget = ctx.train_with_teacher_logits()
    first = {tuple(r["input_ids"]): r["teacher_logits"] for r in budget}
    both = [r for r in train if tuple(r["input_ids"]) in first]
    assert len(both) >= len(budget)  # every budget row is in the whole split (duplicates may add more)
    for r in both:
        torch.testing.assert_close(torch.tensor(r["teacher_logits"]), torch.tensor(first[tuple(r["input_ids"])]))


def test_every_run_measures_the_students_int8_export_and_names_what_to_deploy(tiny_bert4, glue_dir, tmp_path):
    from distillery.export import DEFAULT_INT8
    from distillery.report_parts import deploy_sentence
    from distillery.run_record import load_run

    out = compress(tiny_config(tiny_bert4, glue_dir, tmp_path / "run", **LIVE_EXTRAS))
    name = f"student-{DEFAULT_INT8}"
    metrics = json.loads((out / "metrics.json").read_text())
    bench = json.loads((out / "bench.json").read_text())
    assert name in metrics["others"] and name in bench["models"]
    assert (out / "exports" / name / "model.onnx").is_file() or any((out / "exports" / name).glob("*.onnx"))
    assert set(metrics["baselines"]) == {"teacher-int8", "static-embeddings"}
    run = load_run(out)
    sentence = deploy_sentence(run.bench, run.metrics)
    assert sentence.startswith(("Deploy `student`", f"Deploy `exports/{name}`", "Deploy the "))
    # the report's verdict and the model card say the same
    verdict = (out / "report.md").read_text().split("## Verdict", 1)[1].split("\n## ", 1)[0]
    assert sentence in verdict
    assert sentence in (out / "student" / "README.md").read_text()
    # every file of the export is in the folder's record: the run can be replaced
    assert compress(tiny_config(tiny_bert4, glue_dir, tmp_path / "run", int8=False), overwrite=True) == out
    assert not (out / "exports").exists()


def test_no_int8_keeps_the_student_alone(tiny_bert4, glue_dir, tmp_path, monkeypatch):
    from distillery import pipeline

    calls = []
    monkeypatch.setattr(pipeline, "student_int8", lambda *args: calls.append(args) or ({}, {}))
    assert build_run_config().int8 is True  # on by default (TINY_RUN turns it off)
    compress(tiny_config(tiny_bert4, glue_dir, tmp_path / "on", int8=True))
    assert len(calls) == 1
    out = compress(tiny_config(tiny_bert4, glue_dir, tmp_path / "off", int8=False))
    assert len(calls) == 1 and not (out / "exports").exists()
    assert yaml.safe_load((out / "config.yaml").read_text())["int8"] is False


def test_the_quick_budget_makes_one_pass_over_a_whole_split_unless_epochs_are_given():
    config = build_run_config()  # distill, sst2, quick
    assert config.student.epochs == 2.0 and config.student.whole_split_epochs == 1.0
    assert build_run_config(overrides={"student.epochs": 3.0}).student.whole_split_epochs == 3.0
    assert build_run_config(method="moebert", preset="paper").student.whole_split_epochs == 5.0  # Table 7's epochs
    assert build_run_config(budget="full").student.whole_split_epochs is None
    assert build_run_config(method="cmow").student.whole_split_epochs is None  # cmow keeps its own epochs


def test_whole_split_epochs_apply_only_to_a_split_larger_than_the_runs(tiny_bert4, glue_dir, tmp_path, monkeypatch):
    from distillery.training import trainer

    epochs, init = [], trainer.Trainer.__init__
    monkeypatch.setattr(trainer.Trainer, "__init__",
                        lambda self, model, cfg, *a, **k: epochs.append(cfg.epochs) or init(self, model, cfg, *a, **k))
    out = compress(tiny_config(tiny_bert4, glue_dir, tmp_path / "run", **{
        "data.train_limit": 40, "student.whole_split_epochs": 1.0, "student.eval_every": None}))
    train = json.loads((out / "train.json").read_text())
    assert train["train_examples"] == 96 and any("1 pass(es) over the whole train split" in n for n in train["notes"])
    budget = compress(tiny_config(tiny_bert4, glue_dir, tmp_path / "budget", **{
        "data.train_limit": 40, "student.whole_split_epochs": 1.0, "method_options.train_examples": "budget"}))
    notes = json.loads((budget / "train.json").read_text())["notes"]
    assert not any("over the whole train split" in n for n in notes)
    assert epochs[-3:] == [2.0, 1.0, 2.0]  # teacher fine-tuning, the student on all 96, the student on the 40


@pytest.mark.parametrize("method", ["distill", "cmow"])
def test_eval_of_the_saved_student_equals_metrics_json_exactly(tiny_bert, glue_dir, tmp_path, method):
    # the run scores the student as saved, so a reload in another process gives metrics.json to the last bit
    import subprocess
    import sys

    extra = {"method_options.matrix_dim": 4, "method_options.vector_dim": 16} if method == "cmow" else {}
    out = compress(tiny_config(tiny_bert, glue_dir, tmp_path / "run", task="stsb", method=method, **extra))
    recorded = json.loads((out / "metrics.json").read_text())["student"]
    code = ("import json, sys, distillery; print(json.dumps(distillery.evaluate(sys.argv[1], task='stsb', "
            "data_dir=sys.argv[2], max_length=32)['metrics']))")
    shown = subprocess.run([sys.executable, "-c", code, str(out), str(glue_dir)], capture_output=True, text=True,
                           check=True, env={**__import__("os").environ, "HF_HUB_OFFLINE": "1"}).stdout
    assert json.loads(shown.strip().splitlines()[-1]) == recorded


def test_settings_are_resolved_in_one_order_defaults_budget_preset_file_flags_candidate():
    from distillery.config import BUILTIN_TEACHER, DEFAULT_BUDGET, DEFAULT_METHOD, DEFAULT_TASK
    from distillery.pipeline import build_run_config, resolve_settings

    plain = resolve_settings()
    assert (plain.method, plain.data.task, plain.budget, plain.teacher.name) == \
        (DEFAULT_METHOD, DEFAULT_TASK, DEFAULT_BUDGET, BUILTIN_TEACHER)
    assert plain.data.max_length == 64  # the quick budget's for a single-sentence task
    file = {"data.task": "mrpc", "student.lr": 1e-3, "data.max_length": 96}
    flags = {"student.lr": 2e-3, "teacher.name": None}  # None: not given, the file's or the default stands
    candidate = {"method": "moebert", "method_options.num_experts": 2}
    config = resolve_settings(file, flags, candidate, preset=None)
    assert (config.method, config.data.task, config.student.lr, config.data.max_length) == ("moebert", "mrpc", 2e-3, 96)
    assert config.method_options == {"num_experts": 2} and config.teacher.name == BUILTIN_TEACHER
    paper = resolve_settings({"method": "moebert", "data.task": "sst2"}, {"student.lr": 5e-4}, preset="paper")
    preset_only = resolve_settings({"method": "moebert", "data.task": "sst2"}, preset="paper")
    assert paper.student.lr == 5e-4 and preset_only.student.lr != 5e-4  # the flags win over the preset
    assert build_run_config(task="mrpc", overrides={"student.lr": 2e-3}) == resolve_settings(
        {"data.task": "mrpc", "student.lr": 2e-3})


def test_a_tasks_alias_gets_its_tasks_budget():
    """`--task squad2` ran with the sentence budget (128 tokens, no document stride) where `--task squad_v2` gets
    SQuAD's, and `--task SST-2` with a pair task's length: the budget looked the name up as written."""
    from distillery.pipeline import budget_defaults

    for budget in ("quick", "full"):
        assert budget_defaults(budget, "squad2") == budget_defaults(budget, "squad_v2")
        assert budget_defaults(budget, "SST-2") == budget_defaults(budget, "sst2")
    assert budget_defaults("quick", "squad2")["data.max_length"] != budget_defaults("quick", "custom")["data.max_length"]
