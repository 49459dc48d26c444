"""Every KD loss against values computed by hand (logs of small fractions)."""

from __future__ import annotations

import math

import pytest
import torch
from transformers.modeling_outputs import QuestionAnsweringModelOutput, SequenceClassifierOutput

from distillery.training.losses import (
    HiddenProjection,
    attention_kl,
    attention_weights,
    distillation_loss,
    hidden_mse,
    kl_divergence,
    mse,
    prediction_distillation,
    soft_cross_entropy,
    soft_cross_entropy_to,
    symmetric_kl,
    task_loss,
)
from distillery.errors import DistilleryError

LN = math.log

# Two examples over two classes, chosen so that every softmax is a simple fraction:
#   student: softmax([0, ln 3]) = [1/4, 3/4],  softmax([0, 0]) = [1/2, 1/2]
#   teacher: softmax([0, 0])    = [1/2, 1/2],  softmax([0, ln 3]) = [1/4, 3/4]
STUDENT = torch.tensor([[0.0, LN(3)], [0.0, 0.0]])
TEACHER = torch.tensor([[0.0, 0.0], [0.0, LN(3)]])

# cross-entropy  −Σ p_t log p_s  per example
CE_1 = -(0.5 * LN(1 / 4) + 0.5 * LN(3 / 4))  # = ½ ln(16/3)
CE_2 = -(0.25 * LN(1 / 2) + 0.75 * LN(1 / 2))  # = ln 2
# KL(p_t ‖ p_s) per example
KL_1 = 0.5 * LN(0.5 / 0.25) + 0.5 * LN(0.5 / 0.75)  # = ½ ln(4/3)
KL_2 = 0.25 * LN(0.25 / 0.5) + 0.75 * LN(0.75 / 0.5)
# KL(p_s ‖ p_t) per example (the reverse direction)
RKL_1 = 0.25 * LN(0.25 / 0.5) + 0.75 * LN(0.75 / 0.5)
RKL_2 = 0.5 * LN(0.5 / 0.25) + 0.5 * LN(0.5 / 0.75)


def close(x: torch.Tensor, expected: float) -> None:
    assert x.ndim == 0
    assert x.item() == pytest.approx(expected, rel=1e-5, abs=1e-6)


def test_soft_cross_entropy_by_hand():
    close(soft_cross_entropy(STUDENT, TEACHER), (CE_1 + CE_2) / 2)
    close(soft_cross_entropy(STUDENT[:1], TEACHER[:1]), 0.5 * LN(16 / 3))


def test_soft_cross_entropy_to_a_given_distribution_by_hand():
    close(soft_cross_entropy_to(STUDENT, torch.softmax(TEACHER, dim=-1)), (CE_1 + CE_2) / 2)


def test_soft_cross_entropy_is_the_cross_entropy_to_the_softened_teacher_bit_for_bit():
    """One formula: the teacher's softened distribution through soft_cross_entropy_to, times T²; and CMOW's
    binned-score loss (two-hot targets) is the same function, bit for bit the formula it was written as."""
    from distillery.cmow.modeling_cmow import CMOWConfig, CMOWForSequenceClassification, two_hot

    g = torch.Generator().manual_seed(0)
    s, t = torch.randn(6, 5, generator=g), torch.randn(6, 5, generator=g)
    for temperature in (1.0, 2.0, 0.5):
        via = soft_cross_entropy_to(s / temperature, torch.softmax(t / temperature, dim=-1)) * temperature**2
        assert torch.equal(soft_cross_entropy(s, t, temperature), via)
    target = torch.softmax(t, dim=-1)
    written = -(target * torch.log_softmax(s.float(), dim=-1)).sum(-1).mean()
    assert torch.equal(soft_cross_entropy_to(s, target), written)

    torch.manual_seed(0)
    config = CMOWConfig(vocab_size=99, matrix_dim=4, vector_dim=16, head_hidden=8, num_labels=1,
                        score_bins=[0.5 * i for i in range(11)])
    model = CMOWForSequenceClassification(config).eval()
    ids, labels = torch.randint(5, 99, (3, 7), generator=g), torch.tensor([0.0, 2.5, 5.0])
    out = model(input_ids=ids, labels=labels)
    assert torch.equal(out.loss, soft_cross_entropy_to(out.bin_logits, two_hot(labels, model.bin_values)))


