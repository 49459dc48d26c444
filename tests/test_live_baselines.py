"""Live baselines (issue 29): the static-embedding model against a slow obvious reference, on every
encoder family, scored by evaluation.score and timed by bench.benchmark; the int8 teacher; the report's
rows and verdict; and no measured score or speed-up left as a constant in src/."""

import ast
import random
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from distillery import live_baselines as lb
from distillery.bench import benchmark
from distillery.config import DataConfig
from distillery.data.encode import prepare_task_data
from distillery.data.loading import column_values, task_for
from distillery.data.tasks import get_task
from distillery.errors import DistilleryError
from distillery.evaluation import predict, score
from distillery.static.vectors import token_vectors

POS, NEG, MID = ["good", "great", "fun"], ["bad", "awful", "boring"], ["okay", "fine", "average"]
FILL = ["the", "movie", "film", "plot", "was", "very", "really", "actor"]
SRC = Path(__file__).resolve().parents[1] / "src" / "distillery"


def _sentence(rng, words):
    out = rng.sample(FILL, 3) + [rng.choice(words)]
    rng.shuffle(out)
    return " ".join(out)


def _write_data(root, n_train=60, n_dev=20, seed=0):
    """SST-2 and STS-B in the GLUE layout, and a three-class custom CSV."""
    rng = random.Random(seed)
    sst, sts = root / "glue" / "SST-2", root / "glue" / "STS-B"
    sst.mkdir(parents=True)
    sts.mkdir(parents=True)
    header = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore"
    for name, n in (("train", n_train), ("dev", n_dev)):
        rows = ["sentence\tlabel"] + [f"{_sentence(rng, POS if i % 2 else NEG)}\t{i % 2}" for i in range(n)]
        (sst / f"{name}.tsv").write_text("\n".join(rows) + "\n")
        pairs = [header]
        for i in range(n):
            value = round(rng.uniform(0, 5), 2)
            pairs.append(f"{i}\tmain\tf\t2012\t{i}\ts\ts\t{_sentence(rng, POS)}\t{_sentence(rng, POS if value > 2.5 else NEG)}\t{value}")
        (sts / f"{name}.tsv").write_text("\n".join(pairs) + "\n")
        labels = ["pos", "neg", "mid"]
        lines = ["text,label"] + [f"{_sentence(rng, (POS, NEG, MID)[i % 3])},{labels[i % 3]}" for i in range(n)]
        (root / f"custom_{name}.csv").write_text("\n".join(lines) + "\n")
    return root


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return _write_data(tmp_path_factory.mktemp("data"))


def _task_data(task, tokenizer, data_dir):
    if task == "custom":
        cfg = DataConfig(task="custom", train_file=str(data_dir / "custom_train.csv"),
                         dev_file=str(data_dir / "custom_dev.csv"), max_length=32)
    else:
        cfg = DataConfig(task=task, data_dir=str(data_dir), max_length=32)
    return prepare_task_data(task_for(cfg), tokenizer, cfg)


def _teacher(folder, task_data):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    task = task_data.task if hasattr(task_data, "task") else task_data
    labels = 1 if task.kind == "regression" else task.num_labels
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(folder, num_labels=labels)
    model.config.architectures = [type(model).__name__]  # as a fine-tuned teacher's saved config says (exports read it)
    return model.eval(), AutoTokenizer.from_pretrained(folder)


