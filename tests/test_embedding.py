"""Issue 55: the embedding task kind. An embedder (a tiny sentence-transformers folder built from a tiny random BERT)
is distilled into a smaller embedder, by layer drop and into a pretrained student with another tokenizer; the
student folder loads in sentence-transformers, in a fresh process without distillery, and gives the vectors
distillery scored; bad input is one sentence. Same seed, same embedder, and a killed run resumed bitwise:
tests/test_reproducible.py."""

from __future__ import annotations

import json

import numpy as np
import pytest

from distillery.config import RunConfig
from distillery.data.encode import prepare_task_data
from distillery.data.loading import task_for
from distillery.errors import DistilleryError
from distillery.kinds import kind_of
from distillery.metrics import retrieval_scores, sts_correlations
from distillery.pipeline import compress
from distillery.modeling import load_tokenizer
from distillery.runtime import load_model
from tests.helpers import (NO_EXTRAS, assert_one_line_error, assert_sentence_transformers_gives_what_was_scored,
                           dev_vectors, make_tiny_bert, run_cli, tiny_config,
                           write_glue, write_sentence_transformer, write_squad)

pytestmark = pytest.mark.usefixtures("steady_pretrained_timing")  # conftest: no timing decides a test


@pytest.fixture(scope="module")
def embedder(tmp_path_factory):
    root = tmp_path_factory.mktemp("embedder")
    return write_sentence_transformer(make_tiny_bert(root / "bert", num_layers=4), root / "st")



def run(teacher, data, out, **more):
    data_dir, texts = data
    return compress(tiny_config(teacher, data_dir, out, task="embedding",
                                **{"data.unlabeled_file": texts, "method_options.student_layers": 2, **more}))


def test_distill_makes_an_embedder_that_sentence_transformers_loads_in_a_fresh_process(embedder, embedding_data,
                                                                                       tmp_path):
    out = run(embedder, embedding_data, tmp_path / "run")
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["main_metric"] == "sts_spearman"
    # what the main metric averages over: STS-B's pairs, not the dev split's texts (both sides, SQuAD's rows)
    config = RunConfig.load(out / "config.yaml")
    data = prepare_task_data(task_for(config.data), load_tokenizer(embedder), config.data, splits=("dev",))
    pairs = sum(1 for role in data.dev_examples["role"] if role == 0)
    assert metrics["dev_examples"] == pairs < len(data.dev_examples)
    assert {"sts_spearman", "mrr_at_10", "recall_at_1", "recall_at_10"} <= set(metrics["student"])
    assert load_model(out / "student").config.num_hidden_layers == 2
    assert_sentence_transformers_gives_what_was_scored(out / "student", config, metrics, tmp_path)


