"""distillery.report: a synthetic run folder -> report.md with the numbers, a valid plot.png."""

from __future__ import annotations

import json

import pytest
import yaml

from distillery.errors import DistilleryError
from distillery.plot import pareto_front, write_plot
from distillery.report import merge_runs, write_report
from distillery import report_parts as rp
from distillery.run_record import INT8_NAME, REQUIRED_FILES, STATIC_NAME, Bench, Metrics
from tests.helpers import make_run, tiny_bert_config

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_write_report_has_the_numbers_and_a_png(tmp_path):
    run = make_run(tmp_path / "run")
    report = write_report(run)
    assert report == run / "report.md"
    text = report.read_text()
    assert text.startswith("# moebert on sst2")
    assert "`minilm`" in text and "experts=4" in text and "200 dev examples" in text
    assert "1.90×" in text  # teacher 19 ms / student 10 ms
    assert "2.08×" in text  # 250 / 120 sentences/s
    assert "95.6 %" in text  # 0.835 / 0.873
    assert "| int8 |" in text and "97.3 %" in text  # another measured, scored model
    assert "0.873" in text and "0.835" in text and "| f1 |" in text.replace(" f1 ", "| f1 |")
    assert "1.9× faster than the teacher at 1×128" in text and "keeps 95.6 % of the teacher's accuracy" in text
    assert "Test CPU 9000" in text and "2 torch threads" in text
    assert "smoke run" in text and "1.6 min" in text  # train.json
    # no constant reference points: the free baselines come only from what the run measured (none here)
    assert "model2vec" not in text and "Against what you can get for free" not in text
    png = (run / "plot.png").read_bytes()
    assert png.startswith(PNG_MAGIC) and len(png) > 1000


def test_plot_is_a_readable_image(tmp_path):
    import matplotlib.image

    out = write_plot(
        [{"label": "teacher", "latency_ms": 19.0, "metric": 0.87}, ("student", 10.0, 0.83), ("bad", 30.0, 0.80)],
        tmp_path / "p.png",
        "accuracy",
    )
    image = matplotlib.image.imread(out)
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100


@pytest.mark.parametrize("fastest, slowest", [(0.15, 562.0), (0.3, 0.9), (2.0, 40.0), (0.05, 3000.0)])
def test_the_log_axis_labels_never_overlap(fastest, slowest):
    from distillery.plot import plot_figure

    points = [("a", fastest, 0.8), ("b", (fastest * slowest) ** 0.5, 0.85), ("c", slowest, 0.87)]
    fig = plot_figure(points, "accuracy")
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    ax = fig.axes[0]
    shown = [t for t in ax.xaxis.get_ticklabels(which="both") if t.get_visible() and t.get_text()
             and ax.get_xlim()[0] <= t.get_position()[0] <= ax.get_xlim()[1]]
    assert len(shown) >= 2
    boxes = sorted((t.get_window_extent(renderer) for t in shown), key=lambda b: b.x0)
    assert all(a.x1 <= b.x0 for a, b in zip(boxes, boxes[1:])), [t.get_text() for t in shown]


def test_a_crowded_plot_names_the_frontier_rings_the_chosen_point_and_draws_the_target():
    """Issue 41: auto's plot overlapped its labels and marked neither the chosen point nor the target."""
    from distillery.plot import plot_figure

    points = [("teacher", 1.0, 0.84), ("a", 0.50, 0.83), ("a+int8", 0.20, 0.82), ("b", 0.48, 0.80),
              ("b+int8", 0.21, 0.79), ("c", 0.05, 0.70), ("c+int8", 0.06, 0.69)]
    fig = plot_figure(points, "accuracy", chosen="a+int8", target_x=0.5, label_only={"teacher", "a", "a+int8", "c"})
    ax = fig.axes[0]
    assert {t.get_text() for t in ax.texts} == {"teacher", "a", "a+int8", "c"}  # off the frontier: in the table
    legend = {t.get_text() for t in ax.get_legend().get_texts()}
    assert legend == {"Pareto frontier", "chosen: a+int8", "target"}
    assert any(line.get_xdata()[0] == 0.5 for line in ax.get_lines())


