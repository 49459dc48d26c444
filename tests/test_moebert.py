"""MoEBERT: equivalences of the conversion, dispatch against a per-token loop, importance against
per-example autograd, routing, save/load, bad options, and the method end to end on tiny data."""

import json

import pytest
import torch
import yaml
from torch.testing import assert_close
from transformers import (
    AutoModelForSequenceClassification,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    RobertaForSequenceClassification,
)

import distillery
from distillery.data.encode import PadCollator
from distillery.errors import DistilleryError
from distillery.moebert.convert import (balanced_hash_table, convert, count_tokens, dense_ffns, expert_indices,
                                        neuron_ranking)
from distillery.importance import ffn_importance
from distillery.moebert.modeling_moebert import MoEBertForSequenceClassification, plan_dispatch, shared_default
from distillery.method import preset_settings
from distillery.moebert.recipe import distilled_layers, layerwise_distillation_loss
from distillery.pipeline import build_run_config, compress

from tests.oracles import moe_ffn_reference, reference_importance
from tests.helpers import (NER_RUN, TINY_BERT, TINY_RUN, Examples, collate, examples, tiny_bert_config, tiny_config,
                           tiny_teacher, write_squad, write_unlabeled_sentences)

D_H = TINY_BERT["intermediate_size"]


def batch(seed=0, bsz=3, seq=11, vocab=99):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab, (bsz, seq), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0
    ids[1, 7:] = 0
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}