def test_the_exports_give_the_sentence_vector_with_the_pooling(embedder, embedding_data, tmp_path):
    """ONNX and int8 exports of the student hold its mean pooling and normalisation (the graph's output is the unit
    sentence vector), the fp32 graph within the parity tolerance of torch; each is scored like the student. A
    sentence-transformers folder exported without --task is known as an embedder by its modules.json."""
    import onnxruntime
    import torch

    from distillery.export import export_model, read_manifest
    from distillery.kinds.embedding import PooledEncoder

    out = run(embedder, embedding_data, tmp_path / "run", int8=True, export=["onnx"])
    config, metrics = RunConfig.load(out / "config.yaml"), json.loads((out / "metrics.json").read_text())
    ours, _ = dev_vectors(out / "student", config)
    kind = kind_of("embedding")
    data = prepare_task_data(task_for(config.data), load_tokenizer(str(out / "student")), config.data, splits=("dev",))
    for fmt in ("onnx", "onnx-int8"):
        folder = out / "exports" / f"student-{fmt}"
        manifest = read_manifest(folder)
        assert (manifest["head"], manifest["outputs"]) == ("sentence-embedding", ["sentence_embedding"])
        got, _ = dev_vectors(folder, config)
        assert metrics["others"][f"student-{fmt}"]["sts_spearman"] == pytest.approx(
            kind.scores(data, got)["sts_spearman"], abs=1e-6)
        if fmt == "onnx":
            torch.testing.assert_close(torch.from_numpy(got), torch.from_numpy(ours), atol=1e-4, rtol=1e-4)
    # the graph itself pools and normalises: ONNX Runtime on padded token ids gives the torch student's unit vectors
    tokenizer = load_tokenizer(str(out / "student"))
    batch = tokenizer(["a short one", "a somewhat longer text than the first one is"], padding=True, return_tensors="pt")
    session = onnxruntime.InferenceSession(str(out / "exports" / "student-onnx" / "model.onnx"))
    feeds = {i.name: batch[i.name].numpy() for i in session.get_inputs()}
    (graph,) = session.run(["sentence_embedding"], feeds)
    with torch.inference_mode():
        expected = PooledEncoder(load_model(out / "student"))(**batch).sentence_embedding
    torch.testing.assert_close(torch.from_numpy(graph), expected, atol=1e-4, rtol=1e-4)
    # torch-int8 of the saved folder, no task given: an embedder by its modules.json, loaded with its pooling
    folder = export_model(out / "student", "torch-int8", tmp_path / "int8")
    assert read_manifest(folder)["head"] == "sentence-embedding"
    with torch.inference_mode():
        int8 = load_model(folder)(**batch).sentence_embedding
    torch.testing.assert_close(int8.norm(dim=-1), torch.ones(2), atol=1e-5, rtol=0)
    assert torch.nn.functional.cosine_similarity(int8, expected).min() > 0.9


def test_a_pretrained_student_with_another_tokenizer_learns_the_embeddings(embedder, embedding_data, tiny_roberta,
                                                                           tmp_path):
    out = run(embedder, embedding_data, tmp_path / "run", **{"method_options.student": tiny_roberta,
                                                              "method_options.student_layers": None})
    assert load_model(out / "student").config.model_type == "roberta"
    assert (out / "student" / "modules.json").is_file()
    assert "sts_spearman" in json.loads((out / "metrics.json").read_text())["student"]


def test_a_narrower_pretrained_student_learns_through_a_projection_used_in_the_loss_only(embedder, embedding_data,
                                                                                         tmp_path, monkeypatch):
    """A --student of half the teacher's width: its sentence vectors are mapped onto the teacher's width by a learned
    projection in the loss (trained and checkpointed with it), started at the least-squares map of the student's
    pooled vectors onto the teacher's; the saved student has its own width, no projection."""
    import torch
    from transformers import BertModel

    from distillery.kinds.embedding import embedding_distance
    from distillery.training.losses import HiddenProjection, pretrained_distillation_loss

    fits, start = [], HiddenProjection.start_at_least_squares
    monkeypatch.setattr(HiddenProjection, "start_at_least_squares",
                        lambda self, x, y, **k: fits.append((x.shape, y.shape, y.norm(dim=-1))) or start(self, x, y, **k))

    narrow = make_tiny_bert(tmp_path / "narrow")  # the teacher's tokenizer, a model of half its width
    config = BertModel.config_class.from_pretrained(narrow)
    config.hidden_size, config.intermediate_size = config.hidden_size // 2, config.intermediate_size // 2
    BertModel(config).save_pretrained(narrow)
    out = run(embedder, embedding_data, tmp_path / "run", **{"method_options.student": narrow,
                                                              "method_options.student_layers": None})
    student = load_model(out / "student")
    assert student.config.hidden_size == config.hidden_size
    assert set(student.state_dict()) == set(BertModel(config).state_dict())  # no projection inside
    assert (out / "student" / "modules.json").is_file()
    notes = json.loads((out / "train.json").read_text())["notes"]
    assert any("learned projection" in n for n in notes)
    (x_shape, y_shape, norms), = fits
    assert x_shape[1] == config.hidden_size and y_shape == (x_shape[0], 2 * config.hidden_size) and x_shape[0] > 0
    torch.testing.assert_close(norms, torch.ones_like(norms))  # onto the teacher's unit vectors
    # the loss is the kind's distance between the projected student vector and the teacher's
    projection = HiddenProjection(config.hidden_size, 2 * config.hidden_size)
    loss_fn = pretrained_distillation_loss("embedding", None, 1.0, 1.0, output_projection=projection)
    ids = torch.tensor([[2, 7, 9, 3, 0], [2, 11, 12, 13, 3]])
    batch = {"input_ids": ids, "attention_mask": (ids > 0).long(), "labels": torch.zeros(2),
             "teacher_logits": torch.randn(2, 2 * config.hidden_size)}
    loss, _ = loss_fn(student, batch)
    with torch.no_grad():
        hidden = student(input_ids=ids, attention_mask=batch["attention_mask"]).last_hidden_state
        mask = batch["attention_mask"].unsqueeze(-1).float()
        pooled = projection((hidden * mask).sum(1) / mask.sum(1))  # projecting then pooling = pooling then projecting
    torch.testing.assert_close(loss.detach(), embedding_distance(pooled, batch["teacher_logits"]))