def test_pareto_front_keeps_only_undominated_points():
    pts = [("slow-good", 20, 0.9), ("fast-ok", 5, 0.8), ("dominated", 25, 0.85), ("fastest-bad", 1, 0.7), ("tie", 5, 0.75)]
    assert [p[0] for p in pareto_front(pts)] == ["fastest-bad", "fast-ok", "slow-good"]


def test_report_without_baselines_and_optional_files(tmp_path):
    run = make_run(tmp_path / "run", task="rte", extra=False, train=False, student_ms=25.0)
    text = write_report(run).read_text()
    assert "model2vec" not in text and "SST-2" not in text
    assert "1.3× slower than the teacher" in text
    assert (run / "plot.png").is_file()


@pytest.mark.parametrize("missing", REQUIRED_FILES)
def test_missing_file_is_named(tmp_path, missing):
    run = make_run(tmp_path / "run")
    (run / missing).unlink()
    with pytest.raises(DistilleryError, match=missing.replace(".", r"\.")):
        write_report(run)


def test_missing_folder_and_bad_json(tmp_path):
    with pytest.raises(DistilleryError, match="does not exist"):
        write_report(tmp_path / "nope")
    run = make_run(tmp_path / "run")
    (run / "bench.json").write_text("{not json")
    with pytest.raises(DistilleryError, match="bench.json is not valid JSON"):
        write_report(run)


def _with_metrics(run, **changes):
    """``run`` with its metrics.json's top-level fields replaced by ``changes``."""
    metrics = json.loads((run / "metrics.json").read_text())
    (run / "metrics.json").write_text(json.dumps({**metrics, **changes}))
    return run


@pytest.mark.parametrize("changes, refusal", [
    ({"student": {"accuracy": 5.0}}, "student.accuracy holds 5.0, but accuracy lies in [0, 1]"),
    ({"teacher": {"accuracy": 0.9, "f1": -0.2}}, "teacher.f1 holds -0.2, but f1 lies in [0, 1]"),
    ({"others": {"int8": {"accuracy": 84.9}}}, "others.int8.accuracy holds 84.9, but accuracy lies in [0, 1]"),
    ({"task": "stsb", "main_metric": "pearson", "teacher": {"pearson": 0.8, "spearman": 1.5}},
     "teacher.spearman holds 1.5, but spearman lies in [-1, 1]"),
    ({"task": "cola", "main_metric": "mcc", "teacher": {"mcc": -1.2}}, "teacher.mcc holds -1.2, but mcc lies in [-1, 1]"),
    ({"other_splits": {"dev_mismatched": {"student": {"accuracy": 1.01}}}},
     "other_splits.dev_mismatched.student.accuracy holds 1.01"),
    ({"chance": {"main": 50.0, "margin": 0.03}}, "chance.main holds 50.0, but accuracy lies in [0, 1]"),
    ({"task": "squad", "main_metric": "f1", "teacher": {"exact_match": 80.0, "f1": 101.0}},
     "teacher.f1 holds 101.0, but f1 lies in [0, 100]"),
    ({"student": {"accuracy": float("nan")}}, "student.accuracy holds nan, but a score is a finite number"),
    ({"task": "stsb", "main_metric": "pearson", "teacher": {"pearson": float("inf"), "spearman": 0.8}},
     "teacher.pearson holds inf, but a score is a finite number"),
])
def test_a_score_outside_its_metrics_range_is_refused_naming_the_file_field_and_value(tmp_path, changes, refusal):
    """Issue 52: an accuracy of 5.0 in metrics.json became "Deploy `student`: accuracy 5.00" in the report and card."""
    run = _with_metrics(make_run(tmp_path / "run"), **changes)
    with pytest.raises(DistilleryError) as refused:
        write_report(run)
    assert str(refused.value).startswith(f"{run / 'metrics.json'}: {refusal}")
    assert not (run / "report.md").exists()