IMPORTANCE = torch.rand(2, D_H, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("shared", [0, 5, D_H])
@pytest.mark.parametrize("mode", ["tied", "cloned"])
def test_one_expert_holding_the_whole_ffn_is_the_teacher(shared, mode):
    teacher = tiny_teacher()
    student = convert(teacher, IMPORTANCE, num_experts=1, expert_size=D_H, shared_size=shared, shared_mode=mode)
    x = batch()
    assert_close(student(**x).logits, teacher(**x).logits)


@pytest.mark.parametrize("routing", ["hash-r", "hash-b", "gate"])
def test_everything_shared_is_the_teacher_for_every_routing(routing):
    teacher = tiny_teacher()
    counts = torch.arange(99)
    student = convert(teacher, IMPORTANCE, num_experts=4, expert_size=D_H, shared_size=D_H, routing=routing,
                      gate_scale="straight-through", token_counts=counts)
    x = batch()
    assert_close(student(**x).logits, teacher(**x).logits)


def test_everything_shared_counts_the_teachers_flops():
    """The FLOP counter sees every matmul of the dispatch, the in-place accumulation included: with
    every neuron shared the student does exactly the teacher's work."""
    from distillery.bench import flops_per_token

    teacher = tiny_teacher()
    student = convert(teacher, IMPORTANCE, num_experts=4, expert_size=D_H, shared_size=D_H)
    assert flops_per_token(student, seq=12) == flops_per_token(teacher, seq=12)


def test_gate_with_probability_scaling_scales_the_ffn_output():
    """The paper's gate multiplies the expert's output by its probability: with every neuron
    shared, the FFN output is exactly p times the teacher's."""
    teacher = tiny_teacher()
    student = convert(teacher, IMPORTANCE, num_experts=4, expert_size=D_H, shared_size=D_H, routing="gate")
    layer, dense = student.moe_layers[0], teacher.bert.encoder.layer[0]
    a = torch.randn(3, 5, 32)
    mask = torch.ones(3, 5)
    expert, p, _ = layer.gate(a, mask)
    ffn = dense.output.dense(dense.intermediate(a))
    assert_close(layer.experts(a, plan_dispatch(expert[:, None].expand(3, 5).reshape(1, -1), 4)[0], scale=p),
                 ffn * p[:, None, None])


def test_tied_and_cloned_agree_right_after_conversion():
    teacher = tiny_teacher()
    tied = convert(teacher, IMPORTANCE, num_experts=4, expert_size=9, shared_size=4, shared_mode="tied")
    cloned = convert(teacher, IMPORTANCE, num_experts=4, expert_size=9, shared_size=4, shared_mode="cloned")
    x = batch()
    assert_close(tied(**x).logits, cloned(**x).logits)
    assert sum(p.numel() for p in tied.parameters()) < sum(p.numel() for p in cloned.parameters())
    assert tied.num_effective_parameters() == cloned.num_effective_parameters()


def test_expert_index_sets_follow_the_paper_rule():
    # neuron j has importance 10 - j for j < 10: ranks 0..9 are neurons 0..9
    importance = torch.tensor([10.0 - j for j in range(10)])
    shared, own = expert_indices(neuron_ranking(importance), num_experts=2, expert_size=4, shared_size=2)
    assert shared.tolist() == [0, 1]
    # expert e (1-based in the paper) takes ranks s+e, s+e+N, ...: neurons (3, 5) and (4, 6) with 1-based ranks
    assert own.tolist() == [[2, 4], [3, 5]]
    inverse_shared, _ = expert_indices(neuron_ranking(importance, "inverse"), 2, 4, 2)
    assert inverse_shared.tolist() == [9, 8]
    random_shared, _ = expert_indices(neuron_ranking(importance, "random", seed=3), 2, 4, 2)
    assert random_shared.tolist() == neuron_ranking(importance, "random", seed=3)[:2].tolist()


def test_shared_default_is_a_sixth_rounded_to_eight():
    assert shared_default(3072) == 512 and shared_default(1536) == 256


def test_one_expert_shape_resolver_for_the_method_and_the_conversion():
    """d_e defaults to d_h / N and s to shared_default capped at d_e, alike in the method's options and in
    convert(); an impossible shape is the same sentence from both, and the config's ValueError says it too."""
    from distillery.moebert.modeling_moebert import MoEBertConfig, resolve_expert_shape
    from distillery.moebert.recipe import MoEBertOptions, expert_shape

    assert resolve_expert_shape(3072, 4) == (4, 768, 512) and resolve_expert_shape(1536, 4) == (4, 384, 256)
    assert resolve_expert_shape(1536, 8, 100) == (8, 100, 100)  # the default s (256) capped at d_e
    assert resolve_expert_shape(D_H, 4, 6) == expert_shape(MoEBertOptions(experts=4, expert_size=6), D_H) == (4, 6, 6)
    student = convert(tiny_teacher(), IMPORTANCE, num_experts=4, expert_size=6)
    assert (student.config.expert_size, student.config.shared_size) == (6, 6)
    with pytest.raises(DistilleryError, match="at least 1, got 0"):
        resolve_expert_shape(D_H, 0)
    with pytest.raises(DistilleryError, match="at least 1, got 0"):  # not a division by zero
        convert(tiny_teacher(), IMPORTANCE, num_experts=0)
    with pytest.raises(ValueError, match="need 0 \\+ 4×12 = 48 distinct neurons"):
        MoEBertConfig(encoder_config=tiny_teacher().config, num_experts=4, expert_size=12, shared_size=0)


@pytest.mark.parametrize("mode", ["tied", "cloned"])
def test_dispatch_equals_a_per_token_loop(mode):
    teacher = tiny_teacher()
    student = convert(teacher, IMPORTANCE, num_experts=3, expert_size=9, shared_size=3, shared_mode=mode)
    ffn = student.moe_layers[0].experts
    x = torch.randn(2, 13, 32)
    experts = torch.randint(0, 3, (2, 13))
    experts[0, :] = 1  # an expert with many tokens and one with few
    got = ffn(x, plan_dispatch(experts.reshape(1, -1), 3)[0])
    assert_close(got, moe_ffn_reference(ffn, x, experts))


def test_padding_takes_no_expert_slots():
    teacher = tiny_teacher()
    student = convert(teacher, IMPORTANCE, num_experts=3, expert_size=9, shared_size=3)
    ffn = student.moe_layers[0].experts
    x = torch.randn(2, 10, 32)
    experts = torch.randint(0, 3, (2, 10))
    valid = torch.ones(2, 10, dtype=torch.long)
    valid[1, 4:] = 0
    experts[1, 4:] = 0  # the padding id hashes to one expert: it must not crowd that expert's slots
    plan = plan_dispatch(experts.reshape(1, -1), 3, valid.reshape(-1))[0]
    assert plan.load.tolist() == [int(((experts == e) & valid.bool()).sum()) for e in range(3)]
    assert plan.capacity == int(plan.load.max())
    got = ffn(x, plan)
    real = valid.bool()
    assert_close(got[real], moe_ffn_reference(ffn, x, experts)[real])


def test_plans_for_several_layers_each_take_their_own_capacity():
    """All layers are planned together (hash routing): every row's plan routes like the per-token
    loop, padding included, with the capacity of its own busiest expert (padded slots are matmul rows)."""
    teacher = tiny_teacher()
    student = convert(teacher, IMPORTANCE, num_experts=3, expert_size=9, shared_size=3)
    ffn = student.moe_layers[0].experts
    x = torch.randn(2, 7, 32)
    experts = torch.randint(0, 3, (4, 2, 7))
    experts[2, :, :] = 2  # one row with every token on one expert: the others keep their smaller capacities
    valid = torch.ones(2, 7, dtype=torch.long)
    valid[0, 5:] = 0
    plans = plan_dispatch(experts.reshape(4, -1), 3, valid.reshape(-1))
    real = valid.bool()
    assert plans[2].capacity == int(real.sum())
    for row, plan in zip(experts, plans):
        assert plan.load.tolist() == [int(((row == e) & real).sum()) for e in range(3)]
        assert plan.capacity == max(plan.load.tolist())
        assert_close(ffn(x, plan)[real], moe_ffn_reference(ffn, x, row)[real])


@pytest.mark.parametrize("mode", ["tied", "cloned"])
def test_dispatch_gradients_equal_the_per_token_loop(mode):
    """Training goes through the same gathers and in-place accumulation: the gradients of the input
    and of every expert weight equal the per-token loop's, with padding in the batch."""
    teacher = tiny_teacher()
    student = convert(teacher, IMPORTANCE, num_experts=3, expert_size=9, shared_size=3, shared_mode=mode)
    ffn = student.moe_layers[0].experts
    x = torch.randn(2, 6, 32)
    experts = torch.randint(0, 3, (2, 6))
    valid = torch.ones(2, 6, dtype=torch.long)
    valid[1, 4:] = 0
    weight = torch.randn(2, 6, 32) * valid.unsqueeze(-1)  # a loss that ignores padding

    def grads(run):
        xi = x.clone().requires_grad_(True)
        ffn.zero_grad()
        (run(xi) * weight).sum().backward()
        return [xi.grad] + [p.grad.clone() for p in ffn.parameters()]

    fast = grads(lambda xi: ffn(xi, plan_dispatch(experts.reshape(1, -1), 3, valid.reshape(-1))[0]))
    slow = grads(lambda xi: moe_ffn_reference(ffn, xi, experts))
    for a, b in zip(fast, slow):
        assert_close(a, b)


@pytest.mark.parametrize("routing", ["hash-r", "gate"])
def test_runs_under_autocast(routing):
    """Mixed precision (accelerate's bf16/fp16) autocasts the matmuls; the in-place accumulation of the
    shared block must follow their dtype."""
    teacher = tiny_teacher()
    student = convert(teacher, IMPORTANCE, num_experts=3, expert_size=9, shared_size=3, routing=routing).eval()
    ids = torch.randint(0, 50, (2, 7))
    with torch.no_grad():
        full = student(input_ids=ids).logits
        for batch in (ids, ids[:1]):  # the gate at batch 1 runs its expert densely
            with torch.autocast("cpu", dtype=torch.bfloat16):
                low = student(input_ids=batch).logits
            assert_close(low.float(), full[:len(batch)], atol=0.1, rtol=0.1)


def test_sentence_gate_at_batch_one_equals_the_batched_path():
    teacher = tiny_teacher()
    student = convert(teacher, IMPORTANCE, num_experts=4, expert_size=9, shared_size=3, routing="gate")
    x = batch(bsz=3)
    together = student(**x).logits
    alone = torch.cat([student(**{k: v[i:i + 1] for k, v in x.items()}).logits for i in range(3)])
    assert_close(alone, together)


@pytest.mark.parametrize("routing", ["hash-r", "gate"])
def test_padding_never_changes_a_real_tokens_output(routing):
    teacher = tiny_teacher()
    student = convert(teacher, IMPORTANCE, num_experts=4, expert_size=9, shared_size=3, routing=routing)
    ids = torch.randint(5, 99, (1, 7))
    short = student(input_ids=ids, attention_mask=torch.ones_like(ids), output_hidden_states=True)
    padded_ids = torch.cat([ids, torch.zeros(1, 5, dtype=torch.long)], 1)
    mask = torch.cat([torch.ones(1, 7, dtype=torch.long), torch.zeros(1, 5, dtype=torch.long)], 1)
    long = student(input_ids=padded_ids, attention_mask=mask, output_hidden_states=True)
    assert_close(long.hidden_states[-1][:, :7], short.hidden_states[-1])
    assert_close(long.logits, short.logits)


def test_balanced_hash_spreads_frequent_tokens_and_places_unseen_ones():
    counts = torch.zeros(20, dtype=torch.long)
    counts[:8] = torch.tensor([100, 90, 80, 70, 60, 50, 40, 30])
    table = balanced_hash_table(counts, 2)
    loads = [int(counts[table == e].sum()) for e in range(2)]
    assert abs(loads[0] - loads[1]) <= 30  # greedy: no worse than the smallest item
    assert table[8:].tolist() == [i % 2 for i in range(8, 20)]  # unseen: id mod N, deterministic
    assert torch.equal(balanced_hash_table(counts, 2), table)
    assert count_tokens([[1, 2, 2], [2]], 4).tolist() == [0, 1, 3, 0]


@pytest.mark.parametrize("routing", ["hash-b", "gate"])
def test_save_load_keeps_routing(routing, tmp_path):
    teacher = tiny_teacher()
    student = convert(teacher, IMPORTANCE, num_experts=4, expert_size=9, shared_size=3, routing=routing,
                      token_counts=torch.arange(99))
    with torch.no_grad():
        for layer in student.moe_layers:
            if layer.gate is not None:
                layer.gate.linear.weight.normal_()
    student.save_pretrained(tmp_path)
    assert not list(tmp_path.glob("*.bin")) and (tmp_path / "model.safetensors").is_file()
    loaded = AutoModelForSequenceClassification.from_pretrained(tmp_path).eval()
    assert isinstance(loaded, MoEBertForSequenceClassification)
    for a, b in zip(student.moe_layers, loaded.moe_layers):
        assert torch.equal(a.hash_table, b.hash_table)
        if a.gate is not None:
            assert torch.equal(a.gate.linear.weight, b.gate.linear.weight)
    x = batch()
    assert_close(loaded(**x).logits, student(**x).logits)
    assert_close(distillery.load_student(tmp_path)(**x).logits, student(**x).logits)


def test_roberta_and_question_answering_teachers_convert_exactly(tiny_roberta):
    roberta = RobertaForSequenceClassification.from_pretrained(tiny_roberta, num_labels=2).eval()
    d_h = roberta.config.intermediate_size
    student = convert(roberta, torch.rand(2, d_h), num_experts=1, expert_size=d_h, shared_size=8)
    ids = torch.randint(5, roberta.config.vocab_size, (2, 9))
    assert_close(student(input_ids=ids).logits, roberta(input_ids=ids).logits)

    qa = tiny_teacher(BertForQuestionAnswering, num_labels=2)
    student = convert(qa, IMPORTANCE, num_experts=1, expert_size=D_H, shared_size=4)
    x = batch()
    out, ref = student(**x), qa(**x)
    real = x["attention_mask"].bool()  # padding skips the experts, so only real positions must agree
    assert_close(out.start_logits[real], ref.start_logits[real])
    assert_close(out.end_logits[real], ref.end_logits[real])


@pytest.mark.parametrize("bad, match", [
    ({"shared_size": 10, "expert_size": 9}, "shared neurons"),
    ({"expert_size": 40}, "between 1 and the FFN's 37"),
    ({"num_experts": 0}, "at least 1"),
    ({"num_experts": 4, "expert_size": 12, "shared_size": 0}, "need 0 \\+ 4×12 = 48 distinct neurons"),
    ({"split": "sorted"}, "Unknown split"),
])
def test_impossible_shapes_fail_with_a_sentence(bad, match):
    options = {"num_experts": 4, "expert_size": 9, "shared_size": 3, **bad}
    with pytest.raises(DistilleryError, match=match):
        convert(tiny_teacher(), IMPORTANCE, **options)


# ------------------------------------------------------------------------------------------------
# Importance


@pytest.mark.parametrize("kind", ["classification", "regression", "qa"])
def test_importance_equals_the_per_example_autograd_reference(kind):
    if kind == "qa":
        model = tiny_teacher(BertForQuestionAnswering, num_labels=2)
        data = examples(kind, fixed_length=10)  # QA logits include padding positions: same lengths
    else:
        model = tiny_teacher(num_labels=1 if kind == "regression" else 3)
        data = examples(kind)
    fast = ffn_importance(model, data, collate, kind, batch_size=4, progress=False)
    slow = reference_importance(model, data, collate, kind)
    assert fast.shape == (2, D_H)
    assert_close(fast, slow, rtol=1e-5, atol=1e-5)
    assert all(p.requires_grad and p.grad is None for p in model.parameters())


def test_importance_runs_the_last_ffn_on_cls_alone_only_where_the_head_reads_cls_alone():
    cls_head = tiny_teacher(num_labels=3)
    mean_head = tiny_teacher(num_labels=3)
    pooler = mean_head.bert.pooler
    pooler.forward = lambda hidden: pooler.activation(pooler.dense(hidden.mean(1)))  # reads every token
    # 10 examples: 3 batches of at most 4; one length, as the mean over positions would read padding
    data = examples("classification", fixed_length=8)
    # one-token passes of the last FFN: the check's, then every batch's only where the check held
    for model, one_token_passes in ((cls_head, 1 + 3), (mean_head, 1)):
        seen = []
        handle = dense_ffns(model)[-1][0].register_forward_hook(lambda m, args, out: seen.append(out.shape[1]))
        fast = ffn_importance(model, data, collate, "classification", batch_size=4, progress=False)
        handle.remove()
        assert seen.count(1) == one_token_passes
        assert_close(fast, reference_importance(model, data, collate, "classification"), rtol=1e-5, atol=1e-5)


def test_importance_sample_is_seeded():
    model = tiny_teacher()
    data = examples("classification", n=12)
    a = ffn_importance(model, data, collate, "classification", max_examples=5, seed=1, progress=False)
    b = ffn_importance(model, data, collate, "classification", max_examples=5, seed=1, progress=False)
    assert torch.equal(a, b)


# ------------------------------------------------------------------------------------------------
# Output refit


def _ffn_inputs(teacher, batches):
    """The teacher's FFN input of every real token, per layer: [(tokens, d)], with the token ids."""
    from distillery.moebert.convert import dense_ffns

    seen = {i: [] for i in range(teacher.config.num_hidden_layers)}
    hooks = [w1.register_forward_pre_hook(lambda m, a, i=i: seen[i].append(a[0].detach()))
             for i, (w1, _) in enumerate(dense_ffns(teacher))]
    with torch.no_grad():
        for b in batches:
            teacher(**b)
    for h in hooks:
        h.remove()
    real = [b["attention_mask"].bool() for b in batches]
    ids = torch.cat([b["input_ids"][r] for b, r in zip(batches, real)])
    return [torch.cat([x[r] for x, r in zip(seen[i], real)]) for i in seen], ids


@pytest.mark.parametrize("mode", ["tied", "cloned"])
def test_refit_equals_a_least_squares_solve_on_the_explicit_design_matrix(mode):
    from distillery.moebert.convert import dense_ffns
    from distillery.moebert.refit import refit_outputs

    teacher = tiny_teacher()
    student = convert(teacher, IMPORTANCE, num_experts=3, expert_size=10, shared_size=4, shared_mode=mode)
    before = {k: v.clone() for k, v in student.state_dict().items()}
    batches = [batch(seed=s) for s in range(3)]
    inputs, ids = _ffn_inputs(teacher, batches)
    refit_outputs(student, teacher, batches, ridge=1e-2, progress=False)
    for i, layer in enumerate(student.moe_layers):
        ex, p = layer.experts, f"bert.encoder.layer.{i}.intermediate.experts."
        w1, b1, w2 = before[p + "w1"].double(), before[p + "b1"].double(), before[p + "w2"].double()
        n, d, k = w1.shape
        shared = mode == "tied"
        rows = []
        for a, tok in zip(inputs[i].double(), ids):  # one design row per token, the obvious way
            e = int(layer.hash_table[tok])
            own = torch.zeros(n * k, dtype=torch.double)
            own[e * k:(e + 1) * k] = ex.act(a @ w1[e] + b1[e])
            common = [torch.ones(1, dtype=torch.double)]
            if shared:
                common.append(ex.act(a @ before[p + "shared_w1"].double() + before[p + "shared_b1"].double()))
            rows.append(torch.cat([*common, own]))
        phi = torch.stack(rows)
        fc1, fc2 = dense_ffns(teacher)[i]
        hidden = ex.act(torch.nn.functional.linear(inputs[i].double(), fc1.weight.double(), fc1.bias.double()))
        y = torch.nn.functional.linear(hidden, fc2.weight.double(), fc2.bias.double())
        w0 = torch.cat([before[p + "b2"].double()[None], *([before[p + "shared_w2"].double()] if shared else []),
                        w2.reshape(n * k, d)])
        gram = phi.t() @ phi
        lam = 1e-2 * gram.diagonal().mean()
        expected = torch.linalg.solve(gram + lam * torch.eye(len(gram), dtype=torch.double), phi.t() @ y + lam * w0)
        got = torch.cat([ex.b2[None], *([ex.shared_w2] if shared else []), ex.w2.reshape(n * k, d)]).double()
        assert_close(got, expected, rtol=1e-4, atol=1e-5)


def test_refit_is_on_by_default_except_for_qa():
    from distillery.moebert.recipe import MoEBertOptions, wants_refit

    default, on, off = MoEBertOptions(), MoEBertOptions(refit=True), MoEBertOptions(refit=False)
    assert wants_refit(default, "classification") and wants_refit(default, "regression")
    assert not wants_refit(default, "qa")
    assert wants_refit(on, "qa") and not wants_refit(off, "classification")


def test_refit_leaves_an_exact_conversion_as_it_is_and_improves_a_lossy_one():
    from distillery.moebert.refit import refit_outputs

    teacher = tiny_teacher()
    batches = [batch(seed=s) for s in range(3)]
    exact = convert(teacher, IMPORTANCE, num_experts=1, expert_size=D_H, shared_size=5)
    errors = refit_outputs(exact, teacher, batches, progress=False)
    assert all(after < 1e-10 for _, after in errors)
    x = batch(seed=9)
    assert_close(exact(**x).logits, teacher(**x).logits)
    for routing in ("hash-r", "gate"):
        lossy = convert(teacher, IMPORTANCE, num_experts=4, expert_size=6, shared_size=2, routing=routing)
        errors = refit_outputs(lossy, teacher, batches, progress=False)
        assert all(after < before for before, after in errors), errors


# ------------------------------------------------------------------------------------------------
# Loss, options, method end to end


def test_distilled_layers():
    assert distilled_layers("all", 6) == [0, 1, 2, 3, 4, 5, 6]
    assert distilled_layers("last", 6) == [6]
    assert distilled_layers("skip", 6) == [0, 2, 4, 6]


def test_layerwise_loss_is_zero_distillation_for_the_converted_teacher():
    teacher = tiny_teacher()
    student = convert(teacher, IMPORTANCE, num_experts=1, expert_size=D_H, shared_size=0).train()
    teacher.train()  # dropout off both ways for an exact comparison
    for m in (student, teacher):
        for module in m.modules():
            if isinstance(module, torch.nn.Dropout):
                module.p = 0.0
    x = {**batch(), "labels": torch.tensor([0, 1, 2])}
    loss, logs = layerwise_distillation_loss("classification", teacher, 2.0, [0, 1, 2])(student, x)
    assert logs["trm"] < 1e-10 and abs(logs["pred"]) < 1e-6
    assert_close(loss, torch.tensor(logs["ce"]))
    _, logs = layerwise_distillation_loss("classification", teacher, 2.0, None)(student, x)
    assert set(logs) == {"ce"}


def test_paper_preset_and_bad_options(tmp_path):
    config = build_run_config(method="moebert", task="rte", preset="paper", overrides={"student.epochs": 1.0})
    assert config.student.lr == 1e-5 and config.student.batch_size == 8 and config.method_options["lambda"] == 1.0
    assert config.student.epochs == 1.0  # an explicit setting wins over the preset
    assert preset_settings("moebert", "paper", "squad")["student.weight_decay"] == 0.01
    with pytest.raises(DistilleryError, match="no Table 7 settings for stsb"):
        build_run_config(method="moebert", task="stsb", preset="paper")
    with pytest.raises(DistilleryError, match="Option routing must be one of hash-r, hash-b, gate, got 'hash'"):
        compress(build_run_config(method="moebert", out=str(tmp_path / "r"), overrides={"method_options.routing": "hash"}))
    with pytest.raises(DistilleryError, match="Option refit must be true or false, got 'yes'"):
        compress(build_run_config(method="moebert", out=str(tmp_path / "r"), overrides={"method_options.refit": "yes"}))
    with pytest.raises(DistilleryError, match="need 168 \\+ 4×216 = 1032 distinct neurons, but the FFN has 1000"):
        from distillery.moebert.recipe import MoEBertOptions, expert_shape

        expert_shape(MoEBertOptions(experts=4, expert_size=384, shared=None), 1000)
    assert not (tmp_path / "r").exists()


def moe_config(teacher, data_dir, out, task="sst2", **more):
    return tiny_config(teacher, data_dir, out, task, "moebert", **{"method_options.importance_examples": 40, **more})


@pytest.mark.parametrize("routing", ["hash-r", "gate"])
def test_compress_moebert_writes_a_run_folder(tiny_bert, glue_dir, tmp_path, routing):
    out = compress(moe_config(tiny_bert, glue_dir, tmp_path / "run", **{
        "method_options.experts": 2, "method_options.routing": routing}))
    for name in ("report.md", "plot.png", "metrics.json", "bench.json", "importance.safetensors",
                 "expert_load.png", "expert_load.json"):
        assert (out / name).is_file(), name
    student = distillery.load_student(out)
    assert type(student).__name__ == "MoEBertForSequenceClassification"
    assert student.config.num_experts == 2 and student.config.routing == routing
    bench = json.loads((out / "bench.json").read_text())
    assert bench["models"]["student"]["effective_params"] < bench["models"]["teacher"]["effective_params"]
    load = json.loads((out / "expert_load.json").read_text())
    assert len(load["tokens"]) == 2 and len(load["tokens"][0]) == 2
    assert "Per-expert load" in (out / "report.md").read_text()


@pytest.mark.parametrize("examples, seen", [("all", 96), ("budget", 40)])
def test_moebert_distils_on_the_whole_train_split_past_the_budget(tiny_bert, glue_dir, tmp_path, examples, seen):
    # the layer-wise loss runs the teacher on every batch: the rows past the limit need no labelling pass
    out = compress(moe_config(tiny_bert, glue_dir, tmp_path / "run", **{
        "data.train_limit": 40, "student.epochs": 1.0, "method_options.experts": 2,
        "method_options.train_examples": examples}))
    train = json.loads((out / "train.json").read_text())
    assert train["train_examples"] == seen and train["teacher_train_examples"] == 40


def test_compress_moebert_regression_and_squad(tiny_bert, glue_dir, tmp_path):
    out = compress(moe_config(tiny_bert, glue_dir, tmp_path / "stsb", task="stsb",
                              **{"method_options.routing": "hash-b", "method_options.distill_layers": "skip",
                                 "method_options.refit": True}))
    assert "pearson" in json.loads((out / "metrics.json").read_text())["student"]
    assert "Output weights refitted by least squares on 40 training examples" in (out / "report.md").read_text()
    data = write_squad(tmp_path / "squad-data")
    out = compress(moe_config(tiny_bert, data, tmp_path / "squad", task="squad", **{
        "data.max_length": 48, "data.doc_stride": 16, "data.squad_holdout": 0.5}))
    metrics = json.loads((out / "metrics.json").read_text())
    assert {"exact_match", "f1"} <= set(metrics["student"])


def test_cli_steps_importance_convert_train(tiny_bert, glue_dir, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from distillery.cli import app

    runner = CliRunner()
    common = ["--task", "sst2", "--teacher", str(tiny_bert), "--data-dir", str(glue_dir)]
    monkeypatch.setattr("distillery.pipeline.budget_defaults", _tiny_budget)
    result = runner.invoke(app, ["moebert", "importance", *common, "--importance-examples", "30",
                                 "--out", str(tmp_path / "imp.safetensors")])
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["moebert", "convert", *common, "--importance", str(tmp_path / "imp.safetensors"),
                                 "--experts", "2", "--shared", "4", "--refit", "--out", str(tmp_path / "converted")])
    assert result.exit_code == 0, result.output
    converted = distillery.load_student(tmp_path / "converted")
    assert converted.config.num_experts == 2 and converted.config.shared_size == 4
    # a budget whose extras are on: --no-baselines / --no-int8 turn them off, as compress's flags do
    monkeypatch.setattr("distillery.pipeline.budget_defaults", lambda budget, task: {**TINY_RUN, "baselines": True,
                                                                                    "int8": True})
    result = runner.invoke(app, ["moebert", "train", *common, "--init", str(tmp_path / "converted"),
                                 "--epochs", "1", "--out", str(tmp_path / "run"), "--no-baselines", "--no-int8"])
    assert result.exit_code == 0, result.output
    assert distillery.load_student(tmp_path / "run").config.shared_size == 4
    config = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert (config["baselines"], config["int8"]) == (False, False)


def _tiny_budget(budget, task):
    return dict(TINY_RUN)


@pytest.mark.parametrize("routing", ["hash-r", "gate"])
def test_onnx_export_parity_with_routing(routing, tiny_bert, tmp_path):
    """The exported graph routes like the torch model (dense-select dispatch in the graph)."""
    from transformers import AutoTokenizer

    import distillery.export as ex

    teacher = BertForSequenceClassification.from_pretrained(tiny_bert, num_labels=2).eval()
    student = convert(teacher, IMPORTANCE, num_experts=4, expert_size=8, shared_size=3, routing=routing)
    with torch.no_grad():  # experts that differ from each other, so that a wrong route would show
        for layer in student.moe_layers:
            layer.experts.w2.normal_(0, 0.5)
            if layer.gate is not None:
                layer.gate.linear.weight.normal_(0, 1.0)
    tok = AutoTokenizer.from_pretrained(tiny_bert)
    student.save_pretrained(tmp_path / "moe")
    tok.save_pretrained(tmp_path / "moe")
    out = ex.export_model(tmp_path / "moe", "onnx", tmp_path / "onnx")
    assert json.loads((out / "distillery_export.json").read_text())["parity"]["fp32"]["passed"]
    onnx_model = distillery.load_student(out)
    inputs = dict(tok(["a good movie", "the plot was boring and the actor was not fun at all", "fun"],
                      padding=True, return_tensors="pt"))
    with torch.no_grad():
        expected = student(**inputs).logits
    assert_close(onnx_model(**inputs).logits, expected, atol=ex.FP32_ATOL, rtol=ex.FP32_RTOL)
    single = {k: v[:1] for k, v in inputs.items()}
    with torch.no_grad():
        assert_close(onnx_model(**single).logits, student(**single).logits, atol=ex.FP32_ATOL, rtol=ex.FP32_RTOL)


def test_onnx_int8_export_of_stacked_expert_weights_runs(tiny_bert, tmp_path):
    """ONNX Runtime's int8 MatMul takes per-column scales of 2-D weights only: the experts' stacked weights make
    the export quantize per tensor, and the int8 graph runs (per channel it failed at the first batch)."""
    from transformers import AutoTokenizer

    import distillery.export as ex
    from distillery.export.recover import fake_quant_per_channel

    teacher = BertForSequenceClassification.from_pretrained(tiny_bert, num_labels=2).eval()
    student = convert(teacher, IMPORTANCE, num_experts=4, expert_size=8, shared_size=3)
    tok = AutoTokenizer.from_pretrained(tiny_bert)
    student.save_pretrained(tmp_path / "moe")
    tok.save_pretrained(tmp_path / "moe")
    out = ex.export_model(tmp_path / "moe", "onnx-int8", tmp_path / "int8")
    manifest = json.loads((out / "distillery_export.json").read_text())
    assert manifest["quantization"]["per_channel"] is False
    assert not fake_quant_per_channel(student, "onnx-int8")  # the recovery pass fakes the same per-tensor scales
    assert fake_quant_per_channel(teacher, "onnx-int8") and not fake_quant_per_channel(teacher, "torch-int8")
    inputs = dict(tok(["a good movie", "the plot was boring"], padding=True, return_tensors="pt"))
    with torch.no_grad():
        got, expected = distillery.load_student(out)(**inputs).logits, student(**inputs).logits
    assert got.shape == expected.shape and torch.isfinite(got).all()


# ------------------------------------------------------------------------------------------------
# Token classification (NER)


def token_examples(n=10):
    """``examples`` with a tag a position: -100 on the first and on a few others (a word's later sub-words)."""
    items = examples("classification", n=n).items
    g = torch.Generator().manual_seed(3)
    for item in items:
        tags = torch.randint(0, 5, (len(item["input_ids"]),), generator=g)
        tags[0] = -100
        tags[torch.rand(len(tags), generator=g) < 0.3] = -100
        item["labels"] = tags.tolist()
    return items


def test_importance_of_a_tagger_equals_the_per_example_autograd_reference():
    """Eq. 4 with the token head's loss (each sentence's mean cross-entropy over its tagged positions)."""
    torch.manual_seed(0)
    model = BertForTokenClassification(tiny_bert_config(num_labels=5)).eval()
    data, pad = Examples(token_examples()), PadCollator(0, "right")
    fast = ffn_importance(model, data, pad, "token_classification", batch_size=4, progress=False)
    assert_close(fast, reference_importance(model, data, pad, "token_classification"), rtol=1e-5, atol=1e-5)


def test_layerwise_loss_of_a_tagger_distils_words_only():
    """L_pred on a tagger is the symmetric KL over the words' first sub-words only (the batch's word_mask): zero
    for the converted teacher, and that of a slow reference on those positions once the student moves."""
    from distillery.training.losses import symmetric_kl

    torch.manual_seed(0)
    teacher = BertForTokenClassification(tiny_bert_config(num_labels=5)).eval()
    student = convert(teacher, IMPORTANCE, num_experts=1, expert_size=D_H, shared_size=0).eval()
    assert type(student).__name__ == "MoEBertForTokenClassification"
    labels = torch.randint(0, 5, (3, 11), generator=torch.Generator().manual_seed(0))
    labels[:, 0] = labels[:, 5:] = -100
    x = {**batch(), "labels": labels, "word_mask": (labels != -100).long()}
    loss_fn = layerwise_distillation_loss("token_classification", teacher, 2.0, [0, 1, 2])
    loss, logs = loss_fn(student, x)
    assert logs["trm"] < 1e-10 and abs(logs["pred"]) < 1e-6
    assert_close(loss, torch.tensor(logs["ce"]))
    with torch.no_grad():
        student.classifier.weight.add_(0.5 * torch.randn_like(student.classifier.weight))
        s, t = student(**batch()).logits, teacher(**batch()).logits
    words = labels != -100
    assert_close(loss_fn(student, x)[1]["pred"], float(symmetric_kl(s[words], t[words])), rtol=1e-5, atol=1e-6)


def test_compress_moebert_tags_conll2003(tiny_bert, conll_dir, tmp_path):
    """MoEBERT end to end on a tagger: importance with the token head's loss, the conversion of the token
    head's teacher, layer-wise distillation with the per-word prediction term, its int8 export scored on entities;
    the student loads as a token classifier with its tag names, and transformers' pipeline groups its tags."""
    from transformers import AutoModelForTokenClassification, AutoTokenizer, pipeline

    unlabeled = write_unlabeled_sentences(tmp_path / "more.jsonl", 12)
    out = compress(build_run_config(method="moebert", task="conll2003", budget="quick", teacher=str(tiny_bert),
                                    data_dir=str(conll_dir), out=str(tmp_path / "run"), overrides={
                                        **NER_RUN, "int8": True, "method_options.experts": 2,
                                        "method_options.importance_examples": 40, "data.unlabeled_file": unlabeled}))
    # sentences without tags: the teacher tags their words, and the layer-wise loss runs on them too
    assert json.loads((out / "train.json").read_text())["student_text"]["unlabeled"] == 12
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["main_metric"] == "entity_f1"
    assert {"entity_f1", "entity_precision", "entity_recall", "token_accuracy"} <= set(metrics["student"])
    assert metrics["teacher"]["entity_f1"] > 0.5 and metrics["student"]["entity_f1"] > 0.3
    (int8,) = [name for name in metrics["others"] if "int8" in name]
    assert set(metrics["others"][int8]) == set(metrics["student"])
    manifest = json.loads(next((out / "exports").glob("*/distillery_export.json")).read_text())
    assert manifest["architecture"] == "MoEBertForTokenClassification" and manifest["outputs"] == ["logits"]
    assert manifest["parity"]["fp32"]["passed"] and manifest["parity"]["int8_vs_fp32"]["argmax_agreement"] > 0.9
    assert "symmetric KL of predictions" in (out / "report.md").read_text()
    for name in ("importance.safetensors", "expert_load.json"):
        assert (out / name).is_file(), name
    distillery.register_models()
    student = AutoModelForTokenClassification.from_pretrained(out / "student").eval()
    assert type(student).__name__ == "MoEBertForTokenClassification" and student.config.num_experts == 2
    assert student.config.id2label[4] == "B-PER" and student.config.label2id["I-LOC"] == 5
    tagger = pipeline("token-classification", model=student, tokenizer=AutoTokenizer.from_pretrained(out / "student"),
                      aggregation_strategy="simple")
    found = tagger(["the actor was born in paris", "where is london"])
    assert {e["entity_group"] for s in found for e in s} <= {"LOC", "ORG", "PER", "MISC"}
