"""AutoTinyBERT: search space, the sliced super-net against its BERT, extraction against the slice."""

from __future__ import annotations

import copy
import dataclasses
import random

import pytest
import torch
import yaml
from torch.testing import assert_close
from transformers import BertConfig, BertForQuestionAnswering, BertForSequenceClassification, BertForTokenClassification

from distillery.autotinybert.modeling_autotinybert import AutoTinyBertConfig, AutoTinyBertForSequenceClassification
from distillery.autotinybert.space import Arch, SearchSpace
from distillery.autotinybert.supernet import SuperNet, head_rows, qkv_rows, sub_layers
from distillery.kinds import kind_of
from tests.helpers import (NER_RUN, NO_EXTRAS, TINY_BERT, TINY_RUN, pair_batch, write_unlabeled_sentences, assert_one_line_error, flop_timed, patch_everywhere, run_cli, tiny_bert_config, write_corpus,
                           write_glue)

TINY = dict(TINY_BERT, num_hidden_layers=3, max_position_embeddings=64)


def tiny_teacher(cls=BertForSequenceClassification, **kw):
    torch.manual_seed(0)
    labels = kw.pop("num_labels", 2 if cls is BertForQuestionAnswering else 3)
    config = tiny_bert_config(**{**TINY, **kw}, num_labels=labels, attn_implementation="sdpa")
    return cls(config).eval()


@pytest.mark.parametrize("strategy", ["heads", "head-dims"])
@pytest.mark.parametrize("cls, key", [(BertForSequenceClassification, "logits"), (BertForQuestionAnswering, "start_logits"),
                                      (BertForTokenClassification, "logits")])
def test_full_size_supernet_equals_its_bert(strategy, cls, key):
    teacher = tiny_teacher(cls)
    net = SuperNet.from_teacher(teacher, strategy).eval()
    assert net.space.full() == Arch(3, 32, 37, 4, 32)
    with torch.no_grad():
        expected = teacher(**pair_batch(), output_hidden_states=True)
        got = net(**pair_batch(), output_hidden_states=True)
    assert_close(got[key], getattr(expected, key))
    for a, b in zip(got["hidden_states"], expected.hidden_states):
        assert_close(a, b)


@pytest.mark.parametrize("strategy", ["heads", "head-dims"])
def test_extraction_equals_the_supernet_slice(strategy, tmp_path):
    net = SuperNet.from_teacher(tiny_teacher(), strategy).eval()
    rng = random.Random(0)
    for _ in range(6):
        arch = net.space.sample(rng)
        model = net.extract(arch)
        assert isinstance(model, AutoTinyBertForSequenceClassification)
        assert (model.config.hidden_size, model.config.qkv_size, model.config.num_attention_heads) == (arch.hidden, arch.qkv, arch.heads)
        with torch.no_grad():
            assert_close(model(**pair_batch()).logits, net(**pair_batch(), arch=arch)["logits"])
    model.save_pretrained(tmp_path)
    import distillery
    from transformers import AutoModelForSequenceClassification

    distillery.register_models()
    loaded = AutoModelForSequenceClassification.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        assert_close(loaded(**pair_batch()).logits, model(**pair_batch()).logits)


def test_a_tagger_supernet_extracts_a_token_classifier_equal_to_its_slice(tmp_path):
    """A token-classification teacher's super-net: its head is the task kind's (every token's logits), a
    sub-network extracts to the AutoTinyBERT token classifier the Auto class loads, with the tag names."""
    from transformers import AutoModelForTokenClassification

    import distillery

    teacher = tiny_teacher(BertForTokenClassification, num_labels=5, id2label={i: f"T{i}" for i in range(5)})
    net = SuperNet.from_teacher(teacher, "head-dims").eval()
    assert net.kind is kind_of("token_classification") and net.bert.pooler is None
    arch = net.space.sample(random.Random(1))
    model = net.extract(arch)
    assert type(model).__name__ == "AutoTinyBertForTokenClassification"
    with torch.no_grad():
        assert_close(model(**pair_batch()).logits, net(**pair_batch(), arch=arch)["logits"])
        assert net(**pair_batch(), arch=arch)["logits"].shape == (3, 11, 5)
    model.save_pretrained(tmp_path)
    distillery.register_models()
    loaded = AutoModelForTokenClassification.from_pretrained(tmp_path).eval()
    assert loaded.config.id2label[4] == "T4"
    labels = torch.full((3, 11), -100)
    labels[:, 1:4] = 2
    with torch.no_grad():
        out = loaded(**pair_batch(), labels=labels)
        assert_close(out.logits, model(**pair_batch()).logits)
    assert_close(out.loss, torch.nn.functional.cross_entropy(out.logits[:, 1:4].reshape(-1, 5), labels[:, 1:4].reshape(-1)))


def test_a_saved_supernet_keeps_its_heads_kind():
    """supernet.json names the head's kind; a folder written before the kinds ("classification" for a
    regressor too) loads a one-output head as regression."""
    import json
    import tempfile

    from distillery.autotinybert.oneshot import load_supernet, save_supernet

    for cls, labels, kind in ((BertForTokenClassification, 5, "token_classification"),
                              (BertForSequenceClassification, 1, "regression")):
        net = SuperNet.from_teacher(tiny_teacher(cls, num_labels=labels))
        assert net.kind is kind_of(kind)
        with tempfile.TemporaryDirectory() as tmp:
            save_supernet(net, None, tmp)
            assert json.loads(open(f"{tmp}/supernet.json").read())["head_kind"] == kind
            assert load_supernet(tmp).kind is kind_of(kind)
            if kind == "regression":
                facts = json.loads(open(f"{tmp}/supernet.json").read())
                open(f"{tmp}/supernet.json", "w").write(json.dumps({**facts, "head_kind": "classification"}))
                assert load_supernet(tmp).kind is kind_of("regression")


