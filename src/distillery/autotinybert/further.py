"""AutoTinyBERT's further training of the chosen sub-network: its settings and its loss.

The settings the user left unset come from the one rule method distill's layer-drop students take
(:func:`distillery.distill.recipe.student_defaults`, :mod:`distillery.distill.deep_cut`): a sub-network keeping fewer
than half of the super-net's layers is a deep cut, and its layers are the same top-of-block teacher layers a
layer-drop student keeps (:func:`distillery.autotinybert.supernet.sub_layers` spreads them as distill does), so the
hidden-state and attention terms pair them with those teacher layers. Two limits of the sub-network's shape:

- the hidden-state term compares states of one width (:func:`distillery.training.losses.distillation_loss`), so it
  applies only where the sub-network keeps the teacher's hidden size (the default: ``search_hidden`` off);
- the attention term compares head by head, so it applies only where the sub-network keeps the teacher's head count
  (the default ``head-dims`` strategy always does; ``heads`` may drop heads).

A shallower sub-network keeps the earlier defaults: T = 2, no hidden or attention term, the budget's schedule, and
the learning rate × (speed-up − 1) within 1–3× (:func:`further_lr_scale`).
"""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

from distillery.autotinybert.supernet import sub_layers
from distillery.distill import deep_cut
from distillery.distill.recipe import Chosen, augment_choice, student_defaults, without_hidden_term


def further_lr_scale(speedup: float) -> float:
    """A shallow sub-network's learning rate over the student's: (speed-up − 1) within 1–3×, as a smaller one, further
    from the teacher it was cut from, needs larger steps (see the option ``further_lr``)."""
    return min(3.0, max(1.0, speedup - 1.0))


def further_augment(ctx, opts, layers: int) -> tuple[int, str | None]:
    """New rows per train row for the further training of a sub-network of ``layers`` layers, and why: the user's
    ``augment``, else the deep-cut rule's (:func:`distillery.distill.recipe.augment_choice`)."""
    return augment_choice(ctx, opts.augment, layers)


def further_defaults(ctx, opts, student, train, speedup: float, augment_reason: str | None = None
                     ) -> tuple[Chosen, list[str]]:
    """The further training's settings (:class:`Chosen`: its loss's terms and the trainer's lr, max_steps,
    warmup_ratio) with the user's options where set, else the deep-cut rule's, and the notes for the report
    (the rule's reasons, and a term the sub-network's shape leaves out)."""
    teacher = ctx.teacher.config
    layers = sub_layers(student.config.num_hidden_layers, teacher.num_hidden_layers)
    width, heads = student.config.hidden_size, student.config.num_attention_heads
    # what student_defaults reads of the options, as the user gave them, then the choices this shape rules out
    resolved = SimpleNamespace(**{name: getattr(opts, name) for name in deep_cut.RULE_OPTIONS})
    notes = without_hidden_term(resolved, opts.hidden_weight, width, teacher.hidden_size,
                                deep_cut.is_deep_cut(len(layers), teacher.num_hidden_layers), "the sub-network's width")
    # an embedder narrower than the teacher trains through a projection of its last states, without the layers' terms
    projected = ctx.task_data.task.kind_object.projects_width and width != teacher.hidden_size
    if (heads != teacher.num_attention_heads or projected) and (opts.attention_weight is None or opts.attention_weight):
        resolved.attention_weight = 0.0
        if opts.attention_weight or deep_cut.is_deep_cut(len(layers), teacher.num_hidden_layers):
            notes.append(f"No attention term: the sub-network's {heads} heads are not the teacher's "
                         f"{teacher.num_attention_heads}." if not projected else
                         "No attention term: the sub-network learns through a projection of its last states.")
    if opts.further_lr is not None:  # the user's rate as it is: no rule's scale, no reason for one
        resolved.lr_scale = 1.0
    chosen = student_defaults(ctx, resolved, layers, train, augment_reason, further_lr_scale(speedup))
    if opts.further_lr is not None:
        chosen = replace(chosen, settings={**chosen.settings, "lr": float(opts.further_lr)})
    return chosen, [f"Defaults for this cut: {reason}." for reason in chosen.reasons] + notes

