"""Method ``prune``: CoFi's structured pruning (Xia et al. 2022) to a latency measured on this machine.

latency: random pruned shapes timed here beside the teacher at 1 × 128 → a line in the shape
         (:mod:`distillery.prune.latency`) → latency.json; the target is the teacher's latency / ``speedup``.
masks:   the teacher as a full-size pruned-student model (AutoTinyBERT's conversion: every family it converts),
         hard-concrete masks on heads, FFN neurons, the hidden dimension and whole attention / FFN sub-layers
         (:mod:`distillery.prune.masks`) starting at the cheap mode's selection at the target
         (:func:`distillery.prune.fisher.cheap_start`; ``mask_init`` 0: CoFi's start, every log α 0), learned with
         the weights for ``mask_steps`` steps on
         L = KD(predictions, T) + w_layer · Σ_l MSE(W h_l, h_l^teacher) + λ1 (E − T_t) + λ2 (E − T_t)²,
         E the latency model's price of the masks' expected architecture, T_t the target (from the cheap mode's
         selection: the target throughout; from CoFi's start: falling from the teacher's latency over
         ``target_warmup`` of the phase, CoFi's warm-up), both over the teacher's latency;
         λ1, λ2 learned by gradient ascent (CoFi's Lagrangian), W a projection starting as the identity.
prune:   the deterministic masks (CoFi's: each group's expected count of units, the largest log α kept) of the
         log α shifted by one δ so that the latency model puts the shape at the target (bisection:
         :func:`distillery.prune.masks.calibrated_gates`; the phase ends near it, not on it), and
         the units they drop removed (:mod:`distillery.prune.extract`): a smaller dense model with each layer's
         heads and FFN width → pruned_shape.json, with the latency the model expects of it.
finetune: that model trained on the task with the masks fixed: (1 − w)·CE + w·KD(T), w = kd_weight; past 2× (as
         deep a cut as a layer-drop student of fewer than half the layers) the deep-cut rule's defaults
         (:mod:`distillery.distill.deep_cut`, :func:`finetune_defaults`): T from the teacher's logits, each layer's
         hidden states onto the teacher's, a longer warmed-up schedule at 3× the rate, and on a small split 8
         augmented rows a row.
"""

from __future__ import annotations

import json
from dataclasses import replace
from statistics import geometric_mean
from types import SimpleNamespace
from typing import ClassVar

import torch
from torch import nn
from transformers import PreTrainedModel

import distillery.distributed as distributed
from distillery.autotinybert.convert import check_family
from distillery.data.encode import model_inputs
from distillery.distill import deep_cut
from distillery.distill.recipe import Chosen, augment_choice, student_defaults, without_hidden_term
from distillery.errors import DistilleryError
from distillery.folders import write_file
from distillery.method import Method
from distillery.method_context import MethodContext
from distillery.prune.extract import extract, full_size, kept_units
from distillery.prune.fisher import cheap_start, fisher_masks
from distillery.prune.latency import (LatencyModel, fit_latency_model, load_record, measure_ratios, reused_record,
                                     save_record)
from distillery.prune.masks import Masks, MaskedModel, calibrated_gates, shape_of
from distillery.prune.options import PruneOptions
from distillery.training.losses import (HiddenProjection, distillation_loss, hidden_mse, prediction_distillation,
                                       pretrained_distillation_loss)
from distillery.training.trainer import Trainer


def reversed_gradient(p: torch.Tensor) -> torch.Tensor:
    """``p`` whose gradient is negated: minimising the loss maximises it in ``p`` (the Lagrange multipliers)."""
    return 2 * p.detach() - p


