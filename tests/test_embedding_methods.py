"""Issue 55: the methods beyond distill and static on ``--task embedding``. A tiny embedder (a sentence-transformers
folder of a tiny random BERT) compressed by MoEBERT: its FFNs cut into experts by importance scored on the texts
(an in-batch contrastive loss, the task loss being 0 with no gradient on the teacher itself), trained on the
teacher's sentence vectors and its hidden states; the student folder loads in sentence-transformers in a fresh
process after ``distillery.register_models()`` and gives the vectors distillery scored."""

from __future__ import annotations

import json

import pytest
import torch

# imported before any test patches the timings (steady_pretrained_timing): a module first imported while a patch is
# on binds the stand-in for good (helpers.flop_timed)
import distillery.autotinybert.recipe  # noqa: F401
from distillery.config import RunConfig
from distillery.kinds import kind_of
from distillery.pipeline import compress
from distillery.runtime import load_model
from tests.helpers import assert_sentence_transformers_gives_what_was_scored, tiny_config

pytestmark = pytest.mark.usefixtures("steady_pretrained_timing")  # conftest: no timing decides a test




def test_the_embedding_importance_loss_has_a_gradient_on_the_teacher_itself():
    """At the teacher's own vectors ``1 − cos`` is 0 with no gradient; the in-batch contrastive loss is not."""
    kind = kind_of("embedding")
    hidden = torch.randn(3, 5, 8, requires_grad=True)
    batch = {"attention_mask": torch.ones(3, 5, dtype=torch.long)}
    vectors = kind.distilled_positions({"last_hidden_state": hidden}, {"last_hidden_state": hidden}, batch)[0]
    batch["teacher_logits"] = vectors.detach()
    task = kind.task_loss({"last_hidden_state": hidden}, batch, reduction="none")
    (grad,) = torch.autograd.grad(task.sum(), hidden)
    assert float(grad.abs().max()) < 1e-5
    rows = kind.importance_loss({"last_hidden_state": hidden}, batch)
    assert rows.shape == (3,) and bool((rows > 0).all())
    (grad,) = torch.autograd.grad(rows.sum(), hidden)
    assert float(grad.abs().max()) > 1e-3


def test_moebert_makes_an_embedder_that_sentence_transformers_loads_after_register_models(embedder, embedding_data,
                                                                                          tmp_path):
    data_dir, texts = embedding_data
    out = compress(tiny_config(embedder, data_dir, tmp_path / "run", task="embedding", method="moebert",
                               **{"data.unlabeled_file": texts, "method_options.experts": 2,
                                  "method_options.importance_examples": 32}))
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["main_metric"] == "sts_spearman"
    assert {"sts_spearman", "mrr_at_10"} <= set(metrics["student"])
    student = load_model(out / "student")
    assert student.config.model_type == "moebert" and student.config.num_experts == 2
    assert (out / "importance.safetensors").is_file() and (out / "student" / "modules.json").is_file()
    assert_sentence_transformers_gives_what_was_scored(out / "student", RunConfig.load(out / "config.yaml"), metrics,
                                                       tmp_path, register_models=True)


def test_the_moebert_steps_read_the_embedders_texts_as_compress_does(embedder, embedding_data, tmp_path, monkeypatch,
                                                                     capsys):
    """``distillery moebert importance`` and ``convert`` on ``--task embedding`` read the ``--unlabeled-file`` texts
    with the teacher's vectors, as ``compress --method moebert`` does: the same settings give the run's own scores;
    without the texts the step is refused in one sentence."""
    from safetensors.torch import load_file

    from distillery.moebert.recipe import convert_step, importance_step
    from tests.helpers import assert_one_line_error, run_cli

    data_dir, texts = embedding_data
    out = compress(tiny_config(embedder, data_dir, tmp_path / "run", task="embedding", method="moebert",
                               **{"data.unlabeled_file": texts, "method_options.experts": 2,
                                  "method_options.importance_examples": 32, "student.epochs": 0.25}))
    config = RunConfig.load(out / "config.yaml")
    scores = importance_step(config, tmp_path / "importance.safetensors")
    torch.testing.assert_close(load_file(scores)["importance"], load_file(out / "importance.safetensors")["importance"])
    converted = load_model(convert_step(config, scores, tmp_path / "converted"))
    assert converted.config.model_type == "moebert" and converted.config.num_experts == 2
    common = ["moebert", "importance", "--task", "embedding", "--teacher", embedder, "--data-dir", str(data_dir),
              "--out", str(tmp_path / "cli.safetensors")]
    code, _, err = run_cli(monkeypatch, capsys, *common)
    assert_one_line_error(code, err, "--task embedding learns from text alone and none was given: give the texts with "
                                     "--unlabeled-file FILE")
    code, stdout, _ = run_cli(monkeypatch, capsys, *common, "--unlabeled-file", texts, "--importance-examples", "8")
    assert code == 0 and load_file(tmp_path / "cli.safetensors")["importance"].shape[0] == 2, stdout