def test_scores_at_the_ends_of_their_ranges_and_squads_percentages_are_read(tmp_path):
    squad = {"exact_match": 80.5, "f1": 88.25, "HasAns_f1": 100.0, "NoAns_exact": 0.0}
    for i, changes in enumerate([{"teacher": {"accuracy": 1.0, "f1": 0.0}, "student": {"accuracy": 0.0, "f1": 1.0}},
                                 {"task": "cola", "main_metric": "mcc", "teacher": {"mcc": 1.0},
                                  "student": {"mcc": -1.0}, "chance": {"main": 0.0, "margin": 0.06}},
                                 {"task": "squad_v2", "main_metric": "f1", "teacher": squad, "student": squad,
                                  "others": {"int8": {"exact_match": 79.0, "f1": 87.0}},
                                  # a group without exact_match and the chance level are percentages too
                                  "baselines": {"static": {"f1": 40.0}}, "chance": {"main": 8.0, "margin": 1.0}}]):
        assert write_report(_with_metrics(make_run(tmp_path / str(i)), **changes)).is_file()


def test_merge_runs(tmp_path):
    a = make_run(tmp_path / "moe", method="moebert")
    b = make_run(tmp_path / "cmow", method="cmow", student_acc=0.80, student_ms=2.0, extra=False)
    report = merge_runs([a, b], tmp_path / "merged")
    text = report.read_text()
    assert "# Methods compared on sst2" in text
    assert "| moe | student |" in text and "| cmow | student |" in text
    assert "9.50×" in text  # cmow's 19 ms teacher / 2 ms student
    assert "Most accurate compressed model: `moebert:int8`" in text and "Fastest: `cmow:student`" in text
    assert (tmp_path / "merged" / "plot.png").read_bytes().startswith(PNG_MAGIC)
    c = make_run(tmp_path / "rte", task="rte")
    with pytest.raises(DistilleryError, match="different tasks"):
        merge_runs([a, c], tmp_path / "merged2")


def test_report_from_a_real_benchmark(tmp_path):
    """bench.benchmark's own output (tiny models) goes through the report unchanged."""
    import torch
    from transformers import BertModel

    from distillery.bench import benchmark, save_bench

    torch.manual_seed(0)
    models = {"teacher": BertModel(tiny_bert_config()), "student": BertModel(tiny_bert_config(num_hidden_layers=1))}
    bench = benchmark(models, latency_shape=(1, 16), throughput_shape=(4, 16), latency_runs=2, warmup=0, throughput_runs=1)
    run = make_run(tmp_path / "run", task="mrpc", extra=False)
    save_bench(bench, run / "bench.json")
    text = write_report(run).read_text()
    assert "latency 1×16 median (ms)" in text and "throughput 4×16" in text
    assert f"{bench['speedup']['latency']:.2f}×" in text


def test_pipeline_shaped_train_json(tmp_path):
    run = make_run(tmp_path / "run", train=False)
    info = {"teacher_seconds": None, "teacher_cached": True, "student_seconds": 30.0, "train_examples": 67349,
            "total_seconds": 4000.0, "notes": []}
    (run / "train.json").write_text(json.dumps(info))
    text = write_report(run).read_text()
    assert "reused from the cache" in text and "67,349" in text and "1.11 h" in text and "30 s" in text


def test_report_says_when_the_student_saw_more_examples_than_the_teacher(tmp_path):
    run = make_run(tmp_path / "run", train=False)
    info = {"student_seconds": 30.0, "train_examples": 67349, "teacher_train_examples": 20000, "notes": []}
    (run / "train.json").write_text(json.dumps(info))
    assert "67,349 (the teacher fine-tuned on 20,000 of them, and labelled the rest)" in write_report(run).read_text()


HOSTILE = "t`e|a<img src=x onerror=alert(1)>*b* [l](u)\n\n# h"


def rendered(markdown: str) -> str:
    """report.md as GitHub-like Markdown (tables, raw HTML live) renders it."""
    markdown_it = pytest.importorskip("markdown_it")
    return markdown_it.MarkdownIt("commonmark", {"html": True}).enable(["table", "strikethrough"]).render(markdown)


