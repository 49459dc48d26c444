"""Issue 39: the student's text beyond the train split: TinyBERT's augmentation (masked LM and embedding
neighbours), unlabeled rows from --unlabeled-file, all labelled by the teacher, cached and resumable."""

import json

import numpy as np
import pytest
import torch

from distillery.config import cache_root
from distillery.data import augment as augment_module
from distillery.data.augment import WordSource, augment_texts, augmented_rows
from distillery.data.loading import load_unlabeled
from distillery.data.tasks import get_task
from distillery.errors import DistilleryError
from distillery.pipeline import build_run_config, compress
from tests.helpers import tiny_config

TEXTS = ["The movie was very good!", "a boring plot, 3 actors", "what a great film"]


@pytest.fixture(scope="module")
def sources(tiny_bert):
    from transformers import AutoTokenizer, BertConfig, BertForMaskedLM, BertModel

    tokenizer = AutoTokenizer.from_pretrained(tiny_bert)
    embeddings = BertModel.from_pretrained(tiny_bert).get_input_embeddings().weight
    torch.manual_seed(0)
    mlm = BertForMaskedLM(BertConfig.from_pretrained(tiny_bert)).eval()
    return {"neighbours": WordSource("neighbours", tokenizer, embeddings),
            "mlm": WordSource("mlm", tokenizer, mlm.get_input_embeddings().weight, mlm)}


def test_a_word_on_both_sides_of_a_pair_is_replaced_the_same_way(sources):
    """A paraphrase or entailment pair rests on the words its sides share: one draw per distinct word."""
    from distillery.data.augment import augment_pairs

    pairs = augment_pairs(["The movie was good", "a great film"], ["The movie was not good", "the FILM is great"],
                          sources["neighbours"], 8, np.random.default_rng(0))
    for (a0, b0), versions in zip([("The movie was good", "The movie was not good"), ("a great film", "the FILM is great")],
                                  pairs):
        assert len(versions) == 8 and any(v != (a0, b0) for v in versions)
        for a, b in versions:
            wa, wb = augment_module.WORD.findall(a), augment_module.WORD.findall(b)
            ka, kb = augment_module.WORD.findall(a0), augment_module.WORD.findall(b0)
            new_a = {x.lower(): y.lower() for x, y in zip(ka, wa)}
            new_b = {x.lower(): y.lower() for x, y in zip(kb, wb)}
            assert all(new_a[w] == new_b[w] for w in new_a.keys() & new_b.keys()), (a, b)


@pytest.mark.parametrize("kind", ["neighbours", "mlm"])
def test_augmentation_is_deterministic_and_replaces_words_by_other_whole_words(kind, sources):
    source = sources[kind]
    first = augment_texts(TEXTS, source, 6, np.random.default_rng(1))
    assert first == augment_texts(TEXTS, source, 6, np.random.default_rng(1))
    assert first != augment_texts(TEXTS, source, 6, np.random.default_rng(2))
    assert [len(v) for v in first] == [6, 6, 6]
    changed = [v for versions, t in zip(first, TEXTS) for v in versions if v != t]
    assert changed, "p_t = 0.4 replaces some word in 18 versions"
    for versions, text in zip(first, TEXTS):
        for version in versions:  # punctuation and numbers stay where they were
            assert [c for c in version if not c.isalpha() and c != " "] == [c for c in text if not c.isalpha() and c != " "]
    vocabulary = {w.lower() for w in source.words}
    for versions, text in zip(first, TEXTS):
        originals = set(augment_module.WORD.findall(text))
        for version in versions:
            new = [w for w in augment_module.WORD.findall(version) if w not in originals]
            assert all(w.lower() in vocabulary and not w.startswith("#") for w in new)


def test_neighbours_never_propose_the_word_itself(sources):
    table = sources["neighbours"].neighbours(["movie", "good", "Paris"], 5)
    assert all(word.lower() not in {c.lower() for c in cands} for word, cands in table.items())
    assert all(len(cands) == 5 for cands in table.values())


