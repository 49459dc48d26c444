"""The deep-cut rule (distill/deep_cut.py): the defaults of a layer-drop student keeping fewer than half of its
teacher's layers, and a tiny end-to-end run of such a student."""

import json
import logging

import pytest

from distillery.distill import deep_cut
from distillery.distill.deep_cut import choose_defaults, is_deep_cut, temperature_from_logits, uniform_layer_map
from distillery.kinds import kind_of
from distillery.pipeline import compress
from tests.helpers import tiny_config


@pytest.mark.parametrize("kept, deep", [(1, True), (2, True), (3, False), (4, False), (6, False)])
def test_a_deep_cut_drops_more_than_half_the_layers(kept, deep):
    assert is_deep_cut(kept, 6) is deep


def test_uniform_layer_map_puts_the_last_student_layer_on_the_teachers_last():
    assert uniform_layer_map(2, 6) == [2, 5]
    assert uniform_layer_map(1, 6) == [5]
    assert uniform_layer_map(3, 6) == [1, 3, 5]
    assert uniform_layer_map(3, 12) == [3, 7, 11]


def test_temperature_is_the_softest_that_keeps_the_teacher_decisive():
    # MiniLM on a small 3-class split: logits spanning about ±2.3, mean top-1 0.94 at T = 1, 0.74 at T = 2
    assert temperature_from_logits([[2.3, -1.15, -1.15], [-1.15, 2.3, -1.15]]) == 1.0
    # a confident teacher: its other classes only show when softened (top-1 0.92 at T = 4)
    assert temperature_from_logits([[10.0, 0.0], [0.0, 10.0]]) == 4.0
    assert temperature_from_logits([[5.0, 0.0]]) == 2.0  # 0.92 at T = 2, 0.78 at T = 4
    # a teacher that is never decisive (RTE: logits within ±0.4) is not softened further
    assert temperature_from_logits([[0.4, -0.4], [-0.3, 0.3]]) == 1.0
    assert temperature_from_logits([]) == deep_cut.FALLBACK_TEMPERATURE


def test_a_shallow_cut_keeps_the_earlier_defaults():
    chosen = choose_defaults(6, 3, budget_steps=100, teacher_logits=[[0.4, -0.4]])
    assert (chosen.temperature, chosen.hidden_weight, chosen.hidden_layers, chosen.min_steps, chosen.lr_scale,
            chosen.attention_weight, chosen.kd_weight) == (2.0, 0.0, None, 0, 1.0, 0.0, 0.5)
    assert chosen.reasons == {}


def test_a_deep_cut_on_a_small_split_gets_hidden_and_attention_distillation_and_more_steps():
    chosen = choose_defaults(6, 2, budget_steps=234, teacher_logits=[[0.4, -0.4]])
    assert chosen.temperature == 1.0
    assert chosen.hidden_weight == deep_cut.DEEP_CUT_HIDDEN_WEIGHT > 0
    assert chosen.attention_weight == deep_cut.DEEP_CUT_ATTENTION_WEIGHT > 0
    assert chosen.hidden_layers == [2, 5]
    assert chosen.min_steps == deep_cut.MIN_STEPS > 234
    assert chosen.lr_scale == deep_cut.LR_SCALE > 1
    assert chosen.kd_weight == deep_cut.DEEP_CUT_KD_WEIGHT == 1.0, "the teacher's outputs only"
    assert set(chosen.reasons) == {"kd_weight", "temperature", "hidden_weight", "attention_weight", "min_steps",
                                   "lr_scale"}
    assert "234" in chosen.reasons["min_steps"]


def test_a_deep_cut_on_a_large_split_keeps_its_steps():
    chosen = choose_defaults(6, 1, budget_steps=2100, teacher_logits=[[0.4, -0.4]])
    assert chosen.hidden_layers == [5] and chosen.min_steps < 2100
    assert "min_steps" not in chosen.reasons


def test_regression_and_qa_have_no_logits_to_read_the_temperature_from():
    for kind in ("regression", "qa"):
        chosen = choose_defaults(6, 2, budget_steps=100, teacher_logits=None, softened=kind_of(kind).softened_outputs)
        assert chosen.temperature == deep_cut.FALLBACK_TEMPERATURE and "temperature" not in chosen.reasons
        # the label term stays where the rule's evidence is logits only
        assert chosen.kd_weight == deep_cut.KD_WEIGHT and "kd_weight" not in chosen.reasons