def _setup(folder, task, data_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    task_data = _task_data(task, tokenizer, data_dir)
    teacher, _ = _teacher(folder, task_data)
    return teacher, tokenizer, task_data


def _reference_features(model, ids, types, tokenizer, pair):
    """The slow obvious way: per example, the mean of its non-special tokens' vectors, normalised."""
    special = set(tokenizer.all_special_ids) - {tokenizer.unk_token_id}
    table = model.embeddings.weight

    def mean(token_ids):
        kept = [t for t in token_ids if t not in special]
        v = table[kept].mean(0) if kept else torch.zeros(table.shape[1])
        return F.normalize(v, dim=0)

    if not pair:
        return mean(ids)
    first_sep = ids.index(tokenizer.sep_token_id)
    a_ids = [t for t, k in zip(ids, types) if k == 0] if any(types) else ids[: first_sep + 1]
    b_ids = [t for t, k in zip(ids, types) if k == 1] if any(types) else ids[first_sep + 1:]
    a, b = mean(a_ids), mean(b_ids)
    return torch.cat([a, b, (a - b).abs(), a * b])


def _reference_matrix(model, task_data, tokenizer):
    ids = column_values(task_data.dev, "input_ids")
    names = task_data.dev.column_names
    types = column_values(task_data.dev, "token_type_ids") if "token_type_ids" in names else [[0] * len(i) for i in ids]
    rows = [_reference_features(model, list(i), list(t), tokenizer, task_data.task.is_pair) for i, t in zip(ids, types)]
    return torch.stack(rows).double().numpy()


# --------------------------------------------------------------------------------------------
# The static-embedding model


def test_static_logits_match_the_slow_reference(tiny_family, data_dir):
    teacher, tokenizer, task_data = _setup(tiny_family("bert"), "sst2", data_dir)
    model = lb.static_embedding_baseline(teacher, tokenizer, task_data, pca_dims=8, sif=1e-3)
    logits = torch.from_numpy(predict(model, task_data))  # (N, 2)
    decision = model.sklearn_head.decision_function(_reference_matrix(model, task_data, tokenizer))  # (N,)
    torch.testing.assert_close(logits[:, 1] - logits[:, 0], torch.from_numpy(decision).float(), atol=1e-4, rtol=1e-4)
    assert model.config.dim == 8 and model.embeddings.weight.shape[1] == 8
    assert type(model.sklearn_head[-1]).__name__ == "LogisticRegression"


def test_three_classes_keep_every_logit(tiny_family, data_dir):
    teacher, tokenizer, task_data = _setup(tiny_family("bert"), "custom", data_dir)
    model = lb.static_embedding_baseline(teacher, tokenizer, task_data, pca_dims=None, sif=None)
    logits = torch.from_numpy(predict(model, task_data))  # (N, 3)
    decision = model.sklearn_head.decision_function(_reference_matrix(model, task_data, tokenizer))  # (N, 3)
    torch.testing.assert_close(logits, torch.from_numpy(decision).float(), atol=1e-4, rtol=1e-4)
    assert "accuracy" in score(model, task_data)


def test_regression_pair_task_gets_ridge_on_both_sentences(tiny_family, data_dir):
    teacher, tokenizer, task_data = _setup(tiny_family("bert"), "stsb", data_dir)
    model = lb.static_embedding_baseline(teacher, tokenizer, task_data, pca_dims=6)
    assert type(model.sklearn_head[-1]).__name__ == "Ridge" and model.config.head == "ridge"
    scores = torch.from_numpy(predict(model, task_data))  # (N,)
    expected = model.sklearn_head.predict(_reference_matrix(model, task_data, tokenizer))
    torch.testing.assert_close(scores, torch.from_numpy(expected).float(), atol=1e-4, rtol=1e-4)
    assert model.head.in_features == 4 * 6
    assert set(score(model, task_data)) >= {"pearson", "spearman"}


@pytest.mark.parametrize("family", ["bert", "roberta", "mpnet", "deberta-v2", "distilbert", "albert", "electra",
                                    "xlm-roberta", "modernbert"])
def test_every_family(tiny_family, data_dir, family):
    teacher, tokenizer, task_data = _setup(tiny_family(family, num_layers=2), "sst2", data_dir)
    vectors = token_vectors(teacher, tokenizer, batch_size=64)  # several batches: the order must hold
    word = next(w for w in POS + NEG + FILL if len(tokenizer(w, add_special_tokens=False)["input_ids"]) == 1)
    inputs = tokenizer(word, return_tensors="pt")
    with torch.inference_mode():
        expected = teacher(**inputs, output_hidden_states=True).hidden_states[-1].mean(1)[0]  # (H,)
    torch.testing.assert_close(vectors[tokenizer(word, add_special_tokens=False)["input_ids"][0]], expected,
                               atol=1e-5, rtol=1e-4)
    model = lb.static_embedding_baseline(teacher, tokenizer, task_data, pca_dims=4)
    logits = predict(model, task_data)
    decision = model.sklearn_head.decision_function(_reference_matrix(model, task_data, tokenizer))
    np.testing.assert_allclose(logits[:, 1] - logits[:, 0], decision, atol=1e-4, rtol=1e-4)


def test_the_static_model_is_benchmarked_beside_the_teacher(tiny_family, data_dir):
    teacher, tokenizer, task_data = _setup(tiny_family("bert", num_layers=2), "sst2", data_dir)
    model = lb.static_embedding_baseline(teacher, tokenizer, task_data, pca_dims=8)
    record = benchmark({"teacher": teacher, lb.STATIC_NAME: model}, latency_shape=(1, 16), throughput_shape=(4, 16),
                       latency_runs=2, warmup=1, throughput_runs=1)
    static = record["models"][lb.STATIC_NAME]
    # a lookup and a mean cost no FLOPs; the head does
    assert 0 < static["flops_per_token"] < record["models"]["teacher"]["flops_per_token"]
    assert static["params"] == model.embeddings.weight.numel() + model.head.weight.numel() + model.head.bias.numel()
    assert record["speedups"][lb.STATIC_NAME]["latency"] > 0


def test_bad_inputs_are_refused_with_a_sentence(tiny_family, data_dir):
    teacher, tokenizer, task_data = _setup(tiny_family("bert", num_layers=2), "sst2", data_dir)
    squad = SimpleNamespace(task=get_task("squad"), train=task_data.train, dev=task_data.dev)
    with pytest.raises(DistilleryError, match="not task squad .question-answering.: a bag of token vectors has no answer"):
        lb.static_embedding_baseline(teacher, tokenizer, squad)
    with pytest.raises(DistilleryError, match="pca_dims"):
        lb.static_embedding_baseline(teacher, tokenizer, task_data, pca_dims=0)
    with pytest.raises(DistilleryError, match="sif"):
        lb.static_embedding_baseline(teacher, tokenizer, task_data, sif=2.0)


# --------------------------------------------------------------------------------------------
# Both baselines


def test_live_baselines_are_scored_and_benchmarked(tiny_family, data_dir):
    teacher, tokenizer, task_data = _setup(tiny_family("bert", num_layers=2), "sst2", data_dir)
    baselines = lb.live_baselines(teacher, tokenizer, task_data, int8_format="torch-int8", pca_dims=8)
    assert set(baselines) == {lb.INT8_NAME, lb.STATIC_NAME}
    for name, (model, metrics) in baselines.items():
        assert metrics == pytest.approx(score(model, task_data)), name
    assert baselines.info[lb.INT8_NAME]["format"] == "torch-int8"
    record = benchmark({"teacher": teacher, **{n: m for n, (m, _) in baselines.items()}}, latency_shape=(1, 16),
                       throughput_shape=(4, 16), latency_runs=2, warmup=1, throughput_runs=1)
    assert set(record["speedups"]) == {lb.INT8_NAME, lb.STATIC_NAME}


def test_squad_gets_the_int8_teacher_only_with_a_note(monkeypatch):
    monkeypatch.setattr(lb, "_int8_baseline", lambda *args: None)
    squad = SimpleNamespace(task=get_task("squad"), dev=object(), train=None)
    baselines = lb.live_baselines(None, None, squad)
    assert lb.STATIC_NAME not in baselines
    assert any("No static-embedding baseline on squad (question-answering)" in note for note in baselines.notes)


# --------------------------------------------------------------------------------------------
# No measured number in src/

# A measured dev score or speed-up, as code would carry it: a float literal that is the value of a
# dict key, a name, a keyword or a default whose name speaks of a score or a speed (accuracy, f1, mcc,
# pearson, spearman, score, metric, speedup, latency, throughput), other than 0.0 and 1.0 (the
# teacher against itself, an empty score); a whole number other than 0 and 1 under a name of a metric
# or a speed-up (accuracy, f1, mcc, pearson, spearman, speedup: not "latency_runs = 30"); or, in any
# string literal but a docstring, a speed-up written out ("190×", "2.83x faster"; not a shape "1×128" nor
# a range of factors "1-3x") or a score with three decimals ("0.849").
MEASURED_NAME = re.compile(r"accuracy|(^|_)f1|mcc|pearson|spearman|score|metric|speed_?up|latency|throughput", re.I)
WHOLE_MEASURE_NAME = re.compile(r"accuracy|(^|_)f1|mcc|pearson|spearman|speed_?up", re.I)
MEASURED_TEXT = re.compile(r"(?<![\w.])\d+(\.\d+)?\s?(×(?!\d)|x(?=\s+(faster|slower|speed)))|(?<![\w.])0\.\d{3}(?!\d)")


def _is_measure(node, whole: bool) -> bool:
    kinds = (float, int) if whole else (float,)
    if isinstance(node, ast.UnaryOp):
        return _is_measure(node.operand, whole)
    return (isinstance(node, ast.Constant) and type(node.value) in kinds and node.value not in (0, 1))


def _named_floats(tree):
    for node in ast.walk(tree):
        pairs = []
        if isinstance(node, ast.Dict):
            pairs = [(k.value, v) for k, v in zip(node.keys, node.values) if isinstance(k, ast.Constant) and isinstance(k.value, str)]
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            pairs = [(t.id, node.value) for t in targets if isinstance(t, ast.Name) and node.value is not None]
        elif isinstance(node, ast.keyword) and node.arg:
            pairs = [(node.arg, node.value)]
        elif isinstance(node, ast.arguments):
            positional = node.posonlyargs + node.args
            pairs = list(zip([a.arg for a in positional[len(positional) - len(node.defaults):]], node.defaults))
            pairs += [(a.arg, d) for a, d in zip(node.kwonlyargs, node.kw_defaults) if d is not None]
        for name, value in pairs:
            if MEASURED_NAME.search(name) and _is_measure(value, whole=bool(WHOLE_MEASURE_NAME.search(name))):
                yield node.lineno if hasattr(node, "lineno") else value.lineno, f"{name} = {ast.unparse(value)}"


def _texts(tree):
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                  and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            for m in MEASURED_TEXT.finditer(node.value):
                yield node.lineno, f"text {m.group(0)!r} in {node.value[:60]!r}"


def hard_coded_measurements(root: Path = SRC) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        found += [f"{path.relative_to(root)}:{line}: {what}" for line, what in [*_named_floats(tree), *_texts(tree)]]
    return found


def test_the_rule_catches_a_measurement(tmp_path):
    (tmp_path / "m.py").write_text('POINTS = ({"accuracy": 0.849, "latency_speedup": 2.83},)\n'
                                   'TEACHER_ACCURACY = 0.873\n'
                                   'def f(min_speedup=1.5):\n    return f"about 190× faster ({0.740})" + " 2.83x faster"\n'
                                   'OK = {"accuracy": 1.0, "lr": 0.001, "speedup": None, "latency_runs": 30}\n'
                                   'M2V_SPEEDUP = 190\n'
                                   'HELP = "lr times 1-3x, shapes 1×128 and 256x64"\n'
                                   'def g():\n    """A docstring may quote 0.873 and 2.83× from a paper."""\n')
    found = hard_coded_measurements(tmp_path)
    # accuracy, latency_speedup, TEACHER_ACCURACY, min_speedup, M2V_SPEEDUP, 190×, 2.83x
    assert len(found) == 7, found
    assert not any("lr" in f or "runs" in f or "docstring" in f for f in found)


def test_no_hard_coded_dev_score_or_speedup_in_src():
    assert hard_coded_measurements() == []


def test_a_distillery_student_is_a_teacher_like_any_other(tiny_family, data_dir):
    """A MoEBERT student runs its own routing in its forward: its token vectors come from the whole model.
    One expert holding every neuron is the teacher again, so its vectors are the teacher's."""
    from distillery.encoders import ffn_width, layout_of
    from distillery.moebert.convert import convert, dense_ffns

    teacher, tokenizer, task_data = _setup(tiny_family("bert", num_layers=2), "sst2", data_dir)
    d_h = ffn_width(layout_of(teacher.config), teacher.config)
    importance = torch.rand(len(dense_ffns(teacher)), d_h, generator=torch.Generator().manual_seed(1))
    same = convert(teacher, importance, num_experts=1, expert_size=d_h, shared_size=8).eval()
    torch.testing.assert_close(token_vectors(same, tokenizer), token_vectors(teacher, tokenizer))
    student = convert(teacher, importance, num_experts=2, expert_size=d_h // 2, shared_size=8).eval()
    model = lb.static_embedding_baseline(student, tokenizer, task_data, pca_dims=4)
    assert "accuracy" in score(model, task_data)


def test_an_int8_export_the_run_already_made_is_reused(monkeypatch):
    monkeypatch.setattr(lb, "_int8_baseline", lambda *args: pytest.fail("exported again"))
    given = torch.nn.Linear(1, 1)
    baselines = lb.live_baselines(None, None, SimpleNamespace(dev=object()), teacher_int8=(given, {"accuracy": 0.5}),
                                  static=False)
    assert baselines[lb.INT8_NAME] == (given, {"accuracy": 0.5})