def test_autotinybert_searches_on_the_embedding_objective_and_makes_an_embedder(tiny_family, embedding_data, tmp_path,
                                                                                monkeypatch, capsys):
    """The super-net is trained one-shot on the texts, rewired by the embedding importance, its candidates scored by
    −(1 − cos + MSE) to the teacher's vectors on held-out texts; the further-trained sub-network is an embedder that
    sentence-transformers loads after ``distillery.register_models()``. The teacher is an MPNet (all-mpnet-base-v2's
    family), whose base model has no pooler (its pooler is its classification head's): the sub-network extracts
    without one (BERT's embedders, with one, are every other embedding test's teacher)."""
    from tests.helpers import flop_timed, write_sentence_transformer

    flop_timed(monkeypatch)
    embedder = write_sentence_transformer(tiny_family("mpnet", 2), tmp_path / "mpnet-st")
    data_dir, texts = embedding_data
    opts = {"supernet_steps": 3, "latency_archs": 10, "generations": 2, "population": 3, "latency_runs": 2,
            "proxy_examples": 16, "speedup": 1.5, "budget_floor": 0}
    out = compress(tiny_config(embedder, data_dir, tmp_path / "run", task="embedding", method="autotinybert",
                               **{"data.unlabeled_file": texts, **{f"method_options.{k}": v for k, v in opts.items()}}))
    metrics = json.loads((out / "metrics.json").read_text())
    assert "sts_spearman" in metrics["student"]
    candidates = json.loads((out / "search.json").read_text())["candidates"]
    assert candidates and all(-4.0 <= c["score"] <= 0 for c in candidates)  # −distances, not probe log-likelihoods
    student = load_model(out / "student")
    assert student.config.model_type == "autotinybert" and (out / "student" / "modules.json").is_file()
    assert_sentence_transformers_gives_what_was_scored(out / "student", RunConfig.load(out / "config.yaml"), metrics,
                                                       tmp_path, register_models=True)
    # its super-net (headless, the embedding kind in supernet.json) serves another embedding run: no one-shot phase
    assert json.loads((out / "supernet" / "supernet.json").read_text())["kind"] == "embedding"
    again = compress(tiny_config(embedder, data_dir, tmp_path / "again", task="embedding", method="autotinybert",
                                 **{"data.unlabeled_file": texts, "method_options.supernet": str(out / "supernet"),
                                    **{f"method_options.{k}": v for k, v in opts.items()}}))
    assert not (again / "supernet").exists() and load_model(again / "student").config.model_type == "autotinybert"
    assert any("Super-net: loaded from" in note for note in json.loads((again / "train.json").read_text())["notes"])
    # the step commands read the texts too (--unlabeled-file), and refuse the embedding task without them
    from tests.helpers import assert_one_line_error, run_cli

    step = ["autotinybert", "search", "--task", "embedding", "--teacher", embedder, "--data-dir", str(data_dir),
            "--supernet", str(out / "supernet"), "--out", str(tmp_path / "step")]
    assert_one_line_error(*run_cli(monkeypatch, capsys, *step)[::2], "learns from text alone and none was given")
    missing = tmp_path / "missing.csv"
    assert_one_line_error(*run_cli(monkeypatch, capsys, *step, "--unlabeled-file", str(missing))[::2], str(missing))


def test_a_task_supernet_serves_a_run_of_its_own_kind_only(tmp_path):
    """An embedder's super-net has no head: the kind it was trained for is the one its supernet.json records (a folder
    of before it did: its task's), and a run of another kind, or of a teacher of another width, is refused in one
    sentence."""
    from transformers import BertConfig, BertForSequenceClassification, BertModel

    from distillery.autotinybert.oneshot import (check_task_supernet, load_projection, load_supernet, make_projection,
                                                 save_supernet)
    from distillery.autotinybert.supernet import SuperNet
    from distillery.errors import DistilleryError

    config = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=24)
    encoder = BertModel(config, add_pooling_layer=False).eval()
    supernet = SuperNet.from_teacher(encoder)
    save_supernet(supernet, make_projection(supernet, 16), tmp_path / "sn", facts={"task": "embedding"})
    loaded, projection = load_supernet(tmp_path / "sn"), load_projection(tmp_path / "sn")
    check_task_supernet(tmp_path / "sn", loaded, projection, kind_of("embedding"), encoder, "heads")
    with pytest.raises(DistilleryError, match="trained for embedding, this run's task is classification; projection saved"):
        check_task_supernet(tmp_path / "sn", loaded, projection, kind_of("classification"),
                            BertForSequenceClassification(config), "heads")
    wider = BertModel(BertConfig(**{**config.to_dict(), "hidden_size": 32}), add_pooling_layer=False)
    with pytest.raises(DistilleryError, match="another head size, vocabulary or width than this task's teacher"):
        check_task_supernet(tmp_path / "sn", loaded, projection, kind_of("embedding"), wider, "heads")