def assert_shown_as_is(markdown: str) -> None:
    """No live HTML, no link, no table row with more cells than its header, and the text shown as it is
    (its line breaks as spaces)."""
    import html
    import re

    page = rendered(markdown)
    assert re.findall(r"<img[^>]*>", page) == ['<img src="plot.png" alt="score against latency" />']
    assert "<a " not in page and "<h1>h" not in page and "<em>" not in page
    for table in re.findall(r"<table>.*?</table>", page, flags=re.S):
        head = table.count("<th>")
        rows = re.findall(r"<tr>(.*?)</tr>", table.split("</thead>")[1], flags=re.S)
        assert rows and all(row.count("<td") == head for row in rows)
    text = html.unescape(re.sub(r"<[^>]+>", "", page))
    assert HOSTILE.replace("\n", " ") in text


def test_user_named_text_cannot_inject_markdown_or_html(tmp_path):
    """A teacher path, a run folder's name, a method option, a model name, a note or hardware holding a
    backtick, a "|", HTML, emphasis, a link or line breaks goes into report.md escaped (md())."""
    from distillery.markdown import md

    runs = []
    for name in ("a", "b"):
        run = make_run(tmp_path / f"{name}`|<b>", method="moebert" if name == "a" else "cmow")
        config = yaml.safe_load((run / "config.yaml").read_text())
        config["teacher"]["name"] = config["method_options"]["k"] = HOSTILE
        (run / "config.yaml").write_text(yaml.safe_dump(config))
        metrics, bench = json.loads((run / "metrics.json").read_text()), json.loads((run / "bench.json").read_text())
        metrics["others"] = {HOSTILE: {"accuracy": 0.849}}
        bench["models"][HOSTILE] = bench["models"].pop("int8")
        bench["hardware"]["cpu"] = HOSTILE
        (run / "metrics.json").write_text(json.dumps(metrics))
        (run / "bench.json").write_text(json.dumps(bench))
        (run / "train.json").write_text(json.dumps({"notes": [HOSTILE]}))
        runs.append(run)
        text = write_report(run).read_text()
        assert md(HOSTILE, code=True) in text  # the teacher as one code span
        assert_shown_as_is(text)
    text = merge_runs(runs, tmp_path / "merged").read_text()
    assert "a\\`\\|&lt;b&gt;" in text  # the run folder's name in the table
    assert_shown_as_is(text)


@pytest.mark.parametrize("value", ["plain", "a`b", "``x", "x`", " spaced ", "", "<b>|</b>", "a\\b", "__init__ & *x*"])
def test_md_shows_any_text_as_it_is(value):
    """Plain and as a code span, inside a table cell and a paragraph, ``value`` renders as itself."""
    import html
    import re

    from distillery.markdown import md

    page = rendered(f"| h |\n|---|\n| {md(value)} |\n\nbefore {md(value, code=True)} after\n")
    cell = re.search(r"<td>(.*?)</td>", page, flags=re.S).group(1)
    code = re.search(r"before (.*) after", page).group(1)
    assert html.unescape(cell) == value.strip()  # a table cell's outer spaces are not part of it
    assert html.unescape(re.sub(r"</?code>", "", code)) == (value or " ")


def test_a_teacher_at_chance_is_flagged_first_and_no_retention_is_given(tmp_path):
    import json

    from distillery.run_record import Metrics

    run = make_run(tmp_path / "run")
    metrics = json.loads((run / "metrics.json").read_text())
    teacher = metrics["teacher"]["accuracy"]
    metrics["chance"] = {"main": teacher - 0.01, "margin": 0.034, "predictor": "always the most frequent class (1)"}
    (run / "metrics.json").write_text(json.dumps(metrics))
    text = write_report(run).read_text()
    first = text.split("\n\n")[1]
    assert first.startswith("**The teacher scores at chance on this dev set") and "±0.034" in first
    verdict = text.split("## Verdict", 1)[1].split("\n## ", 1)[0]
    assert "at chance" in verdict and "% of the teacher's" not in verdict
    # a teacher well above chance: no flag
    metrics["chance"]["main"] = teacher - 0.2
    assert Metrics.from_dict(metrics).chance_warning() is None
    assert Metrics(main_metric="accuracy", teacher={"accuracy": 0.5}).chance_warning() is None  # no record