def test_pair_sides_stay_aligned_and_carry_no_label(sources, tmp_path):
    pairs = ["paris is a city", "the river was born", "who is the actor"]
    rows = augmented_rows(TEXTS, pairs, sources["mlm"], 4, seed=3, cache=tmp_path)
    assert set(rows) == {"text", "text_pair"}  # no label: the teacher labels every new example
    assert len(rows["text"]) == len(rows["text_pair"]) == 12
    for i, (a, b) in enumerate(zip(rows["text"], rows["text_pair"])):  # row i is original i // 4, both sides
        original = i // 4
        assert len(augment_module.WORD.findall(a)) == len(augment_module.WORD.findall(TEXTS[original]))
        assert len(augment_module.WORD.findall(b)) == len(augment_module.WORD.findall(pairs[original]))


def test_augmented_text_is_cached_by_content_and_a_killed_run_keeps_its_parts(sources, tmp_path, monkeypatch):
    texts = [f"the movie was good {i}" for i in range(5)]
    monkeypatch.setattr(augment_module, "PART", 2)
    calls = []
    real = augment_module.augment_texts

    def counted(chunk, *args, **kwargs):
        calls.append(len(chunk))
        if len(calls) == 2:
            raise KeyboardInterrupt  # killed while augmenting its second part
        return real(chunk, *args, **kwargs)

    monkeypatch.setattr(augment_module, "augment_texts", counted)
    with pytest.raises(KeyboardInterrupt):
        augmented_rows(texts, None, sources["neighbours"], 3, seed=0, cache=tmp_path)
    calls.clear()
    calls.append(-1)  # no second kill
    monkeypatch.setattr(augment_module, "augment_texts", lambda chunk, *a, **k: (calls.append(len(chunk)), real(chunk, *a, **k))[1])
    resumed = augmented_rows(texts, None, sources["neighbours"], 3, seed=0, cache=tmp_path)
    assert calls == [-1, 2, 1], "the resumed run augments the parts the kill left, not the first again"
    calls.clear()
    again = augmented_rows(texts, None, sources["neighbours"], 3, seed=0, cache=tmp_path)
    assert calls == [] and again == resumed
    monkeypatch.setattr(augment_module, "augment_texts", real)
    assert augmented_rows(texts, None, sources["neighbours"], 3, seed=0, cache=tmp_path / "fresh") == resumed


# -- --unlabeled-file ------------------------------------------------------------------------------


@pytest.mark.parametrize("name, body", [
    ("u.csv", 'text,other\n"good, very good",1\nbad film,2\n'),
    ("u.tsv", "text\tother\ngood, very good\t1\nbad film\t2\n"),
    ("u.jsonl", '{"text": "good, very good"}\n{"text": "bad film", "other": 2}\n'),
])
def test_unlabeled_file_formats(name, body, tmp_path):
    path = tmp_path / name
    path.write_text(body)
    rows = load_unlabeled(path, get_task("sst2"))
    assert rows.column_names == ["text"] and rows["text"][:] == ["good, very good", "bad film"]


def test_unlabeled_pairs_read_both_sides(tmp_path):
    path = tmp_path / "u.jsonl"
    path.write_text('{"text": "a city", "text_pair": "paris"}\n')
    rows = load_unlabeled(path, get_task("mrpc"))
    assert rows[0] == {"text": "a city", "text_pair": "paris"}


@pytest.mark.parametrize("name, body, fragment", [
    ("empty.csv", b"", "is empty"),
    ("columns.csv", b"review\ngood\n", "has no column 'sentence' or 'text' .what task sst2 reads its texts from.; "
                                         "its columns are review"),
    ("binary.csv", bytes(range(256)) * 4, "not UTF-8"),
])
def test_bad_unlabeled_files_are_one_sentence(name, body, fragment, tmp_path):
    path = tmp_path / name
    path.write_bytes(body)
    with pytest.raises(DistilleryError, match=fragment) as caught:
        load_unlabeled(path, get_task("sst2"))
    assert "\n" not in str(caught.value)