def test_a_narrower_autotinybert_embedder_trains_through_the_one_shot_projection():
    """A sub-network narrower than the teacher learns the teacher's vectors through a projection started from the
    one-shot projection's slice, trained beside it and not part of it."""
    from transformers import BertConfig, BertModel

    from distillery.autotinybert.embedder import further_training_loss

    def bert(width):
        return BertModel(BertConfig(vocab_size=50, hidden_size=width, num_hidden_layers=1, num_attention_heads=2,
                                    intermediate_size=24), add_pooling_layer=False)

    torch.manual_seed(0)
    teacher, student, projection = bert(32), bert(16), torch.nn.Linear(32, 32)
    kind = kind_of("embedding")
    loss_fn, extra = further_training_loss(kind, teacher, student, projection, 1.0, 1.0)
    (onto,) = extra
    torch.testing.assert_close(onto.linear.weight, projection.weight[:, :16])
    batch = {"input_ids": torch.randint(1, 50, (3, 6)), "attention_mask": torch.ones(3, 6, dtype=torch.long),
             "teacher_logits": torch.randn(3, 32), "labels": torch.zeros(3)}
    loss, _ = loss_fn(student, batch)
    loss.backward()
    assert torch.isfinite(loss) and onto.linear.weight.grad is not None
    # the same width: the kind's own distillation loss, nothing beside the student
    assert further_training_loss(kind, teacher, bert(32), projection, 1.0, 1.0)[1] == []



CMOW_TINY = {"method_options.matrix_dim": 4, "method_options.vector_dim": 16}


@pytest.fixture(scope="module")
def cmow_run(embedder, embedding_data, tmp_path_factory):
    """A CMOW embedder of the tiny embedder, with its int8 (torch's, CMOW's backend) and ONNX exports."""
    data_dir, texts = embedding_data
    return compress(tiny_config(embedder, data_dir, tmp_path_factory.mktemp("cmow") / "run", task="embedding",
                                method="cmow", int8=True, export=["onnx"], **{"data.unlabeled_file": texts, **CMOW_TINY}))


def test_cmow_makes_an_embedder_that_sentence_transformers_loads_after_register_models(cmow_run, embedder, tmp_path):
    """The CMOW embedder's sentence representation through its head onto the teacher's width, trained on the teacher's
    vectors; its folder is sentence-transformers' transformer module reading the model's own ``sentence_embedding``
    (no pooling) and normalisation, loaded in a fresh process after ``distillery.register_models()``."""
    out = cmow_run
    metrics = json.loads((out / "metrics.json").read_text())
    assert {"sts_spearman", "mrr_at_10"} <= set(metrics["student"])
    student, teacher = load_model(out / "student"), load_model(embedder)
    assert student.config.model_type == "cmow-embedder" and student.config.output_dim == teacher.config.hidden_size
    modules = json.loads((out / "student" / "modules.json").read_text())
    assert [m["type"].rsplit(".", 1)[-1] for m in modules] == ["Transformer", "Normalize"]
    notes = json.loads((out / "train.json").read_text())["notes"]
    assert any("1 − cos + MSE" in n for n in notes)
    assert_sentence_transformers_gives_what_was_scored(out / "student", RunConfig.load(out / "config.yaml"), metrics,
                                                       tmp_path, register_models=True)