@pytest.mark.parametrize("kept", [0, 7])
def test_impossible_cuts_are_refused(kept):
    with pytest.raises(ValueError):
        choose_defaults(6, kept, budget_steps=10)


@pytest.mark.parametrize("augment", [None, 0])
def test_a_deep_cut_run_end_to_end(augment, tiny_bert4, glue_dir, tmp_path, caplog, monkeypatch):
    """1 of 4 layers: the student keeps the teacher's last layer and takes the rule's hidden term (onto that
    layer), temperature and longer schedule, says so in the report's notes, and the training log shows the KL
    beside the soft CE. Unless told otherwise (augment 0), the small split gets the rule's augmented rows, read
    deep_cut.AUGMENTED_PASSES times."""
    monkeypatch.setattr(deep_cut, "MIN_STEPS", 24)  # the budget gives 12 (96 examples, batches of 16, 2 epochs)
    settings = {"method_options.student_layers": 1, "student.eval_every": None, "student.log_every": 1,
                **({} if augment is None else {"method_options.augment": augment})}
    with caplog.at_level(logging.INFO, logger="distillery"):
        out = compress(tiny_config(tiny_bert4, glue_dir, tmp_path / "deep", **settings))
    notes = json.loads((out / "train.json").read_text())["notes"]
    assert any("teacher layers [3] of 4" in n and "hidden MSE (student layers onto teacher layers [3])" in n
               and "attention KL (the same layers)" in n for n in notes), notes
    assert any(n.startswith("Defaults for this cut: T = ") for n in notes)
    assert any("(1-1)·CE + 1·KD(T=" in n for n in notes), "a deep cut learns the teacher's outputs only"
    assert any(n.startswith("Defaults for this cut: kd_weight 1: ") for n in notes)
    # a pass over 96 rows and 8 new ones each, in batches of 16: 54 steps; without them the rule's 24
    steps_taken = 24 if augment == 0 else 54 * deep_cut.AUGMENTED_PASSES
    augmented = [n for n in notes if "8 augmented rows per train row" in n]
    assert bool(augmented) is (augment is None), notes
    assert any("24 optimizer steps instead of the budget's 12" in n for n in notes) is (augment == 0)
    steps = [r.getMessage() for r in caplog.records if r.getMessage().startswith("student step ") and " | kl " in
             r.getMessage()]
    assert steps[-1].startswith(f"student step {steps_taken}/{steps_taken}") and " | hidden " in steps[-1]
    assert " | attention " in steps[-1]
    lr = [float(line.split(" | lr ")[1].split()[0]) for line in steps]
    assert lr[0] < lr[1] < lr[2], "the first 10 % of the steps warm up"
    assert max(lr) == pytest.approx(deep_cut.LR_SCALE * 1e-3), "the budget's learning rate, scaled"


def test_a_deep_cut_on_a_small_split_gets_augmented_rows_unless_the_kind_cannot_take_them():
    assert deep_cut.default_augment(2, 6, 2490, True)[0] == deep_cut.DEEP_CUT_AUGMENT
    assert deep_cut.default_augment(2, 6, deep_cut.SMALL_SPLIT_ROWS, True) == (0, None)  # a split the budget cut
    assert deep_cut.default_augment(3, 6, 2490, True) == (0, None)  # a shallow cut
    assert deep_cut.default_augment(2, 6, 2490, kind_of("qa").augments_by_default) == (0, None)


def _further_ctx(teacher_layers=6, width=32, heads=4, rows=200):
    """What autotinybert's further training reads of its run: the teacher's shape, the budget's student settings,
    the task's kind and a train split with the teacher's logits (close together: a soft teacher)."""
    from types import SimpleNamespace

    from datasets import Dataset

    from distillery.config import TrainConfig
    from distillery.data.tasks import get_task

    train = Dataset.from_dict({"teacher_logits": [[0.4, -0.4]] * rows, "label": [0] * rows})
    teacher = SimpleNamespace(config=SimpleNamespace(num_hidden_layers=teacher_layers, hidden_size=width,
                                                     num_attention_heads=heads))
    task = get_task("sst2")
    ctx = SimpleNamespace(teacher=teacher, config=SimpleNamespace(student=TrainConfig(lr=1e-4, batch_size=16)),
                          task_data=SimpleNamespace(task=task, train=train))
    return ctx, train