def mask_loss(kind, teacher, latency: LatencyModel, target: float, lambdas: nn.Parameter,
              projection: HiddenProjection, total_steps: int, warmup: float, temperature: float, layer_weight: float,
              lr_scale: float, start: float = 1.0):
    """loss_fn of the masks' phase (the module docstring's L); logs each term, the expected latency and the target
    (ratios to the teacher's latency: ``target`` is 1 / speedup, ramped down from ``start``)."""
    def loss_fn(model, batch):
        net: MaskedModel = getattr(model, "module", model)
        out = model(**model_inputs(batch, net.model), output_hidden_states=layer_weight > 0)
        with torch.no_grad():
            t_out = teacher(**model_inputs(batch, teacher), output_hidden_states=layer_weight > 0)
        kd = prediction_distillation(kind, out, t_out, temperature, loss="kl", batch=batch)
        layer = kd.new_zeros(())
        if layer_weight > 0:
            mask = batch.get("attention_mask")
            layer = sum(hidden_mse(s, t, projection, attention_mask=mask)
                        for s, t in zip(out.hidden_states[1:], t_out.hidden_states[1:])) / (len(out.hidden_states) - 1)
        done = int(net.masks.step)  # a buffer of the model: a resumed run continues the ramp where it was
        ramp = min(1.0, done / max(1.0, warmup * total_steps)) if warmup > 0 else 1.0
        net.masks.step += 1
        now = start - (start - target) * ramp
        expected = latency(net.masks.expected_shape())
        gap = expected - now
        lam = reversed_gradient(lambdas) * lr_scale
        lagrangian = lam[0] * gap + lam[1] * gap ** 2
        loss = kd + layer_weight * layer + lagrangian
        return loss, {"kd": float(kd.detach()), "layer": float(layer.detach()), "lagrangian": float(lagrangian.detach()),
                      "expected": float(expected.detach()), "target": float(now)}

    return loss_fn


def latency_model(ctx: MethodContext, opts: PruneOptions, full: nn.Module) -> tuple[LatencyModel, float]:
    """The latency model and the teacher's latency: latency.json of this run (a resumed run reads it), else measured
    on the main process (timings on cores the processes share would disagree) and written."""
    path = ctx.out_dir / "latency.json"
    prune_hidden = opts.mode == "full" and bool(opts.prune_hidden)  # the shapes this run can choose from
    if not path.is_file() and opts.latency_from:
        reused = reused_record(opts.latency_from, full, prune_hidden)
        distributed.on_main(lambda: save_record(path, reused))
    if not path.is_file():
        def measure():
            model, teacher_ms, record = fit_latency_model(full, ctx.teacher, int(opts.latency_shapes), int(opts.latency_runs),
                                                          ctx.config.student.seed, prune_hidden=prune_hidden)
            save_record(path, record)
        distributed.on_main(measure)
    model, teacher_ms, record = load_record(path)
    checked = record["noise"]
    ctx.notes.append(f"Latency model: {len(record['measurements'])} pruned shapes timed here with the teacher, "
                     f"interleaved ({teacher_ms:.1f} ms at 1x128), fitted as a ratio to the teacher's latency; "
                     f"cross-validated error {record['fit_error_mape']:.1f} % (latency.json).")
    if not checked["stable"]:
        ctx.notes.append(f"The latency model's timing was unstable after {checked['rounds']} round(s) "
                         f"({'; '.join(checked['reasons'])}): its ratios are the medians over the rounds.")
    return model, teacher_ms


def start_masks(ctx: MethodContext, opts: PruneOptions, full: nn.Module, latency: LatencyModel) -> tuple[Masks, float]:
    """The full mode's masks at the start of their phase, and the latency ratio the target ramps down from: the cheap
    mode's selection at the target (``mask_init`` > 0; the target from the start: the selection meets it), else
    CoFi's start (every log α 0, the target ramped down from the teacher's latency)."""
    c = full.config
    masks = Masks(c.num_hidden_layers, c.num_attention_heads, c.intermediate_size, c.hidden_size,
                  prune_hidden=bool(opts.prune_hidden), lr_scale=float(opts.mask_lr_scale))
    target = 1.0 / float(opts.speedup)
    if float(opts.mask_init) == 0:
        return masks, 1.0
    gates = cheap_start(ctx, int(opts.fisher_examples), full, latency, target, masks, float(opts.mask_init),
                        int(opts.min_heads or 0))
    shape = shape_of(gates, c.hidden_size)
    ctx.notes.append(f"The masks started from the cheap mode's selection (Fisher information per latency saved, "
                     f"{opts.fisher_examples} training examples; log α ±{float(opts.mask_init):g} away from its "
                     f"threshold): heads a layer {[int(h) for h in shape['heads']]}, FFN neurons a layer "
                     f"{[int(f) for f in shape['neurons']]}, expected x{1 / float(latency(shape)):.3g}.")
    return masks, target