def test_an_embedding_student_learns_at_the_kinds_rate():
    """The embedding kind's student learning rate (chosen on held-out STS-B train pairs) is its budgets' default, a
    pretrained student's its own; a sentence task keeps 1e-4, and method static its own budgets'."""
    from distillery.pipeline import build_run_config

    for budget in ("quick", "full"):
        assert build_run_config(method="distill", task="embedding", budget=budget).student.lr == 5e-4
        assert build_run_config(method="distill", task="sst2", budget=budget).student.lr == 1e-4
    assert build_run_config(method="static", task="embedding").student.lr == 5e-3
    # a pretrained student (--student) is an embedder already: it learns at the kind's gentler rate, unless told
    student = {"method_options.student": "minilm"}
    assert build_run_config(method="distill", task="embedding", overrides=student).student.lr == 3e-5
    assert build_run_config(method="distill", task="embedding", overrides={**student, "student.lr": 2e-4}).student.lr == 2e-4
    assert build_run_config(method="distill", task="sst2", overrides=student).student.lr == 1e-4


def test_the_metrics_are_those_of_the_cosines():
    a = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    b = np.array([[1.0, 0.1], [1.0, 0.0], [1.0, 0.9]])
    gold = np.array([4.0, 0.0, 5.0])
    assert sts_correlations(a, b, gold)["sts_spearman"] == pytest.approx(1.0)
    queries = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    passages = np.array([[0.0, 1.0], [1.0, 0.0]])
    got = retrieval_scores(queries, passages, np.array([1, 0, 1]))
    assert got["recall_at_1"] == pytest.approx(2 / 3)  # the third ties: a tie counts against the gold passage
    assert got["mrr_at_10"] == pytest.approx((1 + 1 + 0.5) / 3)
    assert got["recall_at_10"] == 1.0