def test_an_unlabeled_file_in_the_tasks_own_columns_or_text_and_text_pair(tmp_path):
    """Issue 52: a custom pair task read with --text-column text_a --text-pair-column text_b refused the transfer set
    (text, text_pair) as --unlabeled-file: "has no column 'text_a'". Its own columns first, then text and text_pair."""
    from distillery.config import DataConfig
    from distillery.data.loading import custom_task

    train = tmp_path / "train.csv"
    train.write_text("text_a,text_b,label\na cat,a dog,0\na cat,a cat,1\n")
    task = custom_task(DataConfig(task="custom", train_file=str(train), text_column="text_a",
                                  text_pair_column="text_b"))
    transfer, own, both = tmp_path / "transfer.jsonl", tmp_path / "own.csv", tmp_path / "both.csv"
    transfer.write_text('{"text": "a city", "text_pair": "paris"}\n')
    own.write_text("text_b,text_a\nparis,a city\n")
    both.write_text("text,text_pair,text_a,text_b\nno,no,a city,paris\n")
    for path in (transfer, own, both):  # the task's own columns win where the file has both
        assert load_unlabeled(path, task)[0] == {"text": "a city", "text_pair": "paris"}
    glue = tmp_path / "rte.tsv"  # a GLUE file's own header
    glue.write_text("index\tsentence1\tsentence2\tlabel\n0\ta city\tparis\tentailment\n")
    assert load_unlabeled(glue, get_task("rte"))[0] == {"text": "a city", "text_pair": "paris"}
    half = tmp_path / "half.csv"
    half.write_text("text_a,text\na city,paris\n")
    with pytest.raises(DistilleryError, match=r"half.csv has no columns 'text_a' and 'text_b' or 'text' and "
                                              r"'text_pair' \(what task custom reads its texts from\)"):
        load_unlabeled(half, task)


def test_a_pair_file_is_refused_for_a_single_sentence_task(tmp_path):
    """Issue 52: its text_pair column was dropped without a word."""
    path = tmp_path / "pairs.jsonl"
    path.write_text('{"text": "a city", "text_pair": "paris"}\n')
    with pytest.raises(DistilleryError, match=r"pairs.jsonl has a column 'text_pair' .* task sst2 classifies one text"):
        load_unlabeled(path, get_task("sst2"))


def test_unlabeled_file_must_be_a_regular_file(tmp_path):
    with pytest.raises(DistilleryError, match="--unlabeled-file .* is a folder"):
        load_unlabeled(tmp_path, get_task("sst2"))


# -- the student's text in a run -------------------------------------------------------------------


def test_a_run_trains_on_augmented_and_unlabeled_rows_labelled_by_the_teacher(tiny_bert, glue_dir, tmp_path,
                                                                                monkeypatch):
    from distillery import method_context as recipe

    unlabeled = tmp_path / "u.csv"
    unlabeled.write_text("text\nthe plot was fun\nawful actor\nthe film\n")
    seen = {}
    real = recipe.label_new_rows

    def spy(train, originals, kind):
        out = real(train, originals, kind)
        seen["train"], seen["originals"] = out, originals
        return out

    monkeypatch.setattr(recipe, "label_new_rows", spy)
    settings = {"method_options.augment": 2, "data.unlabeled_file": str(unlabeled), "data.train_limit": 24}
    out = compress(tiny_config(tiny_bert, glue_dir, tmp_path / "a", **settings))
    train, n = seen["train"], seen["originals"]
    assert len(train) == n + 2 * n + 3
    logits = np.asarray(train["teacher_logits"][:])
    labels = np.asarray(train["labels"][:])
    assert (labels[n:] == logits[n:].argmax(-1)).all(), "a new row's label is the teacher's, never an original's"
    record = json.loads((out / "train.json").read_text())["student_text"]
    assert record["labelled"] == n and record["augmented"] == 2 * n and record["unlabeled"] == 3
    assert record["augment_source"] == "nearest neighbours in the teacher's input embeddings"
    assert record["labelling_seconds"] > 0
    report = (out / "report.md").read_text()
    assert f"{2 * n} augmented" in report and "3 unlabeled" in report
    assert "3 unlabeled" in (out / "student" / "README.md").read_text()

    # a second run reads the augmented text and the teacher's logits from the caches
    monkeypatch.setattr(augment_module, "augment_texts", lambda *a, **k: pytest.fail("augmented again"))
    out = compress(tiny_config(tiny_bert, glue_dir, tmp_path / "b", **settings))
    assert json.loads((out / "train.json").read_text())["student_text"]["labelling_seconds"] == 0.0
    assert any((cache_root() / "augment").iterdir())