def test_soft_cross_entropy_temperature_scales_logits_and_multiplies_by_t_squared():
    # logits twice as large at T = 2 give the same distributions as T = 1, and a factor T² = 4
    close(soft_cross_entropy(2 * STUDENT, 2 * TEACHER, temperature=2.0), 4 * (CE_1 + CE_2) / 2)


def test_soft_cross_entropy_counts_every_leading_position_as_an_example():
    s = STUDENT.reshape(1, 2, 2)  # (batch 1, 2 positions, 2 classes)
    t = TEACHER.reshape(1, 2, 2)
    close(soft_cross_entropy(s, t), (CE_1 + CE_2) / 2)


def test_soft_cross_entropy_gradient_reaches_the_student():
    s = STUDENT.clone().requires_grad_(True)
    soft_cross_entropy(s, TEACHER).backward()
    # d/ds of mean CE = (p_s − p_t) / N
    expected = (torch.softmax(STUDENT, -1) - torch.softmax(TEACHER, -1)) / 2
    torch.testing.assert_close(s.grad, expected)


def test_kl_divergence_by_hand():
    close(kl_divergence(STUDENT, TEACHER), (KL_1 + KL_2) / 2)
    close(kl_divergence(2 * STUDENT, 2 * TEACHER, temperature=2.0), 4 * (KL_1 + KL_2) / 2)
    close(kl_divergence(STUDENT, STUDENT), 0.0)


def test_kl_is_soft_ce_minus_teacher_entropy():
    teacher_entropy = (-(torch.softmax(TEACHER, -1) * torch.log_softmax(TEACHER, -1)).sum(-1)).mean()
    close(kl_divergence(STUDENT, TEACHER), (soft_cross_entropy(STUDENT, TEACHER) - teacher_entropy).item())


def test_symmetric_kl_by_hand():
    expected = 0.5 * ((KL_1 + KL_2) / 2 + (RKL_1 + RKL_2) / 2)
    close(symmetric_kl(STUDENT, TEACHER), expected)
    close(symmetric_kl(TEACHER, STUDENT), expected)  # symmetric
    close(symmetric_kl(2 * STUDENT, 2 * TEACHER, temperature=2.0), 4 * expected)


def test_losses_reject_mismatched_shapes_and_bad_temperature():
    with pytest.raises(ValueError, match="same shape"):
        soft_cross_entropy(STUDENT, TEACHER[:, :1])
    with pytest.raises(ValueError, match="temperature"):
        kl_divergence(STUDENT, TEACHER, temperature=0)


HIDDEN_S = torch.tensor([[[1.0, 2.0], [3.0, 4.0]]])  # (B=1, L=2, d=2)
HIDDEN_T = torch.zeros(1, 2, 2)


def test_hidden_mse_by_hand():
    close(hidden_mse(HIDDEN_S, HIDDEN_T), (1 + 4 + 9 + 16) / 4)
    # the second token is padding: only (1² + 2²) over 1 token × 2 dims
    close(hidden_mse(HIDDEN_S, HIDDEN_T, attention_mask=torch.tensor([[1, 0]])), (1 + 4) / 2)
    close(hidden_mse(HIDDEN_S, HIDDEN_T, attention_mask=torch.tensor([[1, 1]])), 7.5)


def test_a_projection_starts_at_the_least_squares_map_of_the_students_vectors_onto_the_teachers():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(300, 4, generator=g)
    a, c = torch.randn(4, 6, generator=g), torch.randn(6, generator=g)
    proj = HiddenProjection(4, 6).start_at_least_squares(x, x @ a + c, ridge=0.0)
    torch.testing.assert_close(proj.linear.weight.data, a.T)
    torch.testing.assert_close(proj.linear.bias.data, c)
    torch.testing.assert_close(proj(x), x @ a + c, atol=1e-5, rtol=1e-5)
    noisy = x @ a + c + 0.1 * torch.randn(300, 6, generator=g)  # the default ridge: near the fit, and finite
    assert (HiddenProjection(4, 6).start_at_least_squares(x, noisy).linear.weight.data - a.T).abs().max() < 0.05