def test_a_cmow_embedder_starts_its_cbow_vectors_at_the_teachers_static_vectors(cmow_run, embedder):
    """By default an embedder's CBOW table starts at method static's table (every vocabulary token through the
    teacher, SIF-weighted on the run's text), rescaled to the random start's norm; the columns beyond the teacher's
    width, the special tokens' rows and the padding row keep the random start."""
    from types import SimpleNamespace

    from datasets import Dataset

    from distillery.cmow.modeling_embedder import CMOWEmbedderConfig, CMOWForSentenceEmbedding
    from distillery.cmow.recipe import start_at_static_vectors
    from distillery.modeling import load_tokenizer
    from distillery.static.vectors import counted_tokens, sif_weights, token_vectors

    notes = json.loads((cmow_run / "train.json").read_text())["notes"]
    assert any("CBOW vectors start at the teacher's static token vectors" in n for n in notes)
    teacher, tokenizer = load_model(embedder), load_tokenizer(str(embedder))
    width = teacher.config.hidden_size
    config = CMOWEmbedderConfig(vocab_size=teacher.config.vocab_size, matrix_dim=4, vector_dim=width + 8,
                                pad_token_id=tokenizer.pad_token_id, output_dim=width)
    torch.manual_seed(0)
    table = CMOWForSentenceEmbedding(config).encoder.vec
    start = table.weight.detach().clone()
    train = Dataset.from_dict({"input_ids": [tokenizer("the cat sat on the mat")["input_ids"]] * 3})
    ctx = SimpleNamespace(teacher=teacher, tokenizer=tokenizer, notes=[],
                          config=SimpleNamespace(student=SimpleNamespace(eval_batch_size=64, seed=0)))
    start_at_static_vectors(table, ctx, train, config)
    counted = counted_tokens(tokenizer, config.vocab_size).bool()
    counted[config.pad_token_id] = False
    static = token_vectors(teacher, tokenizer) * sif_weights(train, counted.float(), 1e-4)[:, None]
    got = table.weight.detach()
    scale = got[counted, :width].norm() / static[counted].norm()
    torch.testing.assert_close(got[counted, :width], scale * static[counted])
    torch.testing.assert_close(got[:, width:], start[:, width:])
    torch.testing.assert_close(got[~counted], start[~counted])
    assert not got[config.pad_token_id].any()
    # the scale: the random start's mean row norm on those columns before the SIF weights
    torch.testing.assert_close((got[counted, :width] / sif_weights(train, counted.float(), 1e-4)[counted, None])
                               .norm(dim=1).mean(), start[counted, :width].norm(dim=1).mean())


def test_the_cmow_embedder_exports_give_its_sentence_vector(cmow_run, tmp_path):
    """ONNX and torch-int8 exports of the CMOW embedder give the unit sentence vector (``sentence_embedding``), the
    ONNX graph within the parity tolerance of torch, each scored like the student. The graph pads the length to its
    16-token blocks: a vector as wide as the padded length (32) is not cut back to the input's length as a per-token
    output would be. The student folder exports without --task (its modules.json)."""
    from distillery.export import export_model, read_manifest
    from distillery.kinds.embedding import PooledEncoder
    from distillery.modeling import load_tokenizer
    from tests.helpers import dev_vectors

    out = cmow_run
    config, metrics = RunConfig.load(out / "config.yaml"), json.loads((out / "metrics.json").read_text())
    ours, _ = dev_vectors(out / "student", config)
    for fmt in ("onnx", "torch-int8"):
        folder = out / "exports" / f"student-{fmt}"
        manifest = read_manifest(folder)
        assert (manifest["head"], manifest["outputs"]) == ("sentence-embedding", ["sentence_embedding"])
        assert f"student-{fmt}" in metrics["others"]
        got, _ = dev_vectors(folder, config)
        assert got.shape == ours.shape
        tolerance = 1e-4 if fmt == "onnx" else 0.1  # int8: close, not equal
        torch.testing.assert_close(torch.from_numpy(got), torch.from_numpy(ours), atol=tolerance, rtol=tolerance)
    tokenizer = load_tokenizer(str(out / "student"))
    batch = tokenizer(["a short one", "a somewhat longer text than the first one is, and longer still"], padding=True,
                      truncation=True, max_length=24, return_tensors="pt")
    assert 16 < batch["input_ids"].shape[1] < 32 == ours.shape[1]
    with torch.inference_mode():
        expected = PooledEncoder(load_model(out / "student"))(**batch).sentence_embedding
        graph = load_model(out / "exports" / "student-onnx")(**batch).sentence_embedding
    torch.testing.assert_close(graph, expected, atol=1e-4, rtol=1e-4)
    assert read_manifest(export_model(out / "student", "torch-int8", tmp_path / "int8"))["head"] == "sentence-embedding"


def test_a_model_giving_its_own_vector_is_an_embedder_only_as_the_transformer_module_reading_it(tmp_path):
    """A model whose forward gives its sentence vector (``...ForSentenceEmbedding``) is an embedder (a teacher, a
    model exported without --task) as sentence-transformers' transformer module reading that output, then
    normalisation; read as token embeddings, or pooled, it is refused in a sentence."""
    from distillery.errors import DistilleryError

    kind = kind_of("embedding")
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["CMOWForSentenceEmbedding"]}))
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.base.modules.transformer.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Normalize",
                "type": "sentence_transformers.base.modules.normalize.Normalize"}]
    (tmp_path / "modules.json").write_text(json.dumps(modules))
    reads = tmp_path / "sentence_bert_config.json"
    reads.write_text(json.dumps({"module_output_name": "sentence_embedding"}))
    kind.check_teacher("The model", str(tmp_path))
    reads.write_text(json.dumps({"module_output_name": "token_embeddings"}))
    with pytest.raises(DistilleryError, match="a transformer with one pooling"):
        kind.check_teacher("The model", str(tmp_path))