def _sub_network(layers, width=32, heads=4):
    from types import SimpleNamespace

    return SimpleNamespace(config=SimpleNamespace(num_hidden_layers=layers, hidden_size=width, num_attention_heads=heads))


def test_autotinybert_further_training_of_a_deep_sub_network_takes_the_rule():
    """2 of 6 layers at the teacher's width and heads: the rule's temperature, hidden and attention terms onto
    the top-of-block teacher layers (the super-net layers the sub-network runs), longer warmed-up schedule and
    scaled learning rate, each said in a note; an option given turns its choice off."""
    from distillery.autotinybert.further import further_augment, further_defaults
    from distillery.autotinybert.options import AutoTinyBertOptions
    from distillery.autotinybert.supernet import sub_layers

    ctx, train = _further_ctx()
    opts = AutoTinyBertOptions.read({})
    chosen, notes = further_defaults(ctx, opts, _sub_network(2), train, speedup=2.0)
    assert chosen.hidden_layers == sub_layers(2, 6) == uniform_layer_map(2, 6) == [2, 5]
    assert (chosen.temperature, chosen.hidden_weight, chosen.attention_weight) == (
        1.0, deep_cut.DEEP_CUT_HIDDEN_WEIGHT, deep_cut.DEEP_CUT_ATTENTION_WEIGHT)
    assert chosen.settings == {"lr": pytest.approx(deep_cut.LR_SCALE * 1e-4), "max_steps": deep_cut.MIN_STEPS,
                               "warmup_ratio": deep_cut.WARMUP}
    assert chosen.kd_weight == deep_cut.DEEP_CUT_KD_WEIGHT
    assert len(notes) == 6 and all(n.startswith("Defaults for this cut: ") for n in notes)
    assert further_augment(ctx, opts, 2)[0] == deep_cut.DEEP_CUT_AUGMENT  # a small split
    assert opts.kd_share() == deep_cut.KD_WEIGHT, "the search's fine-tuning keeps the label term"
    given = AutoTinyBertOptions.read({"kd_weight": 0.3, "temperature": 2.0, "hidden_weight": 0, "attention_weight": 0,
                                      "min_steps": 0, "further_lr": 5e-5, "augment": 0})
    chosen, notes = further_defaults(ctx, given, _sub_network(2), train, speedup=2.0)
    assert (chosen.kd_weight, chosen.temperature, chosen.hidden_weight, chosen.attention_weight, chosen.settings,
            notes) == (0.3, 2.0, 0.0, 0.0, {"lr": 5e-5}, [])
    assert given.kd_share() == 0.3
    assert further_augment(ctx, given, 2) == (0, None)


def test_autotinybert_further_training_of_a_shallow_sub_network_keeps_the_earlier_defaults():
    from distillery.autotinybert.further import further_augment, further_defaults
    from distillery.autotinybert.options import AutoTinyBertOptions

    ctx, train = _further_ctx()
    opts = AutoTinyBertOptions.read({})
    chosen, notes = further_defaults(ctx, opts, _sub_network(3), train, speedup=4.0)
    assert (chosen.temperature, chosen.hidden_weight, chosen.attention_weight, notes) == (2.0, 0.0, 0.0, [])
    assert chosen.settings == {"lr": pytest.approx(3e-4)}  # the speed-up's scale: (4 − 1)
    assert further_defaults(ctx, opts, _sub_network(3), train, speedup=1.5)[0].settings == {}
    assert further_augment(ctx, opts, 3) == (0, None)