def test_hidden_mse_with_projection():
    proj = HiddenProjection(2, 3)
    with torch.no_grad():
        proj.linear.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]))
        proj.linear.bias.copy_(torch.tensor([0.0, 0.0, -1.0]))
    # projected: token 1 -> [1, 2, 2], token 2 -> [3, 4, 6]
    teacher = torch.zeros(1, 2, 3)
    close(hidden_mse(HIDDEN_S, teacher, projection=proj), (1 + 4 + 4 + 9 + 16 + 36) / 6)
    close(hidden_mse(HIDDEN_S, teacher, projection=proj, attention_mask=torch.tensor([[0, 1]])), (9 + 16 + 36) / 3)
    hidden_mse(HIDDEN_S, teacher, projection=proj).backward()
    assert proj.linear.weight.grad is not None and proj.linear.weight.grad.abs().sum() > 0


def test_hidden_mse_needs_a_projection_when_sizes_differ():
    with pytest.raises(ValueError, match="HiddenProjection"):
        hidden_mse(HIDDEN_S, torch.zeros(1, 2, 3))
    with pytest.raises(ValueError, match="attention_mask"):
        hidden_mse(HIDDEN_S, HIDDEN_T, attention_mask=torch.ones(1, 3))


def test_attention_kl_by_hand():
    # one head, two queries over two keys: query 1 as the STUDENT/TEACHER rows' first example, query 2 as their second
    student = torch.tensor([[[[0.25, 0.75], [0.5, 0.5]]]])
    teacher = torch.tensor([[[[0.5, 0.5], [0.25, 0.75]]]])
    close(attention_kl(student, teacher), (KL_1 + KL_2) / 2)
    close(attention_kl(student, teacher, attention_mask=torch.tensor([[1, 0]])), KL_1)  # a padded query left out
    # a padded key (weight 0 in both) adds nothing; two heads are averaged
    padded_s = torch.tensor([[[[0.25, 0.75, 0.0]], [[0.5, 0.5, 0.0]]]])
    padded_t = torch.tensor([[[[0.5, 0.5, 0.0]], [[0.25, 0.75, 0.0]]]])
    close(attention_kl(padded_s, padded_t, attention_mask=torch.tensor([[1]])), (KL_1 + KL_2) / 2)
    with pytest.raises(ValueError, match="attention weights"):
        attention_kl(student, torch.zeros(1, 2, 2, 2))


def test_attention_term_compares_the_weights_a_layer_uses(tmp_path):
    """The term runs both models with eager attention, the student's attention without dropout (else its
    weights hold zeros), and restores both afterwards: a copy of the teacher in training mode has no attention
    gap to it, and the term's gradient reaches the student."""
    import copy

    from tests.helpers import make_tiny_bert
    from transformers import AutoModelForSequenceClassification

    teacher = AutoModelForSequenceClassification.from_pretrained(make_tiny_bert(tmp_path, dropout=0.5),
                                                                 trust_remote_code=False).eval()
    student = copy.deepcopy(teacher).train()
    batch = {"input_ids": torch.tensor([[2, 5, 6, 7, 3], [2, 8, 9, 3, 0]]),
             "attention_mask": torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]]), "labels": torch.tensor([0, 1])}
    implementation = student.config._attn_implementation
    with attention_weights(student, teacher):
        with torch.no_grad():
            s = student(**{k: v for k, v in batch.items() if k != "labels"}, output_attentions=True).attentions
        t = teacher(**{k: v for k, v in batch.items() if k != "labels"}, output_attentions=True).attentions
        assert len(s) == len(t) == teacher.config.num_hidden_layers
        # hidden dropout still differs: not zero, but far below the gap to a model of its own
        assert attention_kl(s[0], t[0], batch["attention_mask"]).item() < 0.05
        assert (s[0][1, :, :, 4] == 0).all(), "a padded key has no weight"
        assert (s[0][0] > 0).all() and (s[0][1, :, :, :4] > 0).all(), "no dropout (its zeros) on the student's weights"
    assert student.config._attn_implementation == teacher.config._attn_implementation == implementation
    assert all(m.training for m in student.modules()) and not any(m.training for m in teacher.modules())
    loss_fn = distillation_loss("classification", teacher, 0.5, 1.0, layer_map=[0, 1], attention_weight=2.0)
    loss, logs = loss_fn(student, batch)
    assert "attention" in logs and "hidden" not in logs
    loss.backward()
    assert student.bert.encoder.layer[0].attention.self.query.weight.grad.abs().sum() > 0