def test_qkv_rows_keep_whole_heads_or_head_boundaries():
    # 4 heads of 8: heads strategy, 2 heads -> rows 0..15; head-dims, d_qkv 16 -> 4 rows of each head
    assert qkv_rows(Arch(1, 32, 37, 2, 16), 4, 8, "heads").tolist() == list(range(16))
    assert qkv_rows(Arch(1, 32, 37, 4, 16), 4, 8, "head-dims").tolist() == [0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27]


@pytest.mark.parametrize("strategy", ["heads", "head-dims"])
def test_sampler_stays_in_bounds_and_is_seeded(strategy):
    space = SearchSpace.from_supernet(6, 384, 1536, 12, strategy)
    a = [space.sample(random.Random(7)) for _ in range(3)]
    assert a[0] == a[1] == a[2]  # same seed, same draw
    rng = random.Random(3)
    for _ in range(200):
        arch = space.sample(rng)
        assert space.contains(arch)
        assert 1 <= arch.layers <= 6 and 64 <= arch.hidden <= 384 and 64 <= arch.ffn <= 1536
        assert arch.qkv % arch.heads == 0
        if strategy == "heads":
            assert arch.qkv == 32 * arch.heads
        else:
            assert arch.heads == 12
        mutated = space.mutate(arch, 0.5, rng)
        assert space.contains(mutated)
    assert space.mutate(arch, 0.0, rng) == arch  # p_m = 0 changes nothing


def test_bad_configs_and_architectures_fail_with_a_sentence():
    with pytest.raises(Exception, match="does not split into 5 heads"):
        AutoTinyBertConfig(hidden_size=32, qkv_size=32, num_attention_heads=5)
    with pytest.raises(ValueError, match="Unknown attention strategy"):
        SearchSpace.from_supernet(2, 32, 37, 4, "rows")
    net = SuperNet.from_teacher(tiny_teacher())
    from distillery.errors import DistilleryError

    with pytest.raises(DistilleryError, match="not in the super-net's search space"):
        net.extract(Arch(4, 32, 37, 4, 32))