def test_chance_is_the_majority_class_or_a_constant(tiny_bert, glue_dir):
    from distillery.config import DataConfig
    from distillery.data.encode import prepare_task_data
    from distillery.data.tasks import get_task
    from distillery.evaluation import chance_score
    from distillery.teacher import teacher_tokenizer

    tokenizer = teacher_tokenizer(str(tiny_bert))
    for task, metric in (("sst2", "accuracy"), ("stsb", "pearson")):
        data = prepare_task_data(get_task(task), tokenizer, DataConfig(task=task, data_dir=str(glue_dir), max_length=32))
        chance = chance_score(data)
        dev = [int(x) if task == "sst2" else x for x in data.dev["labels"]]
        if task == "sst2":
            majority = max(set(data.train["labels"]), key=list(data.train["labels"]).count)
            assert chance["main"] == pytest.approx(sum(d == majority for d in dev) / len(dev))
        else:
            assert chance["main"] == 0.0 and chance["predictor"] == "a constant"
        assert chance["margin"] > 0


@pytest.mark.parametrize("teacher_n, student_n, limited", [(4500, 4500, False), (20000, 67349, False),
                                                          (20000, 20000, True)])
def test_a_train_limit_is_named_only_where_it_limited_the_scores(teacher_n, student_n, limited):
    from distillery.report_parts import config_lines
    from distillery.run_record import Train

    config = {"method": "distill", "data": {"task": "mrpc", "train_limit": 20000}}
    lines = config_lines(config, Train(train_examples=student_n, teacher_train_examples=teacher_n))
    assert any("limited to 20000 training examples" in line for line in lines) == limited


# --------------------------------------------------------------------------------------------
# The report's rows and verdict against the free baselines


def _record(latency: dict, scores: dict):
    models = {n: {"latency_ms": {"median": ms}, "throughput": {"sentences_per_s": 100.0 / ms}} for n, ms in latency.items()}
    metrics = {"main_metric": "accuracy", "teacher": {"accuracy": scores.pop("teacher")},
               "student": {"accuracy": scores.pop("student")}, "baselines": {n: {"accuracy": v} for n, v in scores.items()}}
    return Bench({"models": models}), Metrics.from_dict(metrics)


def test_verdict_reads_the_live_rows():
    bench, metrics = _record({"teacher": 10.0, "student": 4.0, INT8_NAME: 5.0, STATIC_NAME: 0.1},
                             {"teacher": 0.9, "student": 0.88, INT8_NAME: 0.87, STATIC_NAME: 0.7})
    rows = rp.baseline_rows(bench, metrics)
    assert [r["model"] for r in rows] == ["teacher", "student", INT8_NAME, STATIC_NAME]
    assert rows[2]["latency_speedup"] == pytest.approx(2.0)
    sentence = rp.baseline_verdict(bench, metrics)
    assert "beats the teacher-int8 baseline on both" in sentence and "0.880 against 0.870" in sentence
    assert "more accurate than the static-embeddings baseline" in sentence and "earns its place" in sentence

    bench, metrics = _record({"teacher": 10.0, "student": 4.0, INT8_NAME: 3.0},
                             {"teacher": 0.9, "student": 0.8, INT8_NAME: 0.85})
    sentence = rp.baseline_verdict(bench, metrics)
    assert "Deploy the teacher-int8 baseline instead" in sentence and "not worth its training" in sentence
    assert "both faster (3.33× against 2.50× the teacher's speed) and more accurate (accuracy 0.850 against 0.800)" \
        in sentence  # the baseline's own figures first: it is the subject
    section = rp.baseline_section(bench, metrics, notes=["No static-embedding baseline on SQuAD."])
    assert "| teacher-int8 | 0.850 |" in section and "- note: No static" in section