def test_autotinybert_further_training_leaves_out_the_terms_a_narrower_sub_network_cannot_take():
    """The hidden term compares states of one width, the attention term head by head: a deep sub-network of
    another width or head count keeps the rest of the rule and says which term it left out."""
    from distillery.autotinybert.further import further_defaults
    from distillery.autotinybert.options import AutoTinyBertOptions

    ctx, train = _further_ctx()
    opts = AutoTinyBertOptions.read({})
    chosen, notes = further_defaults(ctx, opts, _sub_network(1, width=24, heads=2), train, speedup=4.0)
    assert (chosen.temperature, chosen.hidden_weight, chosen.attention_weight) == (1.0, 0.0, 0.0)
    assert chosen.settings["max_steps"] == deep_cut.MIN_STEPS
    assert "width 24 is not the teacher's 32" in notes[-2] and "2 heads are not the teacher's 4" in notes[-1]
    chosen, notes = further_defaults(ctx, opts, _sub_network(1, heads=2), train, speedup=4.0)
    assert (chosen.hidden_weight, chosen.attention_weight) == (deep_cut.DEEP_CUT_HIDDEN_WEIGHT, 0.0)
    assert chosen.hidden_layers == [5]


def test_autotinybert_refuses_two_learning_rates_in_one_sentence():
    from distillery.autotinybert.options import AutoTinyBertOptions
    from distillery.errors import DistilleryError

    with pytest.raises(DistilleryError, match="further_lr and lr_scale"):
        AutoTinyBertOptions.read({"further_lr": 1e-4, "lr_scale": 2})