def test_hidden_projection_starts_as_identity_when_sizes_match():
    proj = HiddenProjection(4, 4)
    x = torch.randn(2, 3, 4)
    torch.testing.assert_close(proj(x), x)
    close(hidden_mse(x, x.clone(), projection=proj), 0.0)
    assert HiddenProjection(4, 6)(x).shape == (2, 3, 6)
    assert all(p.requires_grad for p in proj.parameters())


def test_mse_by_hand():
    close(mse(torch.tensor([[1.0], [2.0]]), torch.tensor([0.0, 0.0])), (1 + 4) / 2)
    close(mse(torch.tensor([1.0, 3.0]), torch.tensor([2.0, 1.0])), (1 + 4) / 2)
    with pytest.raises(ValueError, match="differ in size"):
        mse(torch.zeros(3), torch.zeros(2))


def test_task_loss_classification_by_hand():
    logits = torch.tensor([[0.0, LN(3)], [0.0, LN(3)]])  # softmax [1/4, 3/4]
    batch = {"labels": torch.tensor([1, 0])}
    expected = (-LN(3 / 4) - LN(1 / 4)) / 2
    close(task_loss("classification", logits, batch), expected)
    close(task_loss("classification", SequenceClassifierOutput(logits=logits), batch), expected)
    close(task_loss("classification", {"logits": logits}, batch), expected)


def test_task_loss_regression_by_hand():
    logits = torch.tensor([[1.0], [3.0]])
    close(task_loss("regression", logits, {"labels": torch.tensor([0.0, 1.0])}), (1 + 4) / 2)
    # integer labels are read as floats
    close(task_loss("regression", logits, {"labels": torch.tensor([0, 1])}), (1 + 4) / 2)


def test_task_loss_qa_by_hand_with_out_of_range_positions_ignored():
    # L = 3 positions. Example 1: start softmax [1/4, 1/4, 1/2], end softmax uniform.
    # Example 2: start position 7 is clamped to 3 = L and ignored; end softmax [1/2, 1/4, 1/4].
    start = torch.tensor([[0.0, 0.0, LN(2)], [0.0, 0.0, 0.0]])
    end = torch.tensor([[0.0, 0.0, 0.0], [LN(2), 0.0, 0.0]])
    batch = {"start_positions": torch.tensor([2, 7]), "end_positions": torch.tensor([1, 0])}
    start_loss = -LN(1 / 2)  # example 1 only
    end_loss = (-LN(1 / 3) - LN(1 / 2)) / 2
    expected = (start_loss + end_loss) / 2
    close(task_loss("qa", QuestionAnsweringModelOutput(start_logits=start, end_logits=end), batch), expected)
    close(task_loss("qa", (start, end), batch), expected)
    # negative positions clamp to 0 (the [CLS] "no answer" position)
    neg = {"start_positions": torch.tensor([-3, 0]), "end_positions": torch.tensor([0, 0])}
    start_loss = (-LN(1 / 4) - LN(1 / 3)) / 2
    end_loss = (-LN(1 / 3) - LN(1 / 2)) / 2
    close(task_loss("qa", (start, end), neg), (start_loss + end_loss) / 2)


def test_task_loss_validates_kind_and_batch():
    with pytest.raises(DistilleryError, match="Unknown task kind"):
        task_loss("ner", STUDENT, {"labels": torch.tensor([0, 1])})
    with pytest.raises(ValueError, match="labels"):
        task_loss("classification", STUDENT, {})
    with pytest.raises(ValueError, match="start_positions"):
        task_loss("qa", (STUDENT, STUDENT), {"labels": torch.tensor([0, 1])})


def test_prediction_distillation_classification_uses_the_chosen_loss():
    s, t = SequenceClassifierOutput(logits=STUDENT), SequenceClassifierOutput(logits=TEACHER)
    close(prediction_distillation("classification", s, t), (CE_1 + CE_2) / 2)
    close(prediction_distillation("classification", s, t, loss="kl"), (KL_1 + KL_2) / 2)
    close(
        prediction_distillation("classification", STUDENT, TEACHER, loss="symmetric_kl"),
        0.5 * ((KL_1 + KL_2) / 2 + (RKL_1 + RKL_2) / 2),
    )
    close(prediction_distillation("classification", 2 * STUDENT, 2 * TEACHER, temperature=2.0), 2 * (CE_1 + CE_2))