def test_qa_extraction_equals_the_slice():
    net = SuperNet.from_teacher(tiny_teacher(BertForQuestionAnswering), "head-dims").eval()
    arch = Arch(2, 64 // 2, 37, 4, 16)
    model = net.extract(arch)
    with torch.no_grad():
        out, ref = model(**pair_batch()), net(**pair_batch(), arch=arch)
    assert_close(out.start_logits, ref["start_logits"])
    assert_close(out.end_logits, ref["end_logits"])


# ------------------------------------------------------------------------------------------------
# Latency predictor and search (synthetic latencies: no timing in tests)


def synthetic_latency(arch):
    from distillery.autotinybert.latency import arch_flops

    return 0.5 + arch_flops(arch) / 2e6


def test_measure_beside_a_reference_reports_teacher_time_units(monkeypatch):
    import distillery.bench
    from distillery.autotinybert.latency import measure

    class Net:  # extract() is all measure needs of a super-net
        def extract(self, arch):
            return object()

    # the machine runs at half speed "now": both models take twice their time, the ratio stands
    patch_everywhere(monkeypatch, distillery.bench, "latency_ms", lambda models, **kw: {"m": 12.0, "reference": 60.0}
                        if "reference" in models else {"m": 12.0})
    arch = Arch(2, 64, 128, 4, 64)
    assert measure(Net(), [arch], progress=False) == [12.0]
    assert measure(Net(), [arch], progress=False, reference=object(), reference_ms=30.0) == [6.0]


def test_predictor_fits_on_held_out_architectures_and_round_trips(tmp_path):
    from distillery.autotinybert.latency import fit_predictor, load_predictor, mape, save_predictor

    space = SearchSpace.from_supernet(6, 384, 1536, 12, "heads")
    rng = random.Random(0)
    archs = list({space.sample(rng) for _ in range(80)})
    ms = [synthetic_latency(a) for a in archs]
    predictor, report = fit_predictor(space, archs, ms)
    assert report["mape_flops"] < 1.0  # the synthetic latency is affine in FLOPs
    assert report["mape_mlp"] < 10.0
    path = save_predictor(tmp_path / "latency.json", predictor, report, archs, ms, (1, 128), 2)
    again, record = load_predictor(path, space)
    assert record["report"]["measured"] == len(archs)
    assert mape(again.predict(archs), predictor.predict(archs)) < 1e-4


def test_search_never_leaves_the_budget_and_is_seeded(tmp_path):
    from distillery.autotinybert.search import evolutionary_search

    space = SearchSpace.from_supernet(6, 384, 1536, 12, "head-dims")
    budget = synthetic_latency(space.full()) / 3
    size = lambda a: a.layers * a.hidden * a.ffn * a.qkv  # a score that prefers big models: the budget must bind
    first = evolutionary_search(space, size, synthetic_latency, budget, generations=3, population=8, seed=5,
                                log_path=tmp_path / "search.json")
    assert all(c.latency_ms <= budget for c in first.evaluated) and first.best
    assert len(first.evaluated) == len({c.arch for c in first.evaluated})  # each candidate evaluated once
    again = evolutionary_search(space, size, synthetic_latency, budget, generations=3, population=8, seed=5)
    assert [c.arch for c in again.evaluated] == [c.arch for c in first.evaluated]
    import json

    log = json.loads((tmp_path / "search.json").read_text())
    assert len(log["candidates"]) == len(first.evaluated)
    # later generations improve on the first
    gen0 = max(c.score for c in first.evaluated if c.generation == 0)
    assert first.best[0].score >= gen0


def test_search_space_keeps_the_hidden_size_unless_asked_or_out_of_budget():
    import random

    from distillery.autotinybert.options import AutoTinyBertOptions
    from distillery.autotinybert.recipe import search_space

    space = SearchSpace.from_supernet(6, 384, 1536, 12, "head-dims")
    narrowed = search_space(space, AutoTinyBertOptions.read({}), synthetic_latency, synthetic_latency(space.full()) / 4)
    archs = narrowed.sample_distinct(50, random.Random(0))
    assert {a.hidden for a in archs} == {384} and all(space.contains(a) for a in archs)
    assert len({(a.layers, a.ffn, a.qkv) for a in archs}) == len(archs) and narrowed.full() == space.full()
    # search_hidden: the paper's space; a budget no full-width architecture meets: d_m is searched too
    assert search_space(space, AutoTinyBertOptions.read({"search_hidden": True})) == space
    below = synthetic_latency(narrowed.smallest()) * 0.9
    assert search_space(space, AutoTinyBertOptions.read({}), synthetic_latency, below) == space


def test_further_training_rate_grows_with_the_speedup_unless_given():
    """A shallow sub-network's rate (a deep one's: tests/test_deep_cut.py)."""
    from types import SimpleNamespace

    from datasets import Dataset

    from distillery.autotinybert.further import further_defaults
    from distillery.autotinybert.options import AutoTinyBertOptions
    from distillery.config import TrainConfig
    from distillery.data.tasks import get_task

    shape = SimpleNamespace(num_hidden_layers=6, hidden_size=32, num_attention_heads=4)
    ctx = SimpleNamespace(teacher=SimpleNamespace(config=shape), config=SimpleNamespace(student=TrainConfig(lr=1e-4)),
                          task_data=SimpleNamespace(task=get_task("sst2"), train=Dataset.from_dict({"label": [0] * 8})))
    sub = SimpleNamespace(config=SimpleNamespace(**{**vars(shape), "num_hidden_layers": 4}))

    def lr(opts, speedup):
        return further_defaults(ctx, opts, sub, ctx.task_data.train, speedup)[0].settings.get("lr", 1e-4)

    opts = AutoTinyBertOptions.read({})
    assert [lr(opts, s) for s in (1.5, 2.0, 3.0, 4.0, 9.0)] == pytest.approx([1e-4, 1e-4, 2e-4, 3e-4, 3e-4])
    assert lr(AutoTinyBertOptions.read({"further_lr": 5e-5}), 4.0) == 5e-5


def test_search_floor_keeps_candidates_near_the_budget_and_falls_back_when_empty():
    from distillery.autotinybert.search import evolutionary_search

    space = SearchSpace.from_supernet(6, 384, 1536, 12, "head-dims")
    budget = synthetic_latency(space.full()) / 3
    size = lambda a: -a.layers  # a score that prefers small models: only the floor keeps them near the budget
    near = evolutionary_search(space, size, synthetic_latency, budget, generations=2, population=6, seed=1,
                               floor_ms=0.85 * budget)
    assert all(0.85 * budget <= c.latency_ms <= budget for c in near.evaluated)
    free = evolutionary_search(space, size, synthetic_latency, budget, generations=2, population=6, seed=1)
    assert min(c.latency_ms for c in free.evaluated) < 0.85 * budget
    # a floor no architecture reaches is dropped, the budget still binds
    huge = evolutionary_search(space, size, synthetic_latency, budget, generations=1, population=4, seed=1,
                               floor_ms=10 * budget, max_tries=200)
    assert all(c.latency_ms <= budget for c in huge.evaluated)


def test_roulette_never_picks_the_worst_and_mutation_rate():
    from distillery.autotinybert.search import Candidate, roulette

    pop = [Candidate(Arch(1, 64, 64, 1, 32), s, 1.0, 0) for s in (0.1, 0.5, 0.9)]
    rng = random.Random(0)
    picks = [roulette(pop, rng).score for _ in range(2000)]
    assert 0.1 not in picks
    assert picks.count(0.9) > picks.count(0.5)  # weights 0.8 vs 0.4
    space = SearchSpace.from_supernet(6, 384, 1536, 12, "heads")
    arch = space.full()
    changed = sum(space.mutate(arch, 1.0, rng) != arch for _ in range(200))
    assert changed > 150


def test_fast_rule_and_conventional_baseline_respect_their_shapes_and_the_budget():
    from distillery.autotinybert.search import conventional, fast_candidates

    space = SearchSpace.from_supernet(6, 384, 1536, 12, "heads")
    budget = synthetic_latency(space.full()) / 2
    fast = fast_candidates(space, synthetic_latency, budget)
    assert fast and len({a.layers for a in fast}) == len(fast)
    for a in fast:
        assert 1.6 * a.hidden <= a.ffn <= 1.9 * a.hidden and 0.7 * a.hidden <= a.qkv <= a.hidden
        assert synthetic_latency(a) <= budget
    bases = conventional(space, synthetic_latency, budget, k=3)
    assert len(bases) == 3 and bases == sorted(bases, key=synthetic_latency, reverse=True)  # closest first
    for base in bases:
        assert synthetic_latency(base) <= budget
        assert abs(base.ffn - 4 * base.hidden) <= 64 * 2 and abs(base.qkv - base.hidden) <= 32


# ------------------------------------------------------------------------------------------------
# One-shot training (Algorithm 1)


def test_full_size_kd_loss_is_zero_for_a_supernet_cut_from_its_teacher():
    from distillery.autotinybert.oneshot import kd_loss, make_projection, teacher_targets

    teacher = tiny_teacher()
    net = SuperNet.from_teacher(teacher, "head-dims").eval()
    proj = make_projection(net, teacher.config.hidden_size)
    b = pair_batch()
    terms = kd_loss(net, proj, net.space.full(), b, teacher_targets(teacher, b))
    assert terms.hidden.item() < 1e-10 and terms.attention.item() < 1e-10 and abs(terms.prediction.item()) < 1e-6


def test_a_taggers_prediction_kd_is_on_words_only():
    """The one-shot prediction term of a tagger: KL of the teacher's and α's tag distributions on the words' first
    sub-words (the batch's word_mask), zero at full size."""
    from distillery.autotinybert.oneshot import kd_loss, make_projection, teacher_targets
    from distillery.training.losses import kl_divergence

    teacher = tiny_teacher(BertForTokenClassification, num_labels=5)
    net = SuperNet.from_teacher(teacher, "head-dims").eval()
    proj = make_projection(net, teacher.config.hidden_size)
    words = torch.zeros(3, 11, dtype=torch.long)
    words[:, [1, 2, 4, 6]] = 1
    b = {**pair_batch(), "word_mask": words, "labels": torch.where(words.bool(), 1, -100)}
    targets = teacher_targets(teacher, b)
    assert abs(kd_loss(net, proj, net.space.full(), b, targets).prediction.item()) < 1e-6
    arch = net.space.smallest()
    with torch.no_grad():
        got = kd_loss(net, proj, arch, b, targets, temperature=2.0).prediction
        student = net(**pair_batch(), arch=arch)["logits"]
    mask = words.bool()
    assert_close(got, kl_divergence(student[mask], targets.head["logits"][mask], 2.0))


@pytest.mark.parametrize("strategy", ["heads", "head-dims"])
def test_accumulated_gradient_equals_one_backward_per_subnetwork(strategy):
    from distillery.autotinybert.oneshot import batch_rng, kd_loss, make_projection, one_shot_loss, sandwich, teacher_targets

    teacher = tiny_teacher()
    net = SuperNet.from_teacher(teacher, strategy).eval()
    with torch.no_grad():  # move the super-net off its teacher so the loss has gradients everywhere
        for p in net.parameters():
            p.add_(0.05 * torch.randn_like(p))
    proj = make_projection(net, teacher.config.hidden_size)
    b = pair_batch()
    loss, logs = one_shot_loss(teacher, proj, samples=3, seed=4)(net, b)
    loss.backward()
    got = {n: p.grad.clone() for n, p in net.named_parameters() if p.grad is not None}
    net.zero_grad()
    rng, targets = batch_rng(b["input_ids"], 4), teacher_targets(teacher, b)
    archs = sandwich(net.space, rng, 3)
    assert archs[:2] == [net.space.full(), net.space.smallest()]
    for arch in archs:  # the reference: one backward per sub-network, gradients accumulated
        terms = kd_loss(net, proj, arch, b, targets)
        ((terms.hidden + terms.attention + terms.prediction) / 3).backward()
    ref = {n: p.grad for n, p in net.named_parameters() if p.grad is not None}
    assert got.keys() == ref.keys() and len(got) > 10
    assert "head.weight" in got and "bert.pooler.dense.weight" in got  # the prediction KD trains the shared head
    for n in got:
        assert_close(got[n], ref[n], atol=1e-6, rtol=1e-5, msg=n)
    assert logs["hidden"] > 0 and logs["prediction"] > 0


def test_train_supernet_on_a_corpus_saves_a_loadable_supernet(tiny_bert, tmp_path):
    from distillery.autotinybert.oneshot import load_supernet
    from distillery.autotinybert.pretrain import pretrain_supernet
    from distillery.config import TrainConfig

    corpus = write_corpus(tmp_path / "corpus.txt", lines=60)
    train = TrainConfig(epochs=1.0, max_steps=3, batch_size=4, lr=1e-4, select_best=False)
    folder = pretrain_supernet([corpus], tmp_path / "sn", teacher=str(tiny_bert), strategy="heads", train=train,
                               samples=2, max_length=16)
    net = load_supernet(folder)
    assert net.space.strategy == "heads"
    ids = torch.randint(5, 99, (2, 9))
    arch = net.space.sample(random.Random(0))
    with torch.no_grad():
        assert net(ids, arch=arch)["last_hidden_state"].shape == (2, 9, arch.hidden)


# ------------------------------------------------------------------------------------------------
# The method through the pipeline (tiny data, tiny teacher, a handful of steps)


def test_compress_autotinybert_searches_extracts_and_trains(tiny_bert, tmp_path, monkeypatch):
    import json

    import distillery
    from distillery.pipeline import build_run_config, compress

    monkeypatch.setenv("DISTILLERY_CACHE", str(tmp_path / "cache"))
    flop_timed(monkeypatch)
    data = write_glue(tmp_path / "data")
    # budget_floor 0: the floor is tested on synthetic latencies above; this test is about the run's files
    opts = {"supernet_steps": 3, "latency_archs": 10, "generations": 2, "population": 3, "latency_runs": 2,
            "proxy_examples": 16, "speedup": 1.5, "budget_floor": 0}
    config = build_run_config(method="autotinybert", task="sst2", budget="quick", teacher=str(tiny_bert), data_dir=str(data),
                              out=str(tmp_path / "run"), overrides={**TINY_RUN, **{f"method_options.{k}": v for k, v in opts.items()}})
    out = compress(config)
    arch = json.loads((out / "architecture.json").read_text())
    assert arch["predicted_ms"] <= arch["budget_ms"]
    assert (out / "search.json").is_file() and (out / "search.png").is_file() and (out / "latency.json").is_file()
    student = distillery.load_student(out)
    assert type(student).__name__ == "AutoTinyBertForSequenceClassification"
    assert student.config.hidden_size == arch["hidden"] and student.config.qkv_size == arch["qkv"]
    latency = json.loads((out / "latency.json").read_text())
    assert latency["report"]["test"] >= 2 and "mape_mlp" in latency["report"]
    # the default evaluator, the linear probe: held-out log-likelihoods
    assert all(c["score"] <= 0 for c in json.loads((out / "search.json").read_text())["candidates"])

    # A second run on the task starts from this run's super-net (no one-shot phase) and searches with
    # the finetune evaluator: each candidate trained a few steps and scored on held-out train examples.
    again = {**opts, "supernet": str(out / "supernet"), "evaluator": "finetune", "finetune_steps": 2,
             "finetune_examples": 16, "generations": 1, "population": 2}
    config = build_run_config(method="autotinybert", task="sst2", budget="quick", teacher=str(tiny_bert), data_dir=str(data),
                              out=str(tmp_path / "run2"), overrides={**TINY_RUN, **{f"method_options.{k}": v for k, v in again.items()}})
    out2 = compress(config)
    assert not (out2 / "supernet").exists()
    logged = json.loads((out2 / "search.json").read_text())
    scores = [c["score"] for c in logged["candidates"]]
    assert scores and all(0.0 <= s <= 1.0 for s in scores)  # accuracies, not −KD losses
    assert "loaded from" in (out2 / "report.md").read_text()


def test_compress_autotinybert_tags_conll2003(tiny_bert, conll_dir, tmp_path, monkeypatch):
    """AutoTinyBERT end to end on a tagger: a super-net with the token head trained one-shot with the per-word
    prediction KD, the search scoring candidates by a per-word probe, the chosen sub-network extracted into a token
    classifier and trained further with per-word KD; it loads through AutoModelForTokenClassification with its
    tag names, and transformers' pipeline groups its tags into entities."""
    import json

    from transformers import AutoModelForTokenClassification, AutoTokenizer, pipeline

    import distillery
    from distillery.pipeline import build_run_config, compress
    flop_timed(monkeypatch)
    opts = {"supernet_steps": 10, "latency_archs": 10, "generations": 2, "population": 3, "latency_runs": 2,
            "proxy_examples": 16, "probe_examples": 32, "speedup": 1.5, "budget_floor": 0}
    unlabeled = write_unlabeled_sentences(tmp_path / "more.jsonl", 12)
    config = build_run_config(method="autotinybert", task="conll2003", budget="quick", teacher=str(tiny_bert),
                              data_dir=str(conll_dir), out=str(tmp_path / "run"),
                              overrides={**NER_RUN, "data.unlabeled_file": unlabeled,
                                         **{f"method_options.{k}": v for k, v in opts.items()}})
    out = compress(config)
    # sentences without tags, each word tagged by the teacher: in the one-shot phase and the further training
    assert json.loads((out / "train.json").read_text())["student_text"]["unlabeled"] == 12
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["main_metric"] == "entity_f1"
    assert {"entity_f1", "entity_precision", "entity_recall", "token_accuracy"} <= set(metrics["student"])
    assert metrics["teacher"]["entity_f1"] > 0.5 and metrics["student"]["entity_f1"] > 0.3
    assert json.loads((out / "supernet" / "supernet.json").read_text())["head_kind"] == "token_classification"
    # the per-word probe's held-out log-likelihoods (the QA fallback, the KD proxy, would say so in the report)
    assert all(c["score"] <= 0 for c in json.loads((out / "search.json").read_text())["candidates"])
    assert "KD proxy" not in (out / "report.md").read_text()
    distillery.register_models()
    student = AutoModelForTokenClassification.from_pretrained(out / "student").eval()
    arch = json.loads((out / "architecture.json").read_text())
    assert type(student).__name__ == "AutoTinyBertForTokenClassification"
    assert student.config.num_hidden_layers == arch["layers"] and student.config.qkv_size == arch["qkv"]
    assert student.config.id2label[4] == "B-PER" and student.config.label2id["I-LOC"] == 5
    tagger = pipeline("token-classification", model=student, tokenizer=AutoTokenizer.from_pretrained(out / "student"),
                      aggregation_strategy="simple")
    found = tagger(["the actor was born in paris", "where is london"])
    assert {e["entity_group"] for s in found for e in s} <= {"LOC", "ORG", "PER", "MISC"}


def test_the_finetune_evaluator_on_a_tagger_is_refused_before_anything_trains(monkeypatch, capsys, tiny_bert,
                                                                              conll_dir, tmp_path):
    code, _, err = run_cli(monkeypatch, capsys, "compress", "--task", "conll2003", "--data-dir", str(conll_dir),
                           "--teacher", tiny_bert, "--method", "autotinybert", "--option", "evaluator=finetune",
                           "--out", str(tmp_path / "run"))
    assert_one_line_error(code, err, "The finetune evaluator scores classification and regression tasks, not token "
                                     "classification (task conll2003); use evaluator=probe")
    assert not (tmp_path / "run").exists()


def test_probe_evaluator_scores_the_extracted_sub_network_as_sklearn_does_by_hand(tiny_bert, tmp_path):
    """The probe reads α's [CLS] state in the super-net: the same as the extracted standalone model's,
    fitted and scored on the same split as a reference written out by hand."""
    import numpy as np
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    from distillery.autotinybert.recipe import probe_evaluator
    from distillery.config import DataConfig
    from distillery.data import get_task, prepare_task_data
    from distillery.errors import DistilleryError
    from distillery.modeling import load_tokenizer

    data = write_glue(tmp_path / "data", n_train=80)
    tokenizer = load_tokenizer(tiny_bert)
    task_data = prepare_task_data(get_task("sst2"), tokenizer, DataConfig(data_dir=str(data), max_length=16))
    teacher = tiny_teacher(vocab_size=tokenizer.vocab_size)
    net = SuperNet.from_teacher(teacher, "head-dims").eval()
    arch = Arch(2, 24, 20, 4, 16)
    got = probe_evaluator(net, task_data, fit_examples=48, held_examples=16, seed=3)(arch)

    order = random.Random(3).sample(range(80), 80)
    idx = order[16:64] + order[:16]
    rows = task_data.train.select(idx)
    b = task_data.collate([rows[i] for i in range(len(rows))])
    with torch.no_grad():
        cls = net.extract(arch).bert(**{k: b[k] for k in ("input_ids", "attention_mask", "token_type_ids")}).last_hidden_state[:, 0]
    labels = b["labels"].numpy()
    probe = make_pipeline(StandardScaler(), LogisticRegression(C=0.1, max_iter=500)).fit(cls[:48].numpy(), labels[:48])
    want = np.log(probe.predict_proba(cls[48:].numpy())[np.arange(16), labels[48:]] + 1e-9).mean()
    assert abs(got - want) < 1e-4

    one_class = task_data.train.filter(lambda row: row["labels"] == 0)
    with pytest.raises(DistilleryError, match="one class only"):
        probe_evaluator(net, dataclasses.replace(task_data, train=one_class), 16, 8, seed=0)


def test_saved_supernet_with_head_and_projection_reloads_exactly(tmp_path):
    from distillery.autotinybert.oneshot import load_projection, load_supernet, make_projection, save_supernet

    from distillery.errors import DistilleryError

    net = SuperNet.from_teacher(tiny_teacher(), "head-dims").eval()
    projection = make_projection(net, 48)
    save_supernet(net, projection, tmp_path / "sn", facts={"steps": 0})
    again, proj = load_supernet(tmp_path / "sn").eval(), load_projection(tmp_path / "sn")
    assert again.kind is kind_of("classification") and again.space == net.space
    ids = torch.randint(5, 99, (2, 9))
    arch = net.space.sample(random.Random(0))
    with torch.no_grad():
        assert_close(again(ids, arch=arch)["logits"], net(ids, arch=arch)["logits"])
    assert_close(proj.weight, projection.weight)
    with pytest.raises(DistilleryError, match="not a super-net folder"):
        load_supernet(tmp_path)


def test_autotinybert_bad_options_fail_before_training(tiny_bert, tmp_path):
    from distillery.errors import DistilleryError
    from distillery.pipeline import build_run_config, compress

    for bad, match in (({"speedup": 0.5}, "must be above 1"), ({"strategy": "rows"}, "Option strategy must be one of"),
                       ({"arch": "1,2"}, "five integers")):
        config = build_run_config(method="autotinybert", task="sst2", teacher=str(tiny_bert), out=str(tmp_path / "r"),
                                  overrides={f"method_options.{k}": v for k, v in bad.items()})
        with pytest.raises(DistilleryError, match=match):
            compress(config)
    assert not (tmp_path / "r").exists()


def test_optuna_nsga2_backend_respects_the_budget_and_shares_a_journal(tmp_path):
    pytest.importorskip("optuna")
    from distillery.autotinybert.search import optuna_search

    space = SearchSpace.from_supernet(6, 384, 1536, 12, "head-dims")
    budget = synthetic_latency(space.full()) / 3
    size = lambda a: a.layers * a.hidden * a.ffn * a.qkv
    journal = tmp_path / "study.journal"
    first = optuna_search(space, size, synthetic_latency, budget, trials=12, population=4, seed=1, journal=journal)
    assert first.best and all(c.latency_ms <= budget for c in first.best)
    second = optuna_search(space, size, synthetic_latency, budget, trials=6, population=4, seed=2, journal=journal)
    assert len(second.evaluated) == 18  # a second worker continued the same study


def test_cli_steps_supernet_latency_extract(tiny_bert, tmp_path, monkeypatch, capsys):
    """The three step commands through the command line (in this process: each in its own would add seconds
    of imports to a test of the commands)."""
    import json

    corpus = write_corpus(tmp_path / "corpus.txt", lines=40)
    supernet = str(tmp_path / "sn" / "supernet")
    for args in (("pretrain", "--out", str(tmp_path / "sn"), "--corpus", str(corpus), "--teacher", str(tiny_bert),
                  "--max-steps", "2", "--batch-size", "4", "--max-length", "16", "--strategy", "heads"),
                 ("latency", "--supernet", supernet, "--out", str(tmp_path / "lat.json"), "--archs", "10", "--runs", "2",
                  "--seq", "16"),
                 ("extract", "--supernet", supernet, "--arch", "2,32,37,2,16", "--out", str(tmp_path / "small"))):
        code, _, err = run_cli(monkeypatch, capsys, "autotinybert", *args)
        assert code in (0, None), err[-2000:]
    assert json.loads((tmp_path / "lat.json").read_text())["report"]["measured"] == 10
    import distillery

    assert distillery.load_student(tmp_path / "small").config.qkv_size == 16
    code, _, err = run_cli(monkeypatch, capsys, "autotinybert", "extract", "--supernet", supernet, "--arch",
                           "9,32,37,2,16", "--out", str(tmp_path / "bad"))
    assert_one_line_error(code, err, "not in the super-net's search space")


def test_cli_steps_search_then_train(tiny_bert, tmp_path, monkeypatch, capsys):
    """`autotinybert search` leaves a run with the task's super-net and the chosen (untrained) architecture;
    `autotinybert train` extracts it from that super-net and trains it further."""
    import json

    monkeypatch.setenv("DISTILLERY_CACHE", str(tmp_path / "cache"))
    data = write_glue(tmp_path / "data")
    small = ["--option", "supernet_steps=2", "--option", "latency_archs=8", "--option", "latency_runs=1",
             "--option", "generations=1", "--option", "population=2", "--option", "proxy_examples=8",
             "--option", "budget_floor=0"]  # see test_compress_autotinybert_searches_extracts_and_trains
    common = ["--task", "sst2", "--teacher", str(tiny_bert), "--data-dir", str(data), *NO_EXTRAS]  # the steps alone
    # a budget no candidate can miss: this test is about the two steps, not about timing (a loaded machine
    # once measured every tiny candidate over a 1.5× budget and the search rightly found none)
    code, out, err = run_cli(monkeypatch, capsys, "autotinybert", "search", *common, "--option", "budget_ms=10000",
                             "--out", str(tmp_path / "search"), *small)
    assert code in (0, None), err[-2000:]
    assert "No further training" in out
    arch = json.loads((tmp_path / "search" / "architecture.json").read_text())
    text = ",".join(str(arch[k]) for k in ("layers", "hidden", "ffn", "heads", "qkv"))
    code, out, err = run_cli(monkeypatch, capsys, "autotinybert", "train", *common, "--supernet",
                             str(tmp_path / "search" / "supernet"), "--arch", text, "--out", str(tmp_path / "train"),
                             "--option", "latency_runs=1")
    assert code in (0, None), err[-2000:]
    assert "loaded from" in out and "Further training" in out
    # --no-baselines / --no-int8 reach the steps' runs as compress's do
    for step in ("search", "train"):
        config = yaml.safe_load((tmp_path / step / "config.yaml").read_text())
        assert (config["baselines"], config["int8"]) == (False, False), step


# ------------------------------------------------------------------------------------------------
# Rewiring by importance, layers spread as the baseline spreads them


def random_scores(net, seed=3):
    g = torch.Generator().manual_seed(seed)
    c = net.config
    return (torch.rand(c.num_hidden_layers, c.intermediate_size, generator=g),
            torch.rand(c.num_hidden_layers, c.num_attention_heads, generator=g))


@pytest.mark.parametrize("strategy", ["heads", "head-dims"])
def test_rewired_full_size_supernet_equals_the_teacher(strategy):
    teacher = tiny_teacher()
    net = SuperNet.from_teacher(teacher, strategy).eval()
    orders = net.rewire(*random_scores(net))
    assert orders["neurons"][0] != list(range(37)) and orders["heads"][0] != list(range(4))  # something moved
    with torch.no_grad():
        expected = teacher(**pair_batch(), output_hidden_states=True)
        got = net(**pair_batch(), output_hidden_states=True)
    assert_close(got["logits"], expected.logits)
    for a, b in zip(got["hidden_states"], expected.hidden_states):
        assert_close(a, b)


def test_rewired_slice_keeps_the_most_important_units():
    """A rewired sub-network of d_f neurons and h heads equals the teacher with every other neuron and
    head dropped (W2 columns / attention-output columns of the dropped units zeroed: exactly their removal)."""
    teacher = tiny_teacher()
    net = SuperNet.from_teacher(teacher, "heads").eval()
    neurons, heads = random_scores(net)
    net.rewire(neurons, heads)
    arch = Arch(3, 32, 12, 2, 16)
    assert net.space.contains(arch)
    reference = copy.deepcopy(teacher)
    with torch.no_grad():
        for i, layer in enumerate(reference.bert.encoder.layer):
            dropped = torch.argsort(neurons[i], descending=True)[arch.ffn:]
            layer.output.dense.weight[:, dropped] = 0
            dropped_heads = torch.argsort(heads[i], descending=True)[arch.heads:]
            layer.attention.output.dense.weight[:, head_rows(dropped_heads, 8)] = 0
        assert_close(net(**pair_batch(), arch=arch)["logits"], reference(**pair_batch()).logits)
        assert_close(net.extract(arch)(**pair_batch()).logits, reference(**pair_batch()).logits)


@pytest.mark.parametrize("strategy", ["heads", "head-dims"])
def test_the_distill_baselines_shape_is_in_the_space_and_extracts_to_the_baseline_student(strategy):
    from distillery.distill.recipe import build_student, select_layers

    teacher = tiny_teacher(num_hidden_layers=4)
    net = SuperNet.from_teacher(teacher, strategy).eval()
    net.rewire(*random_scores(net))
    full = net.space.full()
    arch = Arch(2, full.hidden, full.ffn, full.heads, full.qkv)
    assert net.space.contains(arch) and sub_layers(2, 4) == select_layers(4, None) == [0, 2]
    student = build_student(teacher, select_layers(4, None)).eval()
    with torch.no_grad():
        expected = student(**pair_batch()).logits
        assert_close(net(**pair_batch(), arch=arch)["logits"], expected)
        assert_close(net.extract(arch)(**pair_batch()).logits, expected)


def test_inplace_distillation_from_an_untrained_supernet_equals_distillation_from_its_teacher():
    """Cut from the teacher, the largest sub-network's outputs are the teacher's: the in-place targets
    then give the same loss and gradients as the teacher's."""
    from distillery.autotinybert.oneshot import make_projection, one_shot_loss

    teacher = tiny_teacher()
    net = SuperNet.from_teacher(teacher, "heads").eval()
    proj = make_projection(net, teacher.config.hidden_size)
    grads = []
    for inplace in (False, True):
        net.zero_grad()
        loss, logs = one_shot_loss(teacher, proj, samples=4, seed=2, inplace=inplace)(net, pair_batch())
        loss.backward()
        grads.append((loss.detach(), {n: p.grad.clone() for n, p in net.named_parameters() if p.grad is not None}))
    assert logs["hidden"] > 0
    assert_close(grads[0][0], grads[1][0])
    for n, g in grads[0][1].items():
        assert_close(grads[1][1][n], g, atol=1e-6, rtol=1e-5, msg=n)


def test_unsupported_teachers_are_refused_by_name_before_any_work(tiny_gpt2):
    from transformers import AlbertConfig, AutoConfig, DebertaV2Config

    from distillery.autotinybert.convert import check_family
    from distillery.errors import DistilleryError

    with pytest.raises(DistilleryError, match="'gpt2' model, not an encoder family"):
        check_family(AutoConfig.from_pretrained(tiny_gpt2))
    with pytest.raises(DistilleryError, match="convolution"):
        check_family(DebertaV2Config(conv_kernel_size=3))
    with pytest.raises(DistilleryError, match="before their LayerNorm"):
        check_family(DebertaV2Config(embedding_size=128))
    with pytest.raises(DistilleryError, match="2 layer groups"):
        check_family(AlbertConfig(num_hidden_groups=2))
    check_family(BertConfig())


def test_search_judges_feasible_seeds_first_and_never_one_over_budget():
    from distillery.autotinybert.search import evolutionary_search

    space = SearchSpace.from_supernet(6, 384, 1536, 12, "heads")
    latency = lambda a: a.layers * (a.hidden + a.ffn + a.qkv) / 1000  # noqa: E731
    inside, over = Arch(3, 384, 1536, 12, 384), Arch(6, 384, 1536, 12, 384)
    budget = latency(inside) * 1.01
    result = evolutionary_search(space, lambda a: -abs(a.hidden - 200), latency, budget, generations=2, population=4,
                                 seed=0, seeds=[inside, over])
    assert result.evaluated[0].arch == inside and result.evaluated[0].generation == 0
    assert over not in {c.arch for c in result.evaluated}


def test_a_supernet_folder_from_the_first_l_layers_era_is_refused(tmp_path):
    import json

    from distillery.autotinybert.oneshot import load_supernet, save_supernet
    from distillery.errors import DistilleryError

    folder = save_supernet(SuperNet.from_teacher(tiny_teacher()), None, tmp_path / "s")
    load_supernet(folder)
    facts = json.loads((folder / "supernet.json").read_text())
    del facts["layer_rule"]
    (folder / "supernet.json").write_text(json.dumps(facts))
    with pytest.raises(DistilleryError, match="first l layers"):
        load_supernet(folder)


@pytest.mark.parametrize("measured, chosen, note", [
    ({"a": 5.0, "b": 9.5, "c": 9.8}, "b", None),  # a is far under the budget: b, the next within the window
    ({"a": 5.0, "b": 6.0}, "a", "under it"),  # none within: the first that meets the budget, with a note
    ({"a": 12.0, "b": 9.2}, "b", None),  # a misses the budget: the next
])
def test_the_student_shipped_is_measured_near_its_budget(monkeypatch, tmp_path, measured, chosen, note):
    """A budget of 10 ms with budget_floor 0.91: the first candidate measured between 9.1 and 10.5 ms ships;
    one far under the budget leaves speed unused and ships only when no candidate lies in the window."""
    from types import SimpleNamespace

    import distillery.autotinybert.latency as latency
    from distillery.autotinybert.recipe import _first_within_budget

    archs = {name: Arch(k + 1, 32, 64, 2, 32) for k, name in enumerate(measured)}
    names = {arch: name for name, arch in archs.items()}
    patch_everywhere(monkeypatch, latency, "measure", lambda supernet, batch, **kw: [measured[names[batch[0]]]])
    ctx = SimpleNamespace(notes=[], out_dir=tmp_path)
    opts = SimpleNamespace(budget_floor=0.91, latency_runs=1, arch=None)
    got = _first_within_budget(ctx, opts, None, list(archs.values()), lambda a: 9.5, None, 20.0, 10.0)
    assert got == archs[chosen]
    assert (note is None) == all("under it" not in n for n in ctx.notes)
    assert '"measured_ms": %s' % measured[chosen] in (tmp_path / "architecture.json").read_text()


def test_no_candidate_meeting_the_budget_is_a_sentence(monkeypatch, tmp_path):
    from types import SimpleNamespace

    import distillery.autotinybert.latency as latency
    from distillery.autotinybert.recipe import _first_within_budget
    from distillery.errors import DistilleryError

    patch_everywhere(monkeypatch, latency, "measure", lambda supernet, batch, **kw: [20.0])
    ctx, opts = SimpleNamespace(notes=[], out_dir=tmp_path), SimpleNamespace(budget_floor=0.91, latency_runs=1, arch=None)
    with pytest.raises(DistilleryError, match="None of the 2 candidates met"):
        _first_within_budget(ctx, opts, None, [Arch(1, 32, 64, 2, 32), Arch(2, 32, 64, 2, 32)], lambda a: 9.5, None,
                             20.0, 10.0)


def test_a_predictor_that_overestimates_is_rescaled_and_the_search_runs_again(monkeypatch, tmp_path):
    """Every searched candidate runs at 0.8 of its predicted latency, under budget_floor of a 10 ms budget: the
    predictor is rescaled by 0.8 and the search, run again with it, finds one that is measured in the window."""
    from types import SimpleNamespace

    import distillery.autotinybert.latency as latency
    import distillery.autotinybert.recipe as recipe

    first = [Arch(2, 32, 64, 2, 32), Arch(3, 32, 64, 2, 32)]
    nearer = Arch(4, 32, 64, 2, 32)
    predicted = {first[0]: 9.5, first[1]: 9.8, nearer: 12.0}
    patch_everywhere(monkeypatch, latency, "measure", lambda supernet, batch, **kw: [0.8 * predicted[batch[0]]])
    searches = []

    def search_again(ctx, opts, supernet, projection, predict, budget):
        searches.append(predict(nearer))
        return [nearer]

    monkeypatch.setattr(recipe, "_searched_candidates", search_again)
    ctx = SimpleNamespace(notes=[], out_dir=tmp_path)
    opts = SimpleNamespace(budget_floor=0.91, latency_runs=1, arch=None)
    got = recipe._measured_choice(ctx, opts, None, None, first, predicted.__getitem__, None, 20.0, 10.0, searched=True)
    assert got == nearer  # measured 9.6 ms
    assert searches == [pytest.approx(9.6)]  # the second search saw the rescaled predictor
    assert any("rescaled by 0.80" in n for n in ctx.notes)
    # the fast and conventional rules are not searched: the first under the floor ships, with its note
    ctx = SimpleNamespace(notes=[], out_dir=tmp_path)
    assert recipe._measured_choice(ctx, opts, None, None, first, predicted.__getitem__, None, 20.0, 10.0,
                                   searched=False) == first[0]
    assert len(searches) == 1 and any("under it" in n for n in ctx.notes)