def test_autotinybert_further_training_of_a_deep_sub_network_end_to_end(tiny_bert4, glue_dir, tmp_path, caplog,
                                                                         monkeypatch):
    """1 of 4 layers at full width (the super-net's top layer): the further training takes the rule's hidden and
    attention terms onto teacher layer 3, its temperature, learning rate and augmented rows read twice, and the
    report's notes say so."""
    monkeypatch.setenv("DISTILLERY_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(deep_cut, "MIN_STEPS", 24)
    settings = {"method_options.arch": "1,32,37,4,32", "method_options.supernet_steps": 2,
                "method_options.rewire": False, "student.eval_every": None, "student.log_every": 1}
    with caplog.at_level(logging.INFO, logger="distillery"):
        out = compress(tiny_config(tiny_bert4, glue_dir, tmp_path / "atb", method="autotinybert", **settings))
    notes = json.loads((out / "train.json").read_text())["notes"]
    assert any(n.startswith("Further training: ") and "hidden MSE (sub-network layers onto teacher layers [3])" in n
               and "attention KL (the same layers)" in n for n in notes), notes
    assert any(n.startswith("Defaults for this cut: T = ") for n in notes)
    assert any("(1-1)·CE + 1·KD(T=" in n for n in notes), "a deep cut learns the teacher's outputs only"
    assert any(n.startswith("Defaults for this cut: kd_weight 1: ") for n in notes)
    assert any("8 augmented rows per train row" in n for n in notes), notes
    steps = [r.getMessage() for r in caplog.records if r.getMessage().startswith("autotinybert step ")
             and " | lr " in r.getMessage()]
    assert steps[-1].startswith(f"autotinybert step {54 * deep_cut.AUGMENTED_PASSES}/") and " | hidden " in steps[-1]
    assert " | attention " in steps[-1]
    lr = [float(line.split(" | lr ")[1].split()[0]) for line in steps]
    assert max(lr) == pytest.approx(deep_cut.LR_SCALE * 1e-3), "the budget's learning rate, scaled"


def test_a_model_pruned_past_2x_is_as_deep_a_cut_as_the_layer_drop_student_of_its_speed():
    assert [deep_cut.equivalent_layers(s, 6) for s in (1.2, 2.0, 2.2, 3.0, 4.0, 8.0)] == [5, 3, 3, 2, 2, 1]
    assert deep_cut.equivalent_layers(4.0, 12) == 3 and deep_cut.equivalent_layers(100.0, 12) == 1
    assert [deep_cut.is_deep_cut(deep_cut.equivalent_layers(s, 6), 6) for s in (2.0, 4.0, 8.0)] == [False, True, True]


def test_prune_fine_tuning_past_2x_takes_the_rule_onto_the_layers_it_pruned():
    """4x of a 6-layer teacher: the rule's temperature, hidden term (each kept layer onto the teacher layer it was
    pruned from; no attention term), schedule, learning rate and augmentation, each said in a note; at 2x the earlier
    defaults; an option given turns its choice off."""
    from distillery.prune.options import PruneOptions
    from distillery.prune.recipe import finetune_augment, finetune_defaults

    ctx, train = _further_ctx()
    opts = PruneOptions.read({"speedup": 4.0})
    pruned = _sub_network(5)  # layer 3 lost both of its sub-layers
    chosen, notes = finetune_defaults(ctx, opts, pruned, [0, 1, 2, 4, 5], train, "augmented")
    assert (chosen.kd_weight, chosen.temperature, chosen.hidden_weight, chosen.attention_weight) == (
        deep_cut.DEEP_CUT_KD_WEIGHT, 1.0, deep_cut.DEEP_CUT_HIDDEN_WEIGHT, 0.0)
    assert chosen.hidden_layers == [0, 1, 2, 4, 5]
    assert chosen.settings == {"lr": pytest.approx(deep_cut.LR_SCALE * 1e-4), "max_steps": deep_cut.MIN_STEPS,
                               "warmup_ratio": deep_cut.WARMUP}
    assert all(n.startswith("Defaults for a model pruned to 4x (as deep a cut as a layer-drop student of 2 of 6")
               for n in notes) and any("pruned from" in n for n in notes) and notes[-1].endswith("augmented.")
    assert finetune_augment(ctx, opts)[0] == deep_cut.DEEP_CUT_AUGMENT  # a small split
    shallow = PruneOptions.read({"speedup": 2.0})
    chosen, notes = finetune_defaults(ctx, shallow, _sub_network(6), list(range(6)), train, None)
    assert (chosen.kd_weight, chosen.temperature, chosen.hidden_weight, chosen.settings, notes) == (
        deep_cut.KD_WEIGHT, 2.0, 0.0, {}, [])
    assert finetune_augment(ctx, shallow) == (0, None)
    given = PruneOptions.read({"speedup": 4.0, "kd_weight": 0.5, "temperature": 2.0, "hidden_weight": 0, "min_steps": 0,
                               "lr_scale": 1, "augment": 0})
    chosen, notes = finetune_defaults(ctx, given, pruned, [0, 1, 2, 4, 5], train, None)
    assert (chosen.kd_weight, chosen.temperature, chosen.hidden_weight, chosen.settings, notes) == (
        0.5, 2.0, 0.0, {}, [])
    assert finetune_augment(ctx, given) == (0, None)
    # the full mode pruned the hidden dimension: the term on the teacher's dimensions kept (finetune_loss), said so
    narrow = _sub_network(6, width=24)
    chosen, notes = finetune_defaults(ctx, opts, narrow, list(range(6)), train, None)
    assert chosen.hidden_weight == deep_cut.DEEP_CUT_HIDDEN_WEIGHT
    assert any("on the 24 of its 32 dimensions kept" in n for n in notes)


def test_an_embedder_is_pruned_keeping_half_its_heads_and_fine_tuned_onto_its_layers_at_any_speedup():
    """The embedding kind's prune defaults (kinds/embedding.py, measured on held-out rows): each layer keeps half its
    heads and the 2x fine-tuning has the hidden-state term; a sentence task neither; an option given wins."""
    from distillery.data.tasks import get_task
    from distillery.prune.options import PruneOptions
    from distillery.prune.recipe import finetune_defaults, with_head_floor

    for task, floor, weight in (("embedding", 2, 1.0), ("sst2", 0, 0.0)):
        ctx, train = _further_ctx()
        ctx.task_data.task, ctx.notes = get_task(task), []
        opts = with_head_floor(ctx, PruneOptions.read({"speedup": 2.0}))
        assert opts.min_heads == floor and (("Head floor" in ctx.notes[-1]) if floor else not ctx.notes)
        chosen, notes = finetune_defaults(ctx, opts, _sub_network(6), list(range(6)), train, None)
        assert chosen.hidden_weight == weight and chosen.hidden_layers == list(range(6)), task
        assert any("the embedding kind at any speed-up" in n for n in notes) == bool(weight)
        given = with_head_floor(ctx, PruneOptions.read({"speedup": 2.0, "min_heads": 0, "hidden_weight": 0}))
        assert given.min_heads == 0
        assert finetune_defaults(ctx, given, _sub_network(6), list(range(6)), train, None)[0].hidden_weight == 0.0