def test_verdict_weighs_the_students_int8_export_and_names_what_to_deploy():
    # the fp32 student is more accurate but slower than the int8 teacher; its export beats it on both
    bench, metrics = _record({"teacher": 10.0, "student": 5.0, "student-onnx-int8": 2.5, INT8_NAME: 4.0,
                              STATIC_NAME: 0.1},
                             {"teacher": 0.9, "student": 0.89, INT8_NAME: 0.87, STATIC_NAME: 0.7})
    metrics.others = {"student-onnx-int8": {"accuracy": 0.885}}
    rows = rp.baseline_rows(bench, metrics)
    assert [r["model"] for r in rows] == ["teacher", "student", "student-onnx-int8", INT8_NAME, STATIC_NAME]
    assert rp.deploy_choice(rows)["model"] == "student-onnx-int8"
    sentence = rp.baseline_verdict(bench, metrics)
    assert "the student's export student-onnx-int8: it beats the teacher-int8 baseline on both" in sentence
    assert "Deploy `exports/student-onnx-int8`: accuracy 0.885 at 4.00× the teacher's speed" in sentence
    assert "earns its place" in sentence
    # only the student, as auto weighs its chosen point, in the folder it names
    sentence = rp.baseline_verdict(bench, metrics, students=("student",), paths={"student": "runs/x/chosen"})
    assert "Deploy `runs/x/chosen`: accuracy 0.890 at 2.00×" in sentence


def test_verdict_reads_a_tie_at_the_printed_precision_and_never_the_wrong_way_round():
    # equal scores: "as accurate", not "less accurate (0.505 against 0.505)"
    bench, metrics = _record({"teacher": 10.0, "student": 4.0, INT8_NAME: 5.0},
                             {"teacher": 0.9, "student": 0.5051, INT8_NAME: 0.5049})
    sentence = rp.baseline_verdict(bench, metrics)
    assert "it is as accurate as the teacher-int8 baseline (accuracy 0.505 against 0.505) and faster" in sentence
    assert "Deploy `student`" in sentence
    # a tie in score and a slower student: the baseline is as good on both
    bench, metrics = _record({"teacher": 10.0, "student": 6.0, INT8_NAME: 5.0},
                             {"teacher": 0.9, "student": 0.505, INT8_NAME: 0.505})
    sentence = rp.baseline_verdict(bench, metrics)
    assert "is both faster (2.00× against 1.67× the teacher's speed) and as accurate (accuracy 0.505 against 0.505)" \
        in sentence and "Deploy the teacher-int8 baseline instead" in sentence
    # a less accurate, slower student: the baseline's score is the higher one, and it comes first
    bench, metrics = _record({"teacher": 10.0, "student": 6.0, INT8_NAME: 5.0},
                             {"teacher": 0.9, "student": 0.51, INT8_NAME: 0.696})
    assert "more accurate (accuracy 0.696 against 0.510)" in rp.baseline_verdict(bench, metrics)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), "0.9"])
def test_a_score_that_is_not_a_finite_number_is_an_error_not_a_verdict(bad):
    bench, metrics = _record({"teacher": 10.0, "student": 4.0, INT8_NAME: 5.0},
                             {"teacher": 0.9, "student": bad, INT8_NAME: 0.87})
    with pytest.raises(DistilleryError, match="metrics.json records accuracy .* for student, not a finite number"):
        rp.baseline_verdict(bench, metrics)


def test_verdict_without_baselines_says_so():
    bench, metrics = _record({"teacher": 10.0, "student": 4.0}, {"teacher": 0.9, "student": 0.8})
    assert "No live baseline" in rp.baseline_verdict(bench, metrics)


# --------------------------------------------------------------------------------------------
# The run record: one home for the run folder's files


