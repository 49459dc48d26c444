"""Knowledge-distillation losses, all in one place.

Every method (moebert, cmow, autotinybert) and the plain baseline build their ``loss_fn`` from
these functions; none of them writes its own. Each function states its formula; the tests check
each one against values computed by hand.

Shapes: ``logits`` are ``(..., C)``; every leading dimension counts as an example (a sentence for
classification, a question window for QA start/end logits over its positions). Gradients flow
into whichever input requires them: compute the teacher under ``torch.no_grad()``.

A task's kind (``"classification"``, ``"regression"``, ``"qa"``: :mod:`distillery.kinds`) owns its task loss and the
form of its distillation term; the functions here take the kind object or its name.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager, nullcontext
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers.modeling_outputs import BaseModelOutput

import distillery.encoders as encoders
from distillery.data.encode import model_inputs
from distillery.errors import DistilleryError
from distillery.kinds import TaskKind, kind_of
from distillery.kinds.embedding import mean_pooled
from distillery.kinds.qa import span_logits
from distillery.kinds.regression import mse

PREDICTION_LOSSES = ("soft_ce", "kl", "symmetric_kl")


def _as_examples(logits: Tensor) -> Tensor:
    # (..., C) -> (N, C): every leading position is one example with its own distribution
    return logits.reshape(-1, logits.shape[-1])


def _check_same_shape(a: Tensor, b: Tensor, what: str) -> None:
    if a.shape != b.shape:
        raise ValueError(f"{what} must have the same shape, got {tuple(a.shape)} and {tuple(b.shape)}.")


def soft_cross_entropy_to(logits: Tensor, target: Tensor) -> Tensor:
    """Cross-entropy against a given distribution ``target`` (probabilities, the shape of ``logits``).

    ``mean_i [ −Σ_c target_ic · log_softmax(logits_i)_c ]``
    """
    _check_same_shape(logits, target, "logits and target")
    return -(_as_examples(target) * F.log_softmax(_as_examples(logits).float(), dim=-1)).sum(dim=-1).mean()


def soft_cross_entropy(student_logits: Tensor, teacher_logits: Tensor, temperature: float = 1.0) -> Tensor:
    """Cross-entropy of the student against the teacher's softened distribution (Hinton et al.).

    ``T² · mean_i [ −Σ_c softmax(t_i / T)_c · log_softmax(s_i / T)_c ]``

    The ``T²`` keeps gradient magnitudes comparable across temperatures.
    """
    _check_same_shape(student_logits, teacher_logits, "student and teacher logits")
    t = float(temperature)
    if t <= 0:
        raise ValueError(f"temperature must be positive, got {temperature}.")
    s = _as_examples(student_logits).float()
    p_teacher = F.softmax(_as_examples(teacher_logits).float() / t, dim=-1)
    return soft_cross_entropy_to(s / t, p_teacher) * t * t


def kl_divergence(student_logits: Tensor, teacher_logits: Tensor, temperature: float = 1.0) -> Tensor:
    """KL divergence of the student from the teacher, averaged over examples.

    ``T² · (1/N) Σ_i Σ_c p_t,ic · (log p_t,ic − log p_s,ic)``  with ``p = softmax(logits / T)``

    That is ``KL(p_t ‖ p_s)`` with ``reduction="batchmean"``; it differs from
    :func:`soft_cross_entropy` by the teacher's entropy, a constant for the student.
    """
    _check_same_shape(student_logits, teacher_logits, "student and teacher logits")
    t = float(temperature)
    if t <= 0:
        raise ValueError(f"temperature must be positive, got {temperature}.")
    log_p_student = F.log_softmax(_as_examples(student_logits).float() / t, dim=-1)
    log_p_teacher = F.log_softmax(_as_examples(teacher_logits).float() / t, dim=-1)
    kl = F.kl_div(log_p_student, log_p_teacher, reduction="batchmean", log_target=True)
    return kl * t * t


def symmetric_kl(a_logits: Tensor, b_logits: Tensor, temperature: float = 1.0) -> Tensor:
    """Symmetric KL divergence, MoEBERT's prediction-layer loss (Eq. 6).

    ``½ (KL(p ‖ q) + KL(q ‖ p))``  with ``p = softmax(a / T)``, ``q = softmax(b / T)``,
    each term as in :func:`kl_divergence` (batch mean, times ``T²``).
    """
    return 0.5 * (kl_divergence(a_logits, b_logits, temperature) + kl_divergence(b_logits, a_logits, temperature))


class HiddenProjection(nn.Module):
    """A learned linear map from the student's hidden size to the teacher's (TinyBERT's ``W_h``).

    When both sizes are equal it starts as the identity (zero bias), so that a student which already
    matches the teacher starts with zero hidden loss. Pass it to the Trainer's ``extra_parameters``
    so that it is trained (and checkpointed) with the student.
    """

    def __init__(self, student_dim: int, teacher_dim: int, bias: bool = True):
        super().__init__()
        if student_dim < 1 or teacher_dim < 1:
            raise ValueError(f"hidden sizes must be positive, got {student_dim} and {teacher_dim}.")
        self.student_dim = student_dim
        self.teacher_dim = teacher_dim
        self.linear = nn.Linear(student_dim, teacher_dim, bias=bias)
        if student_dim == teacher_dim:
            with torch.no_grad():
                self.linear.weight.copy_(torch.eye(teacher_dim))
                if bias:
                    self.linear.bias.zero_()

    @torch.no_grad()
    def start_at_least_squares(self, x: Tensor, y: Tensor, ridge: float = 1e-3) -> "HiddenProjection":
        """Start at the ridge least-squares map of ``x`` (N, d_student) onto ``y`` (N, d_teacher), the ridge a share
        of ``x``'s mean square. A student whose own vectors already carry meaning (a pretrained encoder) then starts
        near the teacher's, and its first steps are not spent bending its encoder to fit a random map."""
        x = x.double()
        design = torch.cat([x, torch.ones(len(x), 1, dtype=x.dtype)], dim=1) if self.linear.bias is not None else x
        gram = design.T @ design
        gram += ridge * gram.diagonal().mean() * torch.eye(len(gram), dtype=gram.dtype)
        solved = torch.linalg.solve(gram, design.T @ y.double())  # (d_student [+1], d_teacher)
        self.linear.weight.copy_(solved[: self.student_dim].T)
        if self.linear.bias is not None:
            self.linear.bias.copy_(solved[self.student_dim])
        return self

    def forward(self, hidden: Tensor) -> Tensor:
        return self.linear(hidden)  # (..., d_student) -> (..., d_teacher)

    def extra_repr(self) -> str:
        return f"student_dim={self.student_dim}, teacher_dim={self.teacher_dim}"


def hidden_mse(
    student_hidden: Tensor,
    teacher_hidden: Tensor,
    projection: nn.Module | None = None,
    attention_mask: Tensor | None = None,
) -> Tensor:
    """Mean squared error between hidden states, after an optional projection of the student's.

    Without a mask: ``mean over all elements of (P(h_s) − h_t)²``.
    With ``attention_mask`` ``m`` of shape ``(B, L)``, padding is left out:
    ``Σ_{b,l} m_bl · Σ_d (P(h_s) − h_t)²_bld  /  (Σ_{b,l} m_bl · d)``.
    """
    if projection is not None:
        student_hidden = projection(student_hidden)  # (B, L, d_student) -> (B, L, d_teacher)
    if student_hidden.shape != teacher_hidden.shape:
        raise ValueError(
            f"student hidden states {tuple(student_hidden.shape)} do not match the teacher's "
            f"{tuple(teacher_hidden.shape)}; pass a HiddenProjection when the hidden sizes differ."
        )
    diff2 = (student_hidden.float() - teacher_hidden.float()).pow(2)
    if attention_mask is None:
        return diff2.mean()
    if tuple(attention_mask.shape) != tuple(diff2.shape[:-1]):
        raise ValueError(
            f"attention_mask {tuple(attention_mask.shape)} must match the hidden states' leading "
            f"dimensions {tuple(diff2.shape[:-1])}."
        )
    mask = attention_mask.to(diff2.dtype).unsqueeze(-1)  # (B, L) -> (B, L, 1)
    denom = mask.sum() * diff2.shape[-1]
    return (diff2 * mask).sum() / denom.clamp_min(1.0)


def attention_kl(student_attention: Tensor, teacher_attention: Tensor, attention_mask: Tensor | None = None,
                 eps: float = 1e-12) -> Tensor:
    """Self-attention distillation (MiniLM): the KL divergence of each student head's attention distribution of a
    query from the teacher head's, averaged over heads and queries, ``(B, H, L, L)`` weights each.

    ``Σ_{b,h,q} m_bq · Σ_k a^t_bhqk (log a^t_bhqk − log a^s_bhqk)  /  (H · Σ_{b,q} m_bq)``, padded queries
    (``m`` = 0) left out; a padded key has weight 0 in both, so it adds nothing."""
    _check_same_shape(student_attention, teacher_attention, "student and teacher attention weights")
    t, s = teacher_attention.float(), student_attention.float()
    kl = (t * (t.clamp_min(eps).log() - s.clamp_min(eps).log())).sum(dim=-1)  # (B, H, L)
    if attention_mask is None:
        return kl.mean()
    mask = attention_mask.to(kl.dtype).unsqueeze(1)  # (B, L) -> (B, 1, L)
    return (kl * mask).sum() / (mask.sum() * kl.shape[1]).clamp_min(1.0)


@contextmanager
def attention_weights(student: nn.Module, teacher: nn.Module) -> Iterator[None]:
    """Both models return their attention weights (``output_attentions``) inside the block: the eager attention
    (the fused kernels return none), and the student's attention probabilities without dropout, for the weights
    returned are those after dropout, whose zeros no KL can compare (the student's other dropout stays)."""
    layers = encoders.encoder_layers(student)
    layout = encoders.layout_of(student.config)
    attention = (layout.query or layout.qkv).rsplit(".", 1)[0]  # the module holding the projections
    # the module and its own (a dropout module applied to the weights: MPNet, DeBERTa-v2)
    modules = [m for layer in layers for m in encoders.submodule(layer, attention).modules()]
    configs = {id(m.config): m.config for m in (student, teacher)}.values()
    before = [(c, c._attn_implementation) for c in configs], [(m, m.training) for m in modules]
    for config in configs:
        config._attn_implementation = "eager"
    for module in modules:
        module.training = False  # the dropout on the weights off (DeBERTa-v2: on its relative embeddings too)
    try:
        yield
    finally:
        for config, implementation in before[0]:
            config._attn_implementation = implementation
        for module, training in before[1]:
            module.training = training


def task_loss(kind: TaskKind | str, outputs_or_logits: Any, batch: Mapping[str, Tensor], reduction: str = "mean") -> Tensor:
    """The supervised loss against the gold labels, as Hugging Face heads compute it (the ``kind``'s):

    - classification: ``CE(logits, labels)`` (labels of -100 are ignored);
    - regression: ``mean (logits.squeeze(-1) − labels)²`` with float labels;
    - qa: ``½ (CE(start_logits, start_positions) + CE(end_logits, end_positions))``, positions
      clamped into ``[0, L]`` and ``L`` ignored (answers cut off by a window do not count).

    ``reduction="none"`` returns one loss per example (ignored ones are 0) instead of the mean:
    what per-example quantities such as MoEBERT's importance scores need.
    """
    kind = kind_of(kind)
    if reduction not in ("mean", "none"):
        raise ValueError(f"reduction must be 'mean' or 'none', got {reduction!r}.")
    return kind.task_loss(outputs_or_logits, batch, reduction)


_PREDICTION_LOSS_FNS = {"soft_ce": soft_cross_entropy, "kl": kl_divergence, "symmetric_kl": symmetric_kl}


def prediction_distillation(
    kind: TaskKind | str,
    student_out: Any,
    teacher_out: Any,
    temperature: float = 1.0,
    loss: str = "soft_ce",
    batch: Mapping[str, Tensor] | None = None,
) -> Tensor:
    """Distillation of the teacher's predictions into the student's (the ``kind``'s term):

    - classification: ``loss(student_logits, teacher_logits, T)``;
    - regression: :func:`mse` between the predictions (temperature does not apply);
    - qa: ``½ (loss(s_start, t_start, T) + loss(s_end, t_end, T))`` over positions.

    ``loss`` is one of ``soft_ce`` (:func:`soft_cross_entropy`), ``kl`` (:func:`kl_divergence`) or
    ``symmetric_kl`` (:func:`symmetric_kl`). ``batch``: the batch the outputs were computed on, where the kind
    compares some positions only (token classification: each word's first sub-word, ``kind.distilled_positions``).
    """
    kind = kind_of(kind)
    if loss not in _PREDICTION_LOSS_FNS:
        raise DistilleryError(
            f"Unknown prediction distillation loss {loss!r}; choose one of {', '.join(PREDICTION_LOSSES)}."
        )
    if batch is not None:
        student_out, teacher_out = kind.distilled_positions(student_out, teacher_out, batch)
    return kind.distillation_term(student_out, teacher_out, temperature, _PREDICTION_LOSS_FNS[loss])


def kd_gap(kind: TaskKind | str, student_out: Any, teacher_out: Any, temperature: float,
           batch: Mapping[str, Tensor] | None = None) -> dict[str, float]:
    """``{"kl": T²·KL(p_teacher ‖ p_student)}`` at ``temperature``, for the training log, beside the soft cross-entropy
    ``kd``: the soft CE never falls below the teacher's own entropy (T²·H(p_teacher), large when the teacher's
    logits are close together), so its value alone hides how much the student still has to learn; the KL is 0 at
    a perfect match. Empty for regression, whose distillation term (MSE) already is 0 at a match."""
    kind = kind_of(kind)
    with torch.no_grad():
        if batch is not None:
            student_out, teacher_out = kind.distilled_positions(student_out, teacher_out, batch)
        return kind.distillation_gap(student_out, teacher_out, temperature, kl_divergence)


def kd_mix(task_term: torch.Tensor, kd_term: torch.Tensor, kd_weight: float) -> torch.Tensor:
    """(1 − kd_weight)·task term + kd_weight·distillation term: the one mix of every method and command, so that
    ``kd_weight`` always means the share of the distillation term."""
    return (1 - kd_weight) * task_term + kd_weight * kd_term


def carried_span_distillation(student_out: Any, batch: Mapping[str, Tensor], temperature: float = 1.0) -> Tensor:
    """SQuAD distillation against start/end distributions given per student position (``teacher_start`` and
    ``teacher_end``, already softened at ``temperature``: a teacher with another tokenizer, carried through
    character offsets by :mod:`distillery.distill.span_carry`).

    ``T² · ½ (H(p_start, softmax(s_start / T)) + H(p_end, softmax(s_end / T)))``, padding left out of the softmax.
    """
    t = float(temperature)
    mask = batch.get("attention_mask")

    def one(logits: Tensor, target: Tensor) -> Tensor:
        logits = logits.float() / t
        if mask is not None:  # padded positions carry no target and take no share of the student's softmax
            logits = logits.masked_fill(mask.to(logits.device) == 0, -1e4)
        return soft_cross_entropy_to(logits, target.to(logits.device)) * t * t

    s_start, s_end = span_logits(student_out)
    return (one(s_start, batch["teacher_start"]) + one(s_end, batch["teacher_end"])) / 2


def distillation_loss(kind: TaskKind | str, teacher: nn.Module, kd_weight: float, temperature: float,
                      hidden_weight: float = 0.0, layer_map: list[int] | None = None, attention_weight: float = 0.0,
                      teacher_dims: Tensor | None = None):
    """loss_fn for the trainer: (1 − kd_weight)·task loss + kd_weight·prediction KD (+ hidden_weight·
    hidden MSE between student layer j and teacher layer ``layer_map[j]``, Patient-KD style; + attention_weight·
    :func:`attention_kl` between the same layers' attention weights, summed over them as the hidden term is).
    ``teacher_dims``: the teacher's hidden dimensions a student of narrower width kept, in its order (a model whose
    hidden dimension was pruned): the hidden term compares the student's states with the teacher's on those.

    The teacher's predictions are read from a batch's ``teacher_logits`` column when the batch has
    one (computed once and cached: ``MethodContext.train_with_teacher_logits``), else computed here.
    ``kd_weight`` means the same in every method and command: the share of the distillation term."""
    kind = kind_of(kind)

    attend = attention_weight > 0

    def loss_fn(model, batch):
        with attention_weights(model, teacher) if attend else nullcontext():
            out = model(**model_inputs(batch, model), output_hidden_states=hidden_weight > 0, output_attentions=attend)
            if "teacher_logits" in batch and hidden_weight <= 0 and not attend:
                t_out = kind.cached_teacher_outputs(batch["teacher_logits"])
            else:
                with torch.no_grad():
                    t_out = teacher(**model_inputs(batch, teacher), output_hidden_states=hidden_weight > 0,
                                    output_attentions=attend)
        ce = task_loss(kind, out, batch)
        kd = prediction_distillation(kind, out, t_out, temperature=temperature, batch=batch)
        loss = kd_mix(ce, kd, kd_weight)
        logs = {"ce": float(ce.detach()), "kd": float(kd.detach()), **kd_gap(kind, out, t_out, temperature, batch)}
        if hidden_weight > 0:
            # hidden_states[0] is the embedding output; student layer j was copied from teacher layer layer_map[j]
            pairs = [(0, 0)] + [(j + 1, t + 1) for j, t in enumerate(layer_map)]
            mask = batch.get("attention_mask")
            kept = (lambda h: h) if teacher_dims is None else (lambda h: h.index_select(-1, teacher_dims.to(h.device)))
            hid = sum(hidden_mse(out.hidden_states[s], kept(t_out.hidden_states[t]), attention_mask=mask)
                      for s, t in pairs)
            loss = loss + hidden_weight * hid
            logs["hidden"] = float(hid.detach())
        if attend:
            mask = batch.get("attention_mask")
            att = sum(attention_kl(out.attentions[j], t_out.attentions[t], mask) for j, t in enumerate(layer_map))
            loss = loss + attention_weight * att
            logs["attention"] = float(att.detach())
        return loss, logs

    return loss_fn


def pretrained_distillation_loss(kind: TaskKind | str, teacher: nn.Module, kd_weight: float, temperature: float,
                                 hidden_weight: float = 0.0, projection: nn.Module | None = None,
                                 layer_map: list[int] | None = None, output_projection: nn.Module | None = None):
    """loss_fn for a pretrained student (method distill's ``--student``), which reads its own tokenizer's ids:
    (1 − kd_weight)·task loss + kd_weight·KD against the teacher targets the batch carries (``teacher_logits``,
    or SQuAD's carried ``teacher_start``/``teacher_end``: :func:`carried_span_distillation`), never the teacher
    run on the batch, plus with ``hidden_weight``:

    - ``layer_map`` given (the tokenizers match, so positions line up): the mean over student layers j of
      :func:`hidden_mse` between ``projection(h_s[j])`` and the teacher's layer ``layer_map[j]``, the teacher
      run on the same batch;
    - else (another tokenizer): MSE between ``projection`` of the student's :func:`mean_pooled` last hidden
      state and the teacher's (the batch's ``teacher_pooled``), one sentence vector each.

    ``output_projection``: a learned map of the student's last hidden states onto the teacher's width, applied
    before the kind's terms (an embedder of another width, ``TaskKind.projects_width``), trained with the student and
    not part of it."""
    kind = kind_of(kind)

    def loss_fn(model, batch):
        out = model(**model_inputs(batch, model), output_hidden_states=hidden_weight > 0)
        if output_projection is not None:
            out = BaseModelOutput(last_hidden_state=output_projection(out.last_hidden_state),
                                  hidden_states=out.hidden_states)
        if "teacher_start" in batch:
            kd = carried_span_distillation(out, batch, temperature)
        else:
            t_out = kind.cached_teacher_outputs(batch["teacher_logits"])
            kd = prediction_distillation(kind, out, t_out, temperature=temperature, batch=batch)
        ce = task_loss(kind, out, batch)
        loss = (1 - kd_weight) * ce + kd_weight * kd
        logs = {"ce": float(ce.detach()), "kd": float(kd.detach()),
                **({} if "teacher_start" in batch else kd_gap(kind, out, t_out, temperature, batch))}
        if hidden_weight > 0:
            mask = batch.get("attention_mask")
            if layer_map is not None:
                with torch.no_grad():
                    t_hidden = teacher(**model_inputs(batch, teacher), output_hidden_states=True).hidden_states
                hid = sum(hidden_mse(out.hidden_states[j + 1], t_hidden[t + 1], projection, mask)
                          for j, t in enumerate(layer_map)) / len(layer_map)
            else:
                pooled = mean_pooled(out.hidden_states[-1], mask)
                hid = hidden_mse(pooled, batch["teacher_pooled"].to(pooled.device), projection)
            loss = loss + hidden_weight * hid
            logs["hidden"] = float(hid.detach())
        return loss, logs

    return loss_fn