def test_prediction_distillation_regression_is_mse_of_predictions():
    s = torch.tensor([[1.0], [3.0]])
    t = torch.tensor([[0.0], [1.0]])
    close(prediction_distillation("regression", s, t), (1 + 4) / 2)
    close(prediction_distillation("regression", s, t, temperature=5.0, loss="kl"), (1 + 4) / 2)


def test_prediction_distillation_qa_averages_start_and_end():
    s = QuestionAnsweringModelOutput(start_logits=STUDENT, end_logits=TEACHER)
    t = {"start_logits": TEACHER, "end_logits": TEACHER}
    # start: CE as above; end: the teacher against itself is its entropy
    entropy = (-(torch.softmax(TEACHER, -1) * torch.log_softmax(TEACHER, -1)).sum(-1)).mean().item()
    close(prediction_distillation("qa", s, t), ((CE_1 + CE_2) / 2 + entropy) / 2)
    close(prediction_distillation("qa", s, t, loss="kl"), ((KL_1 + KL_2) / 2 + 0.0) / 2)


def test_prediction_distillation_rejects_unknown_names():
    with pytest.raises(DistilleryError, match="soft_ce, kl, symmetric_kl"):
        prediction_distillation("classification", STUDENT, TEACHER, loss="cosine")
    with pytest.raises(DistilleryError, match="classification, regression, qa"):
        prediction_distillation("tagging", STUDENT, TEACHER)


def test_hidden_term_runs_the_teacher_even_when_the_batch_carries_cached_logits(tiny_bert):
    # A batch from MethodContext.train_with_teacher_logits holds logits only; the hidden term needs the
    # teacher's hidden states, so the loss runs the teacher itself (its logits equal the cached ones).
    from transformers import AutoModelForSequenceClassification

    from distillery.training.losses import distillation_loss

    teacher = AutoModelForSequenceClassification.from_pretrained(str(tiny_bert), num_labels=2).eval()
    student = AutoModelForSequenceClassification.from_pretrained(str(tiny_bert), num_labels=2).eval()
    ids = torch.randint(5, 100, (3, 7))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": torch.tensor([0, 1, 0])}
    with torch.no_grad():
        cached = {**batch, "teacher_logits": teacher(input_ids=ids, attention_mask=batch["attention_mask"]).logits}
    loss_fn = distillation_loss("classification", teacher, 0.5, 2.0, hidden_weight=1.0, layer_map=[0, 1])
    with torch.no_grad():
        with_cache, logs = loss_fn(student, cached)
        without, _ = loss_fn(student, batch)
    torch.testing.assert_close(with_cache, without)
    assert logs["hidden"] == pytest.approx(0.0, abs=1e-10)  # the student is the teacher: no hidden gap
    # (the heads differ: each was drawn new) the KL is what is left to learn, the soft CE adds the teacher's entropy
    assert 0 <= logs["kl"] < 0.01 < logs["kd"]


def test_the_logged_kl_is_the_soft_ce_less_the_teachers_entropy():
    """kd_gap logs what the student still has to learn: 0 at a match, where the soft CE is T²·H(p_teacher)."""
    from distillery.training.losses import kd_gap

    teacher = torch.tensor([[2.3, -1.1, -1.2], [0.4, -0.4, 0.1]])
    student = torch.tensor([[0.5, 0.2, -0.7], [1.0, 0.0, -1.0]])
    for t in (1.0, 2.0):
        p = torch.softmax(teacher / t, -1)
        entropy = t * t * -(p * p.log()).sum(-1).mean()
        kl = kd_gap("classification", SequenceClassifierOutput(logits=student), SequenceClassifierOutput(logits=teacher), t)
        assert kl["kl"] == pytest.approx(float(soft_cross_entropy(student, teacher, t) - entropy), abs=1e-5)
        assert kd_gap("classification", teacher, teacher, t)["kl"] == pytest.approx(0.0, abs=1e-6)
    assert kd_gap("regression", student[:, :1], teacher[:, :1], 1.0) == {}