def test_augmentation_on_a_pair_regression_task_and_moebert(tiny_bert, glue_dir, tmp_path):
    out = compress(tiny_config(tiny_bert, glue_dir, tmp_path / "m", task="stsb", method="moebert",
                               **{"method_options.augment": 1, "data.train_limit": 16}))
    record = json.loads((out / "train.json").read_text())["student_text"]
    assert record["augmented"] == record["labelled"]


def test_killed_during_augmentation_resumes_without_augmenting_again(tiny_bert, glue_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(augment_module, "PART", 8)
    real, calls = augment_module.augment_texts, []

    def killed(chunk, *args, **kwargs):
        calls.append(len(chunk))
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(chunk, *args, **kwargs)

    monkeypatch.setattr(augment_module, "augment_texts", killed)
    config = tiny_config(tiny_bert, glue_dir, tmp_path / "cut", **{"method_options.augment": 1})
    with pytest.raises(KeyboardInterrupt):
        compress(config)
    calls.clear()
    monkeypatch.setattr(augment_module, "augment_texts", lambda chunk, *a, **k: (calls.append(len(chunk)), real(chunk, *a, **k))[1])
    out = compress(build_run_config(out=str(tmp_path / "cut")), resume=True)
    record = json.loads((out / "train.json").read_text())["student_text"]
    assert record["augmented"] == record["labelled"] == 8 * (len(calls) + 1), \
        "the part written before the kill is read, only the others are augmented"


def test_augment_and_unlabeled_file_refuse_squad(tiny_bert, tmp_path):
    from distillery.method_context import extra_rows

    class Ctx:
        config = build_run_config(task="squad")
    from types import SimpleNamespace

    with pytest.raises(DistilleryError, match="SQuAD"):
        extra_rows(Ctx(), SimpleNamespace(task=get_task("squad")), 2)


@pytest.mark.parametrize("given, fragment", [
    ({"method_options.augment": 2}, "drop --augment for task squad"),
    ({"data.unlabeled_file": "more.jsonl"}, "drop --unlabeled-file for task squad"),
    ({"method_options.augment": 2, "data.unlabeled_file": "more.jsonl"}, "drop --augment and --unlabeled-file"),
])
@pytest.mark.parametrize("method", ["distill", "cmow"])
def test_augment_on_squad_is_refused_as_the_settings_are_read(given, fragment, method):
    """Issue 52: --augment 2 on SQuAD was recorded in the report and never used (the methods train SQuAD students on
    its own examples only): refused as --unlabeled-file is, before anything is loaded."""
    with pytest.raises(DistilleryError, match=fragment) as caught:
        build_run_config(method=method, task="squad", overrides=given)
    assert "\n" not in str(caught.value)
    # the full budget's augmentation (N = 20) is for sentence tasks: a SQuAD run's settings do not claim it
    assert "augment" not in build_run_config(method=method, task="squad", budget="full").method_options
    assert build_run_config(method=method, task="sst2", budget="full").method_options["augment"] == 20


def test_a_squad_config_given_whole_with_augment_is_refused_before_the_run(tiny_bert, tmp_path, monkeypatch):
    from distillery import pipeline
    from distillery.config import RunConfig

    monkeypatch.setattr(pipeline, "_run", lambda *a, **k: pytest.fail("the run started"))
    config = RunConfig.from_dict({"data": {"task": "squad"}, "teacher": {"name": str(tiny_bert)},
                                  "method_options": {"augment": 2}, "out": str(tmp_path / "run")})
    with pytest.raises(DistilleryError, match="drop --augment for task squad"):
        compress(config)
    assert not (tmp_path / "run").exists()


def test_the_source_is_augment_model_else_the_teachers_mlm_head_else_its_embeddings(tiny_bert, tmp_path):
    from types import SimpleNamespace

    from transformers import AutoTokenizer, BertConfig, BertForMaskedLM, BertModel

    from distillery.method_context import augment_source

    tokenizer = AutoTokenizer.from_pretrained(tiny_bert)
    mlm_folder = tmp_path / "mlm"
    BertForMaskedLM(BertConfig.from_pretrained(tiny_bert)).save_pretrained(mlm_folder)
    tokenizer.save_pretrained(mlm_folder)
    teacher = BertModel.from_pretrained(tiny_bert)

    def ctx(teacher_name, augment_model=None):
        config = SimpleNamespace(data=SimpleNamespace(augment_model=augment_model),
                                 teacher=SimpleNamespace(name=str(teacher_name)))
        return SimpleNamespace(config=config, tokenizer=tokenizer, teacher=teacher)

    assert augment_source(ctx(tiny_bert, str(mlm_folder))).mlm is not None
    assert augment_source(ctx(mlm_folder)).name == "the teacher's own MLM head"
    neighbours = augment_source(ctx(tiny_bert))
    assert neighbours.mlm is None and "input embeddings" in neighbours.name
    with pytest.raises(DistilleryError, match="--augment-model .* is not a masked language model"):
        augment_source(ctx(tiny_bert, str(tmp_path / "missing")))


def test_auto_gives_augment_to_every_candidate_and_the_cli_has_the_flags(monkeypatch, capsys):
    from distillery.auto import route_options
    from tests.helpers import run_cli

    assert all(options == {"augment": 5} for options in route_options({"augment": 5}, "classification").values())
    code, out, _ = run_cli(monkeypatch, capsys, "compress", "--help")
    assert "--unlabeled-file" in out and "--augment-model" in out and "--augment" in out


@pytest.mark.parametrize("method, options", [
    ("cmow", {"method_options.matrix_dim": 4, "method_options.vector_dim": 16}),
    ("autotinybert", {"method_options.supernet_steps": 3, "method_options.latency_archs": 8,
                      "method_options.latency_runs": 1, "method_options.generations": 1, "method_options.population": 2,
                      "method_options.proxy_examples": 16, "method_options.budget_floor": 0}),
])
def test_cmow_and_autotinybert_train_on_the_augmented_text(method, options, tiny_bert, glue_dir, tmp_path, monkeypatch):
    from distillery.method_context import MethodContext
    from tests.helpers import flop_timed

    flop_timed(monkeypatch)
    asked, real = [], MethodContext.distillation_train

    def spy(self, whole_split, augment=0, logits=True):
        asked.append((whole_split, augment))
        return real(self, whole_split, augment, logits)

    monkeypatch.setattr(MethodContext, "distillation_train", spy)
    out = compress(tiny_config(tiny_bert, glue_dir, tmp_path / method, method=method,
                               **{"method_options.augment": 1, **options}))
    # autotinybert: the super-net's task phase and the further training, on the same (cached) text
    assert asked == ([(True, 1), (True, 1)] if method == "autotinybert" else [(True, 1)])
    record = json.loads((out / "train.json").read_text())["student_text"]
    assert record["augmented"] == record["labelled"] > 0


def test_a_bad_unlabeled_file_is_refused_before_the_teacher_trains(tiny_bert, glue_dir, tmp_path, monkeypatch, capsys):
    from distillery import pipeline
    from tests.helpers import assert_one_line_error, run_cli

    monkeypatch.setattr(pipeline, "_run", lambda *a, **k: pytest.fail("the run started"))
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    code, _, err = run_cli(monkeypatch, capsys, "compress", "--teacher", str(tiny_bert), "--data-dir", str(glue_dir),
                           "--out", str(tmp_path / "run"), "--unlabeled-file", str(empty))
    assert_one_line_error(code, err, "is empty")


def test_a_damaged_cached_part_is_augmented_again(sources, tmp_path):
    first = augmented_rows(TEXTS, None, sources["neighbours"], 2, seed=0, cache=tmp_path)
    (part,) = list(tmp_path.glob("*/part-*.json"))
    part.write_text('[["only one row"]]')
    assert augmented_rows(TEXTS, None, sources["neighbours"], 2, seed=0, cache=tmp_path) == first


def test_a_vocabulary_without_whole_words_is_one_sentence(tiny_roberta):
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_roberta)  # byte-level BPE without merges: bytes only
    embeddings = AutoModel.from_pretrained(tiny_roberta).get_input_embeddings().weight
    with pytest.raises(DistilleryError, match="no whole words in its vocabulary; give a masked LM"):
        WordSource("the teacher's input embeddings", tokenizer, embeddings)