def test_bad_input_is_one_sentence(embedder, embedding_data, tiny_gpt2, tmp_path, monkeypatch, capsys):
    data_dir, texts = embedding_data
    common = ["compress", "--task", "embedding", "--data-dir", str(data_dir), *NO_EXTRAS]

    def refused(fragment, *args):
        code, _, err = run_cli(monkeypatch, capsys, *common, "--out", str(tmp_path / "out"), *args)
        assert_one_line_error(code, err, fragment)

    refused("learns from text alone", "--teacher", embedder)
    no_text = tmp_path / "no-text.csv"
    no_text.write_text("sentence\nhello there\n")
    refused("has no column 'text'", "--teacher", embedder, "--unlabeled-file", str(no_text))
    # the bad inputs: no text to learn from (above), a file without a text column, a teacher that is no
    # encoder, an STS file without scores (below)
    refused("is a 'gpt2' model, not an encoder family distillery knows", "--teacher", tiny_gpt2, "--unlabeled-file", texts)
    # a cmow embedder reads one text: DiffCat, a pair's sentences encoded apart, is refused, not dropped unsaid
    refused("--option pair_mode=diffcat encodes the two sentences of a pair apart, and a cmow embedder reads one text",
            "--teacher", embedder, "--unlabeled-file", texts, "--method", "cmow", "--option", "pair_mode=diffcat")
    # where the CBOW vectors start: a student without them, or two starts at once
    refused("--option vectors=static starts the CBOW vectors, and component=cmow has none", "--teacher", embedder,
            "--unlabeled-file", texts, "--method", "cmow", "--option", "vectors=static", "--option", "component=cmow")
    refused("both say where the CBOW vectors start: give one", "--teacher", embedder, "--unlabeled-file", texts,
            "--method", "cmow", "--option", "vectors=random", "--option", f"init={tmp_path}")
    # auto routes each option to the methods it tries that have it: one that none has is refused
    refused("No method that auto tries has the option(s) no_such_option", "--teacher", embedder, "--unlabeled-file",
            texts, "--method", "auto", "--speedup", "2", "--option", "no_such_option=4")
    # an STS-B dev file without its score column
    bad = tmp_path / "bad-data"
    write_squad(write_glue(bad, n_train=4, n_dev=4))
    sts = bad / "glue" / "STS-B" / "dev.tsv"
    sts.write_text("\n".join("\t".join(line.split("\t")[:-1]) for line in sts.read_text().splitlines()) + "\n")
    code, _, err = run_cli(monkeypatch, capsys, "compress", "--task", "embedding", "--data-dir", str(bad), *NO_EXTRAS,
                           "--out", str(tmp_path / "out"), "--teacher", embedder, "--unlabeled-file", texts)
    assert_one_line_error(code, err, f"{sts} has no column 'score'; its columns are")