def learn_masks(ctx: MethodContext, opts: PruneOptions, full: nn.Module, latency: LatencyModel) -> MaskedModel:
    c = full.config
    masks, start = start_masks(ctx, opts, full, latency)
    masked = MaskedModel(full.train(), masks)
    lambdas = nn.Parameter(torch.zeros(2))
    hidden = c.hidden_size
    projection = HiddenProjection(hidden, ctx.teacher.config.hidden_size)
    cfg = ctx.config.student
    steps = int(opts.mask_steps)
    cfg = replace(cfg, max_steps=steps, epochs=1.0, eval_every=None, select_best=False, patience=None)
    kind = ctx.task_data.task.kind_object
    train = (ctx.distillation_train(True, int(opts.augment or 0), logits=False) if kind.takes_new_rows
             else ctx.task_data.train)
    loss = mask_loss(kind, ctx.teacher, latency, 1.0 / float(opts.speedup), lambdas, projection, steps * cfg.grad_accum,
                     float(opts.target_warmup), opts.kd_temperature(), float(opts.layer_weight), float(opts.mask_lr_scale),
                     start)
    trainer = Trainer(masked, cfg, train, ctx.task_data.collate, loss, out_dir=ctx.out_dir / "masks", resume=ctx.resume,
                      extra_parameters=[projection, lambdas], desc="prune masks",
                      checkpoint_every=max(1, min(100, steps // 4)))  # a kill loses at most a quarter of the phase
    ctx.teacher.to(trainer.device)
    return trainer.train().model.eval().cpu()


# A selection timed further than this from the target (its latency over the teacher's, as a share of the target's) is
# selected again, at the target corrected by how far off the latency model was for the shapes timed so far, at most
# SELECTION_ROUNDS times: the model is a line fitted over random shapes (a few % of error on them), and the bench
# measured MiniLM's cheap-mode students 4-7 % short of 2× and 8× (docs/results.md). Timing the same shape twice on 2
# cores differs by up to about 5 % (auto's noise bound): a tighter tolerance chases the noise (STS-B at 4×, 3 %:
# 4.31×, then 3.63×, then 4.16×, correcting by the last round's error alone)
SELECTION_TOLERANCE = 0.05
SELECTION_ROUNDS = 2


def timed_selection(ctx: MethodContext, opts: PruneOptions, masks: Masks, latency: LatencyModel, full: nn.Module
                    ) -> tuple[dict, float, dict]:
    """The gates of ``masks`` at the target, checked by timing the shape they keep with the teacher here (as the
    latency model's shapes were): where it is off by more than :data:`SELECTION_TOLERANCE`, the target given to the
    selection is the target over the model's mean error on the shapes timed so far (measured over predicted, a
    geometric mean: one noisy timing moves it less), and the new shape is timed; the shape timed closest is kept.
    The timings are in this run's selection.json (a resumed run reads them: the same gates); returns the gates,
    their shift and the record."""
    path = ctx.out_dir / "selection.json"
    target = 1.0 / float(opts.speedup)
    hidden = full.config.hidden_size
    if not path.is_file():
        def measure():
            asked, rounds = target, []
            for _ in range(SELECTION_ROUNDS + 1):
                gates, _ = calibrated_gates(masks, latency, asked)
                shape = shape_of(gates, hidden)
                ratios, teacher_ms, checks = measure_ratios(full, [shape], ctx.teacher, int(opts.latency_runs))
                rounds.append({"asked_ratio": asked, "predicted_ratio": float(latency(shape)),
                               "measured_ratio": ratios[0], "teacher_ms": teacher_ms, "stable": checks[-1]["stable"]})
                if abs(ratios[0] / target - 1) <= SELECTION_TOLERANCE:
                    break
                asked = target / geometric_mean([r["measured_ratio"] / r["predicted_ratio"] for r in rounds])
            chosen = min(range(len(rounds)), key=lambda i: abs(rounds[i]["measured_ratio"] / target - 1))
            write_file(path, json.dumps({"target_ratio": target, "tolerance": SELECTION_TOLERANCE, "chosen": chosen,
                                         "rounds": rounds}, indent=2))
        distributed.on_main(measure)
    record = json.loads(path.read_text())
    gates, shift = calibrated_gates(masks, latency, record["rounds"][record["chosen"]]["asked_ratio"])
    return gates, shift, record


def selection_note(record: dict) -> str:
    """What the timing of the selection found, for the report."""
    rounds, target = record["rounds"], 1.0 / record["target_ratio"]
    first, chosen = rounds[0], rounds[record["chosen"]]
    said = (f"Timed here before fine-tuning, the selection at the target ran at x{1 / first['measured_ratio']:.3g} "
            f"against x{target:.3g} (the latency model expected x{1 / first['predicted_ratio']:.3g})")
    if len(rounds) == 1:
        return said + f": within {record['tolerance']:.0%}, kept."
    return (said + f"; selected again at the target corrected by that error ({len(rounds) - 1} time"
            f"{'s' if len(rounds) > 2 else ''}): the shape kept runs at x{1 / chosen['measured_ratio']:.3g} "
            f"(selection.json).")


def describe(gates: dict, latency: LatencyModel, teacher_ms: float, target_ms: float, full_config) -> dict:
    shape = shape_of(gates, full_config.hidden_size)
    ratio = float(latency(shape))
    return {"layer_heads": [int(h) for h in shape["heads"]], "layer_intermediate_sizes": [int(f) for f in shape["neurons"]],
            "hidden_size": int(shape["hidden"]), "teacher_ms": teacher_ms, "target_ms": target_ms,
            "predicted_ratio": ratio, "predicted_ms": ratio * teacher_ms, "predicted_speedup": 1.0 / max(ratio, 1e-9)}


def with_target(ctx: MethodContext, opts: PruneOptions, teacher_ms: float) -> PruneOptions:
    """``opts`` with ``speedup`` the teacher's latency measured here over ``latency_ms`` where that was the target."""
    if opts.latency_ms is None:
        return opts
    if float(opts.latency_ms) >= teacher_ms:
        raise DistilleryError(f"--latency-ms {opts.latency_ms:g}: the teacher already runs in {teacher_ms:.2f} ms at "
                              f"1x128 on this machine; ask for less, or use the teacher.")
    speedup = teacher_ms / float(opts.latency_ms)
    ctx.notes.append(f"Target --latency-ms {opts.latency_ms:g}: the teacher measured {teacher_ms:.2f} ms here, so a "
                     f"speed-up of x{speedup:.3g}.")
    return replace(opts, speedup=speedup)


def with_head_floor(ctx: MethodContext, opts: PruneOptions) -> PruneOptions:
    """``opts`` with ``min_heads`` the task kind's share of the teacher's heads where the user gave none."""
    if opts.min_heads is not None:
        return opts
    kind, heads = ctx.task_data.task.kind_object, ctx.teacher.config.num_attention_heads
    floor = round(kind.prune_head_floor * heads)
    if floor:
        ctx.notes.append(f"Head floor: each layer keeps at least its {floor} best of {heads} heads (the {kind.name} "
                         f"kind's default, --option min_heads); the selection cuts FFN neurons instead.")
    return replace(opts, min_heads=floor)


def finetune_defaults(ctx: MethodContext, opts: PruneOptions, student: nn.Module, pruned_from: list[int], train,
                      augment_reason: str | None) -> tuple[Chosen, list[str]]:
    """The fine-tuning's settings with the user's options where set, else the deep-cut rule's for a model pruned past
    2× (:func:`deep_cut.equivalent_layers`; the settings of :func:`distillery.distill.recipe.student_defaults`), and the
    notes for the report. Each pruned layer learns the teacher layer it was pruned from (``pruned_from``: a layer
    left with neither sub-layer is gone, :func:`distillery.prune.extract.kept_units`), on the teacher's dimensions
    the pruned hidden width kept (an embedder narrower than the teacher learns through a projection of its last
    states instead), and never the attention maps (its layers keep different numbers of heads)."""
    n = ctx.teacher.config.num_hidden_layers
    equivalent = deep_cut.equivalent_layers(float(opts.speedup), n)
    resolved = SimpleNamespace(**{name: getattr(opts, name, None) for name in deep_cut.RULE_OPTIONS})
    resolved.attention_weight = 0.0
    deep, reasons = deep_cut.is_deep_cut(equivalent, n), []
    width, teacher_width = student.config.hidden_size, ctx.teacher.config.hidden_size
    kind = ctx.task_data.task.kind_object
    # a pruned hidden width keeps some of the teacher's own dimensions, and the term compares the states on those
    # (finetune_loss); only an embedder learns through a projection of its last states instead
    compared = teacher_width if kind.projects_width else width
    notes = without_hidden_term(resolved, opts.hidden_weight, width, compared, deep, "the pruned width")
    weight = deep_cut.DEEP_CUT_HIDDEN_WEIGHT if deep else kind.prune_hidden_weight
    if width == compared and weight and opts.hidden_weight is None:
        # the rule's weight (or the kind's at any speed-up), on the layers' own teacher layers
        resolved.hidden_weight = weight
        on_kept = '' if width == teacher_width else f', on the {width} of its {teacher_width} dimensions kept'
        reasons.append(f"hidden-state distillation (weight {weight:g}, each pruned layer onto the teacher layer it "
                       f"was pruned from{on_kept}{'' if deep else f'; the {kind.name} kind at any speed-up'})")
    chosen = student_defaults(ctx, resolved, deep_cut.uniform_layer_map(equivalent, n), train, augment_reason)
    chosen = replace(chosen, hidden_layers=list(pruned_from))
    said = (f"Defaults for a model pruned to {float(opts.speedup):.3g}x (as deep a cut as a layer-drop student of "
            f"{equivalent} of {n} layers): ")
    return chosen, [said + reason + "." for reason in reasons + chosen.reasons] + notes


def finetune_augment(ctx: MethodContext, opts: PruneOptions) -> tuple[int, str | None]:
    """New rows per train row for the fine-tuning, and why: the user's ``augment``, else the deep-cut rule's."""
    return augment_choice(ctx, opts.augment,
                          deep_cut.equivalent_layers(float(opts.speedup), ctx.teacher.config.num_hidden_layers))


def finetune_loss(kind, teacher, student, gates: dict, kd_weight: float, chosen: Chosen):
    """The fine-tuning's loss_fn and what is trained beside the student: the kind's distillation loss (its hidden
    term on the teacher's dimensions kept where the hidden dimension was pruned), or for an
    embedder whose hidden dimension was pruned (``TaskKind.projects_width``: its vectors narrower than the teacher's)
    the same through a projection of its last hidden states onto the teacher's width, started as the selection of
    the kept dimensions (the student's vector then starts as the teacher's in those dimensions), used in the loss
    only as a narrower ``--student``'s is."""
    width, wanted = student.config.hidden_size, teacher.config.hidden_size
    dims = None if width == wanted else kept_units(gates, wanted)["hidden"]  # the student's dimension j is dims[j]
    if not kind.projects_width or dims is None:
        return distillation_loss(kind, teacher, kd_weight, chosen.temperature, chosen.hidden_weight,
                                 chosen.hidden_layers, teacher_dims=dims), []
    onto = HiddenProjection(width, wanted)
    with torch.no_grad():
        onto.linear.weight.zero_()
        onto.linear.bias.zero_()
        onto.linear.weight[dims, torch.arange(width)] = 1.0
    return pretrained_distillation_loss(kind, teacher, kd_weight, chosen.temperature, output_projection=onto), [onto]


class Prune(Method):
    name: ClassVar[str] = "prune"

    def check(self, config, teacher_config) -> None:
        self.options(config)
        check_family(teacher_config)  # AutoTinyBERT's families, or a sentence saying what the student lacks

    def run(self, ctx: MethodContext) -> PreTrainedModel:
        opts: PruneOptions = self.options(ctx.config)
        ctx.teacher.eval()
        full, _ = full_size(ctx.teacher)  # an embedder's: the bare pruned encoder (no head)
        kind = ctx.task_data.task.kind_object
        latency, teacher_ms = latency_model(ctx, opts, full)
        opts = with_head_floor(ctx, with_target(ctx, opts, teacher_ms))
        target_ms = teacher_ms / float(opts.speedup)
        if opts.mode == "cheap":
            masks, model = fisher_masks(ctx, int(opts.fisher_examples), full, latency, opts.min_heads), full
            ctx.notes.append(f"Cheap mode: heads and FFN neurons ranked by Fisher information per latency saved on "
                             f"{opts.fisher_examples} training examples (Kwon et al. 2022); no masks' phase.")
        else:
            masked = learn_masks(ctx, opts, full, latency)
            masks, model = masked.masks, masked.model
        gates, shift, timed = timed_selection(ctx, opts, masks, latency, full)
        student = extract(model, gates)
        facts = describe(gates, latency, teacher_ms, target_ms, full.config)
        chosen = timed["rounds"][timed["chosen"]]
        with torch.no_grad():
            facts.update(masks_expected_ratio=float(latency(masks.expected_shape())), calibration_shift=shift,
                         mode=opts.mode, selection_speedup=1.0 / chosen["measured_ratio"],
                         selection_rounds=len(timed["rounds"]))
        if distributed.is_main():
            write_file(ctx.out_dir / "pruned_shape.json", json.dumps(facts, indent=2))
        ctx.notes.append(f"Pruned: heads a layer {facts['layer_heads']}, FFN neurons a layer {facts['layer_intermediate_sizes']}, "
                         f"hidden {facts['hidden_size']} of {full.config.hidden_size}; the latency model expects "
                         f"{facts['predicted_ms']:.2f} ms against a target of {target_ms:.2f} ms "
                         f"(x{facts['predicted_speedup']:.3g}; the bench measures what was achieved).")
        ctx.notes.append(selection_note(timed))
        if opts.mode == "full":
            ctx.notes.append(f"The masks' phase ended at an expected x{1 / facts['masks_expected_ratio']:.3g}; the units "
                             f"kept are those of the largest log α shifted by {shift:+.2f} to meet the target.")
        if not opts.finetune:
            return student
        train = ctx.task_data.train
        augment, augment_reason = finetune_augment(ctx, opts)
        if kind.caches_teacher_outputs:
            train = ctx.distillation_train(True, augment)
        pruned_from = kept_units(gates, full.config.hidden_size)["layers"]
        chosen, notes = finetune_defaults(ctx, opts, student, pruned_from, train, augment_reason if augment else None)
        kd_weight = chosen.kd_weight
        loss, extra = finetune_loss(kind, ctx.teacher, student, gates, kd_weight, chosen)
        words = kind.loss_words(kd_weight, chosen.temperature) + chosen.layer_terms("pruned")
        ctx.notes.append(f"Fine-tuning with the masks fixed: {words}" + (
            f", through a projection of the student's {student.config.hidden_size} kept dimensions onto the teacher's "
            f"{ctx.teacher.config.hidden_size} (started as their selection; used in the loss only, not saved)"
            if extra else "") + ".")
        ctx.notes.extend(notes)
        return ctx.train(student.train(), loss, desc="prune finetune", train_dataset=train, extra_parameters=extra,
                         **chosen.settings)