def test_a_new_metrics_field_shows_in_the_report_the_card_and_a_merged_report(tmp_path, monkeypatch, tiny_bert):
    """Issue 42: a key of metrics.json is declared once, in run_record.METRICS_FIELDS; the report, the model
    card and a merged report show it with no other edit, and its type is checked like any other field."""
    import shutil

    from distillery import run_record
    from distillery.card import write_card

    field = run_record.Field("calibration_error", run_record.NUMBER, title="expected calibration error")
    monkeypatch.setattr(run_record, "METRICS_FIELDS", [*run_record.METRICS_FIELDS, field])
    runs = [make_run(tmp_path / name) for name in ("a", "b")]
    for run in runs:
        metrics = run_record.read_metrics(run)
        metrics.extra["calibration_error"] = 0.0421
        run_record.save(run, metrics)
    shutil.copytree(tiny_bert, runs[0] / "student")
    assert "- expected calibration error: 0.042\n" in write_report(runs[0]).read_text()
    assert "- expected calibration error: 0.042\n" in write_card(runs[0]).read_text()
    merged = merge_runs(runs, tmp_path / "merged").read_text()
    assert merged.count("; expected calibration error: 0.042;") == 2
    metrics = json.loads((runs[1] / "metrics.json").read_text())
    (runs[1] / "metrics.json").write_text(json.dumps({**metrics, "calibration_error": "low"}))
    with pytest.raises(DistilleryError, match="calibration_error holds the string 'low'"):
        write_report(runs[1])


def test_the_records_write_the_files_as_the_pipeline_always_wrote_them(tmp_path):
    """Existing run folders read back, and a record writes its keys in the order (and the nulls) of before."""
    from distillery.run_record import Bench, Metrics, Train, load_run, save

    run = load_run(make_run(tmp_path / "run"))
    for name, record in (("metrics.json", run.metrics), ("bench.json", run.bench)):
        assert json.dumps(record.to_dict()) == (run.dir / name).read_text()
    metrics = Metrics(task="rte", split="validation", main_metric="accuracy", teacher={"accuracy": 0.0},
                      student={"accuracy": 0.0}, baseline_notes=["none"], extra={"later": 1})
    assert list(metrics.to_dict()) == ["task", "split", "main_metric", "teacher", "student", "retention",
                                       "baseline_notes", "later"]
    assert list(Train(notes=["n"]).to_dict()) == ["teacher_seconds", "teacher_cached", "teacher_path",
                                                  "student_seconds", "train_examples", "teacher_train_examples",
                                                  "student_text", "total_seconds", "notes"]
    path = save(tmp_path, metrics)
    assert path.read_text() == json.dumps(metrics.to_dict(), indent=2) and '"retention": null' in path.read_text()
    assert save(tmp_path, Bench({"models": {}})).name == "bench.json"


def test_one_run_given_twice_is_refused_before_anything_is_written(tmp_path):
    """Issue 52: `report A A --out X` listed the same run twice, compared with itself."""
    run = make_run(tmp_path / "run")
    (tmp_path / "alias").symlink_to(run)
    for again in (run, tmp_path / "alias", tmp_path / "x" / ".." / "run"):
        with pytest.raises(DistilleryError, match="give each run once"):
            merge_runs([run, make_run(tmp_path / "other", method="cmow"), again], tmp_path / "merged")
    assert not (tmp_path / "merged").exists()


def test_a_student_below_the_static_baseline_says_so_in_the_reports_first_lines_and_the_card(tmp_path):
    """Issue 53: a student scoring under the static-embedding baseline was told so only in the verdict's last
    section. The report's first lines say it (compress prints the report), and so does the card's verdict."""
    def run_with_static(name, static):
        run = _with_metrics(make_run(tmp_path / name), baselines={STATIC_NAME: {"accuracy": static}},
                            others={"student-onnx-int8": {"accuracy": 0.849}, "teacher-onnx": {"accuracy": 0.873}})
        return run, write_report(run).read_text().splitlines()

    run, lines = run_with_static("below", 0.86)  # student 0.835, its int8 export 0.849 (the teacher's export: no)
    assert lines[2].startswith("**The student learned less than the free static-embedding baseline: accuracy 0.849 "
                               "(student-onnx-int8) against 0.860 for static-embeddings on the same dev set.")
    from distillery.report import load_run, run_rows

    card_verdict = rp.verdict_paragraphs(load_run(run), run_rows(load_run(run)), "accuracy", "1×128", "256×64")
    assert any("learned less than the free static-embedding baseline" in p for p in card_verdict)
    _, lines = run_with_static("above", 0.84)  # the int8 export beats it: nothing to say
    assert not any("learned less than the free static-embedding" in line for line in lines)