def test_a_teacher_of_another_pipeline_is_refused(embedder, tmp_path):
    import shutil

    folder = tmp_path / "two"
    shutil.copytree(embedder, folder)
    pooling = folder / "1_Pooling" / "config.json"
    pooling.write_text(json.dumps({"embedding_dimension": 32, "pooling_mode": ["mean", "max"]}))
    with pytest.raises(DistilleryError, match="pooling mean \\+ max; distillery distils and exports a transformer "
                                              "with one pooling"):
        kind_of("embedding").check_teacher(str(folder), str(folder))
    # sentence-transformers before 6 wrote a flag a mode: the CLS flag is CLS pooling, two flags two poolings
    from distillery.kinds.st_files import folder_pooling

    pooling.write_text(json.dumps({"word_embedding_dimension": 32, "pooling_mode_cls_token": True,
                                   "pooling_mode_mean_tokens": False}))
    assert folder_pooling("old", folder) == "cls" and folder_pooling("plain", folder / "0_missing") is None
    pooling.write_text(json.dumps({"word_embedding_dimension": 32, "pooling_mode_max_tokens": True,
                                   "pooling_mode_mean_tokens": True}))
    with pytest.raises(DistilleryError, match="pooling max \\+ mean"):
        folder_pooling("old", folder)
    # a Dense module after the pooling changes the vector: refused, not left out
    pooling.write_text(json.dumps({"embedding_dimension": 32, "pooling_mode": "mean"}))
    modules = json.loads((folder / "modules.json").read_text())
    modules.insert(2, {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"})
    (folder / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(DistilleryError, match="modules Transformer, Pooling, Dense, Normalize"):
        folder_pooling("dense", folder)
    # INSTRUCTOR's pooling leaves its prompt's tokens out: not what distillery computes
    modules.pop(2)
    (folder / "modules.json").write_text(json.dumps(modules))
    pooling.write_text(json.dumps({"embedding_dimension": 32, "pooling_mode": "mean", "include_prompt": False}))
    with pytest.raises(DistilleryError, match=r"pools its tokens without its prompt's \(include_prompt: false"):
        folder_pooling("instructor", folder)
    # ranked by the dot product of vectors it does not normalise (TAS-B, msmarco-*-dot): unit vectors rank otherwise
    pooling.write_text(json.dumps({"embedding_dimension": 32, "pooling_mode": "cls"}))
    settings = json.loads((folder / "config_sentence_transformers.json").read_text())
    (folder / "config_sentence_transformers.json").write_text(json.dumps({**settings, "similarity_fn_name": "dot"}))
    assert folder_pooling("dot, normalised", folder) == "cls"
    (folder / "modules.json").write_text(json.dumps([m for m in modules if m["type"].rsplit(".", 1)[-1] != "Normalize"]))
    with pytest.raises(DistilleryError, match=r"ranks texts by the dot product of vectors it does not normalise"):
        folder_pooling("dot", folder)


def test_every_pooling_of_sentence_transformers_is_computed_as_it_computes_it(embedding_data, tmp_path):
    """Each of sentence-transformers' Pooling modes (max, last token, weighted mean...: SGPT, decoder embedders, old
    SBERT models) is read from a teacher's files and computed as sentence-transformers computes it: the pooling itself
    on padding at either side, the run's batches (the pooling travels as a column), and an ONNX export's graph."""
    import onnxruntime
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling

    from distillery.config import DataConfig
    from distillery.export import export_model
    from distillery.kinds.embedding import POOLINGS, batch_pooling, pooled
    from distillery.kinds.st_files import folder_pooling

    torch.manual_seed(0)
    hidden, right = torch.randn(3, 7, 8), torch.tensor([[1] * 7, [1] * 4 + [0] * 3, [1] * 2 + [0] * 5])
    for mode in POOLINGS:
        for mask in (right, right.flip(1)):
            theirs = Pooling(8, mode)({"token_embeddings": hidden, "attention_mask": mask})["sentence_embedding"]
            torch.testing.assert_close(pooled(hidden, mask, mode), theirs)
    data_dir, texts = embedding_data
    bert = make_tiny_bert(tmp_path / "bert", num_layers=2)
    texts_ = ["a short one", "a somewhat longer text than the first one is", "and a third"]
    for mode in ("max", "lasttoken", "weightedmean", "mean_sqrt_len_tokens"):
        folder = write_sentence_transformer(bert, tmp_path / mode, pooling=mode)
        assert folder_pooling(mode, folder) == mode
        config = DataConfig(task="embedding", data_dir=str(data_dir), unlabeled_file=texts, max_length=64)
        kind_of("embedding").settle_data(mode, folder, config)
        assert config.pooling == mode
        data = prepare_task_data(task_for(config), load_tokenizer(folder), config, splits=("dev",))
        assert batch_pooling(data.collate([data.dev[i] for i in range(4)])) == mode
        ours, dev_texts = dev_vectors(folder, type("Run", (), {"data": config}))
        theirs = SentenceTransformer(folder, device="cpu").encode(dev_texts, batch_size=64)
        np.testing.assert_allclose(ours, theirs, atol=1e-5)
        if mode not in ("lasttoken", "weightedmean"):  # the poolings of their own ops (gather, flip, arange) only
            continue
        # the export's graph pools as the folder says (no task given: read from its modules.json)
        session = onnxruntime.InferenceSession(str(export_model(folder, "onnx", tmp_path / f"{mode}-onnx") / "model.onnx"))
        batch = load_tokenizer(folder)(texts_, padding=True, return_tensors="np")
        (graph,) = session.run(["sentence_embedding"], {i.name: batch[i.name] for i in session.get_inputs()})
        np.testing.assert_allclose(graph, SentenceTransformer(folder, device="cpu").encode(texts_), atol=1e-4)


@pytest.fixture(scope="module")
def cls_embedder(tmp_path_factory):
    root = tmp_path_factory.mktemp("cls-embedder")
    return write_sentence_transformer(make_tiny_bert(root / "bert", num_layers=4), root / "st", pooling="cls")


def test_a_cls_pooled_teacher_makes_a_cls_pooled_embedder(cls_embedder, embedding_data, tmp_path):
    """A teacher that pools its [CLS] state (BGE, Arctic-embed, mxbai) is distilled as it computes: its vectors are
    sentence-transformers' own, its student pools the same way, is saved with that pooling (SentenceTransformer in a
    fresh process gives the vectors distillery scored), and its ONNX export's graph pools it too."""
    import onnxruntime
    import torch
    from sentence_transformers import SentenceTransformer

    from distillery.kinds.embedding import PooledEncoder

    from distillery.export import export_model

    out = run(cls_embedder, embedding_data, tmp_path / "run")
    config, metrics = RunConfig.load(out / "config.yaml"), json.loads((out / "metrics.json").read_text())
    assert config.data.pooling == "cls"
    assert json.loads((out / "student" / "1_Pooling" / "config.json").read_text())["pooling_mode"] == "cls"
    # the teacher scored on the vectors sentence-transformers gives
    data = prepare_task_data(task_for(config.data), load_tokenizer(cls_embedder), config.data, splits=("dev",))
    theirs = SentenceTransformer(cls_embedder, device="cpu").encode(list(data.dev_examples["text"]), batch_size=64)
    assert metrics["teacher"]["sts_spearman"] == pytest.approx(
        kind_of("embedding").scores(data, theirs)["sts_spearman"], abs=1e-6)
    assert_sentence_transformers_gives_what_was_scored(out / "student", config, metrics, tmp_path)
    # mean pooling of the same student gives other vectors: the pooling is not the mean by another name
    mean_data = config.data.__class__(**{**vars(config.data), "pooling": None})
    ours, _ = dev_vectors(out / "student", config)
    mean, _ = dev_vectors(out / "student", RunConfig(**{**vars(config), "data": mean_data}))
    assert not np.allclose(ours, mean, atol=1e-3)
    # the ONNX graph pools the first token: ONNX Runtime gives the torch student's vectors
    tokenizer = load_tokenizer(str(out / "student"))
    batch = tokenizer(["a short one", "a somewhat longer text than the first one is"], padding=True, return_tensors="pt")
    exported = export_model(out, "onnx", tmp_path / "onnx")  # the student's alone: --export onnx adds the teacher's
    session = onnxruntime.InferenceSession(str(exported / "model.onnx"))
    (graph,) = session.run(["sentence_embedding"], {i.name: batch[i.name].numpy() for i in session.get_inputs()})
    student = load_model(out / "student")
    with torch.inference_mode():
        expected = PooledEncoder(student)(**batch).sentence_embedding
        first = torch.nn.functional.normalize(student(**batch).last_hidden_state[:, 0], dim=-1)
    torch.testing.assert_close(expected, first)
    torch.testing.assert_close(torch.from_numpy(graph), expected, atol=1e-4, rtol=1e-4)


def test_a_pooling_given_is_checked(cls_embedder, embedding_data, tmp_path, monkeypatch, capsys):
    data_dir, texts = embedding_data
    common = ["compress", "--task", "embedding", "--data-dir", str(data_dir), *NO_EXTRAS, "--unlabeled-file", texts]
    code, _, err = run_cli(monkeypatch, capsys, *common, "--out", str(tmp_path / "a"), "--teacher", cls_embedder,
                           "--pooling", "mean")
    assert_one_line_error(code, err, "--pooling mean (data.pooling), but Teacher")
    code, _, err = run_cli(monkeypatch, capsys, *common, "--out", str(tmp_path / "b"), "--teacher", cls_embedder,
                           "--pooling", "median")
    assert_one_line_error(code, err, "one of mean, cls, max, mean_sqrt_len_tokens, weightedmean, lasttoken, got 'median'")
    code, _, err = run_cli(monkeypatch, capsys, "compress", "--task", "sst2", "--data-dir", str(data_dir), *NO_EXTRAS,
                           "--out", str(tmp_path / "c"), "--pooling", "cls")
    assert_one_line_error(code, err, "is an embedder's (--task embedding)")
    assert not any((tmp_path / name).exists() for name in "abc")


def test_a_teacher_with_prompts_is_called_with_them_and_its_student_keeps_them(embedding_data, tmp_path):
    """A teacher with prompts (E5's "query: " and "passage: ", BGE's query instruction, a default prompt) gives
    sentence-transformers' vectors: each dev text after the prompt encode, encode_query or encode_document puts
    before it, each transfer-set text in each of those forms in turn; the student is saved with the same prompts, so
    its own encode_query and encode_document give the vectors distillery scored."""
    from datasets import Dataset
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Normalize, Transformer
    from sentence_transformers.sentence_transformer.modules import Pooling

    from distillery.kinds.embedding import PASSAGE, QUESTION, prompted, role_prompts

    prompts = {"query": "query: ", "document": "passage: ", "similar": "similar: ", "unused": "x: "}
    encoder = Transformer(make_tiny_bert(tmp_path / "bert", num_layers=4), max_seq_length=64)
    teacher = str(tmp_path / "teacher")
    SentenceTransformer(modules=[encoder, Pooling(encoder.get_embedding_dimension()), Normalize()], device="cpu",
                        prompts=prompts, default_prompt_name="similar").save(teacher, create_model_card=False)
    rows = prompted(Dataset.from_dict({"text": ["a", "b", "c", "d"]}), role_prompts(prompts, "similar"))
    assert rows["text"] == ["similar: a", "query: b", "passage: c", "similar: d"]  # the transfer set: in turn
    from distillery.config import DataConfig

    with pytest.raises(DistilleryError, match="data.prompts / data.default_prompt given, but Teacher has prompts of "
                                              "its own"):
        kind_of("embedding").settle_data("Teacher", teacher, DataConfig(task="embedding", prompts={"query": "q: "}))

    out = run(teacher, embedding_data, tmp_path / "run")
    config, metrics = RunConfig.load(out / "config.yaml"), json.loads((out / "metrics.json").read_text())
    assert (config.data.prompts, config.data.default_prompt) == (prompts, "similar")
    data = prepare_task_data(task_for(config.data), load_tokenizer(teacher), config.data, splits=("dev",))
    role = np.asarray(data.dev_examples["role"])
    texts = list(data.dev_examples["text"])

    def theirs(model):  # the dev vectors as sentence-transformers computes them, each text by its role
        vectors = model.encode(texts)  # STS-B's sentences: the default prompt
        for which, encode in ((QUESTION, model.encode_query), (PASSAGE, model.encode_document)):
            at = np.flatnonzero(role == which)
            vectors[at] = encode([texts[i] for i in at])
        return vectors

    kind = kind_of("embedding")
    teacher_scores = kind.scores(data, theirs(SentenceTransformer(teacher, device="cpu")))
    for metric in ("sts_spearman", "mrr_at_10"):
        assert metrics["teacher"][metric] == pytest.approx(teacher_scores[metric], abs=1e-6)
    student = SentenceTransformer(str(out / "student"), device="cpu")
    assert (student.prompts, student.default_prompt_name) == (prompts, "similar")
    ours, _ = dev_vectors(out / "student", config)
    np.testing.assert_allclose(ours, theirs(student), atol=1e-5)
    assert metrics["student"]["mrr_at_10"] == pytest.approx(kind.scores(data, ours)["mrr_at_10"], abs=1e-6)


def test_prompts_given_are_checked(embedder, embedding_data, tmp_path, monkeypatch, capsys):
    data_dir, texts = embedding_data
    settings = tmp_path / "prompts.yaml"
    settings.write_text("data:\n  default_prompt: query\n")
    code, _, err = run_cli(monkeypatch, capsys, "compress", "--task", "embedding", "--data-dir", str(data_dir),
                           *NO_EXTRAS, "--unlabeled-file", texts, "--teacher", embedder, "--out", str(tmp_path / "a"),
                           "--config", str(settings))
    assert_one_line_error(code, err, "default_prompt names one of data.prompts (none given), got 'query'")
    settings.write_text("data:\n  prompts: {query: 'query: '}\n")
    code, _, err = run_cli(monkeypatch, capsys, "compress", "--task", "sst2", "--data-dir", str(data_dir), *NO_EXTRAS,
                           "--out", str(tmp_path / "b"), "--config", str(settings))
    assert_one_line_error(code, err, "prompts is an embedder's (--task embedding)")
    assert not any((tmp_path / name).exists() for name in "ab")
