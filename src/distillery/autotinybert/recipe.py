"""Method ``autotinybert``: the best sub-architecture of a one-shot super-network under a latency budget.

setup:   a super-net cut from the fine-tuned teacher (full size = the teacher), its FFN neurons and heads
         ordered by importance on the train split (``rewire``: first-k slices keep the most important
         units), trained one-shot (Algorithm 1 with the sandwich rule, KD from the teacher on the
         task's train text: hidden state + attention scores).
latency: K sampled architectures extracted and timed on this machine at 1×128 → an MLP predictor
         (held-out MAPE, beside a FLOP-count baseline's) → latency.json; the budget is the teacher's
         latency measured here divided by ``speedup`` (or ``budget_ms``).
search:  Algorithm 2 over the architectures at the teacher's hidden size (``search_hidden``: d_m too)
         (evolution under the predicted-latency constraint; a candidate's score: a linear
         probe on its inherited [CLS] state, held-out train examples — or ``evaluator=proxy``, its KD loss
         in the super-net; the ``distill`` baseline's shape — every other layer at full width — is in
         generation 0 whenever it is predicted within the budget) → search.json / search.png; the winner is
         extracted and timed, and the next best taken if it misses the budget by more than 5 %.
         ``arch`` skips the search: "fast" (AutoTinyBERT-Fast's rule), "conventional" (d_f = 4·d_m,
         d_qkv = d_m at the same latency: the comparison row) or "l,d_m,d_f,h,d_qkv".
train:   the extracted model, further trained on the task with the one trainer: (1 − w)·CE + w·KD(T), w = kd_weight,
         at the student's learning rate × (speed-up − 1) within 1–3× (``further_lr``); a sub-network keeping fewer
         than half of the layers takes the deep-cut rule's defaults (:mod:`distillery.autotinybert.further`).
"""

from __future__ import annotations

import json
import logging
import random
import statistics
from collections.abc import Callable
from typing import ClassVar

import torch
from transformers import PreTrainedModel

import distillery.distributed as distributed
from distillery.autotinybert.convert import check_family
from distillery.autotinybert.embedder import embedding_evaluator, further_training_loss, training_rows
from distillery.autotinybert.further import further_augment, further_defaults
from distillery.autotinybert.latency import fit_predictor, measure, save_predictor
from distillery.autotinybert.oneshot import (KDTerms, check_task_supernet, kd_loss, load_projection, load_supernet,
                                             make_projection, one_shot_loss, save_supernet, teacher_targets)
from distillery.autotinybert.pretrain import for_task, is_pretrained
from distillery.autotinybert.search import conventional, evolutionary_search, fast_candidates as fast_rule
from distillery.autotinybert.space import Arch, SearchSpace
from distillery.autotinybert.supernet import SuperNet
from distillery.bench import latency_ms
from distillery.distill.recipe import select_layers
from distillery.errors import DistilleryError
from distillery.evaluation import score
from distillery.folders import record, write_file
from distillery.kinds.token_classification import IGNORED
from distillery.method import Method
from distillery.method_context import MethodContext
from distillery.training.losses import distillation_loss
from distillery.training.trainer import Trainer

logger = logging.getLogger("distillery")


def parse_arch(text: str) -> Arch:
    try:
        values = [int(v) for v in str(text).split(",")]
        return Arch(*values)
    except (TypeError, ValueError):
        raise DistilleryError(f"arch must be 'fast', 'conventional' or five integers l,d_m,d_f,h,d_qkv; got {text!r}.") from None


def train_supernet_on_task(ctx: MethodContext, opts) -> tuple:
    """Algorithm 1 on the task's train split, KD from the fine-tuned teacher; saved to ``supernet/``
    (:func:`~distillery.autotinybert.oneshot.save_supernet`), so that other runs on the task (another
    budget, the conventional row) can start from it with ``--option supernet=RUN/supernet``. Given a
    super-net pre-trained on a corpus (``autotinybert pretrain``), the one-shot phase starts from it
    (``task_phase``; off: it is searched as pre-trained); given a task super-net, there is none."""
    if opts.supernet and is_pretrained(opts.supernet):
        base = None if ctx.config.teacher.finetuned else ctx.config.teacher.name
        supernet, projection, note = for_task(opts.supernet, ctx.teacher, base, opts.strategy)
        if not opts.task_phase:
            ctx.notes.append(note + " No one-shot phase on the task (task_phase=false).")
            return supernet.eval(), projection
        ctx.notes.append(note + f" Trained one-shot on the task for {opts.supernet_steps} steps from it (not rewired: "
                         "its units were trained in their order).")
        return _one_shot_on_task(ctx, opts, supernet, projection, {"pretrained": str(opts.supernet)})
    if opts.supernet:
        supernet, projection = load_supernet(opts.supernet), load_projection(opts.supernet)
        check_task_supernet(opts.supernet, supernet, projection, ctx.task_data.task.kind_object, ctx.teacher,
                            opts.strategy)
        ctx.notes.append(f"Super-net: loaded from {opts.supernet} (no one-shot phase in this run).")
        return supernet.eval(), projection

    supernet = SuperNet.from_teacher(ctx.teacher, opts.strategy)
    if opts.rewire:
        from distillery.importance import unit_importance

        n, rows = opts.rewire_examples, training_rows(ctx, opts)
        logger.info("Importance of the FFN neurons and heads on %s training examples (rewiring).", min(n or len(rows), len(rows)))
        neurons, heads = unit_importance(ctx.teacher, rows, ctx.task_data.collate, ctx.task_data.task.kind_object,
                                         batch_size=ctx.config.student.batch_size, max_examples=n, seed=ctx.config.student.seed)
        supernet.rewire(neurons, heads)
        ctx.notes.append(f"Super-net rewired: FFN neurons and heads of every layer ordered by importance on "
                         f"{min(n or len(rows), len(rows))} train examples.")
    projection = make_projection(supernet, ctx.teacher.config.hidden_size)
    return _one_shot_on_task(ctx, opts, supernet, projection, {"rewired": bool(opts.rewire)})


def _one_shot_on_task(ctx: MethodContext, opts, supernet, projection, facts: dict) -> tuple:
    """The one-shot phase on the task's train split from ``supernet``; the result saved to ``supernet/``."""
    from dataclasses import replace

    facts = {**facts, "sandwich": bool(opts.sandwich), "inplace_kd": bool(opts.inplace_kd)}
    cfg = replace(ctx.config.student, max_steps=int(opts.supernet_steps), lr=float(opts.supernet_lr),
                  eval_every=None, select_best=False, patience=None, warmup_ratio=0.1)
    # With new rows (augmented, unlabeled) the task phase learns from the further training's text: one
    # augmentation and one labelling pass, cached, serve both (the phase is bounded in steps, not passes).
    extra = ctx.task_data.task.kind_object.takes_new_rows and (opts.augment or ctx.config.data.unlabeled_file)
    train = ctx.distillation_train(opts.train_examples == "all", opts.augment or 0) if extra else ctx.task_data.train
    trainer = Trainer(supernet, cfg, train, ctx.task_data.collate,
                      one_shot_loss(ctx.teacher, projection, int(opts.samples), cfg.seed,
                                    sandwich_rule=bool(opts.sandwich), inplace=bool(opts.inplace_kd),
                                    prediction_weight=float(opts.prediction_weight), temperature=opts.kd_temperature()),
                      out_dir=ctx.out_dir / "supernet", resume=ctx.resume, extra_parameters=[projection],
                      desc="supernet", checkpoint_every=100)
    ctx.teacher.to(trainer.device)
    supernet = trainer.train().model.eval().cpu()
    if distributed.is_main():
        save_supernet(supernet, projection.cpu(), ctx.out_dir / "supernet", ctx.task_data.tokenizer,
                      {"task": ctx.task_data.task.name, "kind": ctx.task_data.task.kind, "steps": int(opts.supernet_steps),
                       "samples": int(opts.samples), **facts})
    return supernet, projection.cpu()


def held_out_split(n: int, held: int, fit: int, seed: int) -> tuple[list[int], list[int]]:
    """A seeded split of ``n`` train examples for scoring candidates: up to ``fit`` to fit on, and
    ``held`` others to score on (the same ``held`` for every evaluator and seed)."""
    order = random.Random(seed).sample(range(n), n)
    return order[held: held + fit], order[:held]


def proxy_evaluator(supernet, teacher, projection, task_data, examples: int, seed: int,
                    prediction_weight: float = 1.0, temperature: float = 1.0, terms: bool = False):
    """−(the one-shot objective: hidden + attention + w · prediction KD) of a sub-network on a fixed
    held-out slice of the train split; with ``terms`` the three losses each, as :class:`KDTerms` of floats."""
    from torch.utils.data import DataLoader

    _, idx = held_out_split(len(task_data.train), examples, 0, seed)  # the probe's, when it holds as many
    loader = DataLoader(task_data.train.select(idx), batch_size=64, collate_fn=task_data.collate)
    teacher = teacher.cpu()
    batches = [(b, teacher_targets(teacher, b)) for b in loader]

    @torch.no_grad()
    def evaluate(arch: Arch):
        sums = {"hidden": 0.0, "attention": 0.0, "prediction": 0.0}
        for b, targets in batches:
            for name, value in kd_loss(supernet, projection, arch, b, targets, temperature)._asdict().items():
                sums[name] += float(value) * b["input_ids"].shape[0] / len(idx)
        found = KDTerms(**sums)
        return found if terms else -found.total(prediction_weight=prediction_weight)

    return evaluate


def probe_positions(task_data) -> Callable | None:
    """Where the probe reads a batch's last hidden states, given its labels: (rows, positions, their labels), the
    first token of each row with the row's label (a head on the pooled state), or each tagged token with its tag
    (tags on words); None for a kind with neither (QA's spans)."""
    kind = task_data.task.kind_object
    if kind.pooled_output:
        return lambda labels: (torch.arange(len(labels)), torch.zeros(len(labels), dtype=torch.long), labels)
    if kind.word_labels:
        def words(labels):
            rows, cols = (labels != IGNORED).nonzero(as_tuple=True)
            return rows, cols, labels[rows, cols]
        return words
    return None


def probe_evaluator(supernet, task_data, fit_examples: int, held_examples: int, seed: int, C: float = 0.1):
    """How much of the task a sub-network's representation still carries, as inherited from the
    super-net: a linear probe (L2-regularised logistic regression on the standardised [CLS] state, or on each
    tagged word's first sub-word state for a tagger; ridge regression for a regression task) fitted on
    ``fit_examples`` train examples and scored on ``held_examples`` others by the gold label's mean
    log-likelihood (classification, tags) or −MSE (regression). A probe refits the head, so a sub-network whose
    sliced pooler and head were barely trained one-shot is still judged by what its encoder knows; on SST-2 it
    ranked 8 sub-networks by their trained dev accuracy far better than the KD loss
    (benchmarks/results/autotinybert-ranking.json)."""
    import numpy as np
    from sklearn.linear_model import LogisticRegression, Ridge
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler
    from torch.utils.data import DataLoader

    positions = probe_positions(task_data)
    if positions is None:
        raise DistilleryError("The probe evaluator scores tasks with a label a row or a tag a word; use evaluator=proxy "
                              "for QA.")
    n = len(task_data.train)
    held = min(held_examples, n // 4)
    fit_idx, held_idx = held_out_split(n, held, fit_examples, seed)
    idx = fit_idx + held_idx
    loader = DataLoader(task_data.train.select(idx), batch_size=128, collate_fn=task_data.collate)
    batches = list(loader)
    picked = [positions(b["labels"]) for b in batches]
    labels = torch.cat([y for _, _, y in picked]).numpy()
    starts = np.cumsum([0] + [len(b["labels"]) for b in batches])  # each batch's first row in ``idx``
    fitted = torch.cat([rows + int(s) for (rows, _, _), s in zip(picked, starts)]).numpy() < len(idx) - held
    if task_data.task.class_names and len(set(labels[fitted].tolist())) < 2:
        raise DistilleryError(f"The probe evaluator's {len(idx) - held} fit examples hold one class only: raise "
                              f"probe_examples (the train split has {n} examples) or use evaluator=proxy.")

    @torch.no_grad()
    def evaluate(arch: Arch) -> float:
        supernet.eval()
        feats = np.concatenate([supernet.encode(b["input_ids"], b["attention_mask"], b.get("token_type_ids"), arch)[0]
                                [rows, cols].float().numpy() for b, (rows, cols, _) in zip(batches, picked)])
        x_fit, y_fit, x_held, y_held = feats[fitted], labels[fitted], feats[~fitted], labels[~fitted]
        if not task_data.task.class_names:  # a score
            probe = make_pipeline(StandardScaler(), Ridge(alpha=1.0 / C)).fit(x_fit, y_fit)
            return -float(((probe.predict(x_held) - y_held) ** 2).mean())
        probe = make_pipeline(StandardScaler(), LogisticRegression(C=C, max_iter=500)).fit(x_fit, y_fit)
        proba = probe.predict_proba(x_held)
        # a held label the fit rows never had (a rare tag) gets the floor's likelihood
        column = np.searchsorted(probe.classes_, y_held).clip(max=len(probe.classes_) - 1)
        seen = probe.classes_[column] == y_held
        return float(np.log(np.where(seen, proba[np.arange(len(y_held)), column], 0.0) + 1e-9).mean())

    return evaluate


def check_finetune_evaluator(task) -> None:
    """Refuse the finetune evaluator for ``task`` where it cannot score: its loss reads the teacher's cached logits,
    and it scores held-out train rows as they are encoded, where a sentence kind's labels are (a tagger's words and
    QA's answers are scored against raw dev examples)."""
    kind = task.kind_object
    if not (kind.caches_teacher_outputs and kind.pooled_output):
        raise DistilleryError(f"The finetune evaluator scores classification and regression tasks, not "
                              f"{task.kind.replace('_', ' ')} (task {task.name}); use evaluator=probe (the default) "
                              f"or proxy.")


def finetune_evaluator(supernet, ctx: MethodContext, opts, seed: int):
    """The main metric of a candidate after a short fine-tune: extracted, trained ``finetune_steps`` steps
    by the one trainer on a fixed slice of the train split (the further-training loss: CE + KD from the
    teacher's cached logits), scored on ``proxy_examples`` other train examples. The dev split stays
    unseen by the search (the paper's own code picks on dev: a leak)."""
    import dataclasses
    import tempfile

    task = ctx.task_data.task
    check_finetune_evaluator(task)
    train = ctx.train_with_teacher_logits()
    fit_idx, held_idx = held_out_split(len(train), int(opts.proxy_examples), int(opts.finetune_examples), seed)
    fit = train.select(fit_idx)
    held_out = dataclasses.replace(ctx.task_data, dev=train.select(held_idx), dev_examples=None)
    cfg = dataclasses.replace(ctx.config.student, max_steps=int(opts.finetune_steps), epochs=1.0, eval_every=None,
                              select_best=False, patience=None)
    loss = distillation_loss(task.kind_object, ctx.teacher, opts.kd_share(), opts.kd_temperature())

    def evaluate(arch: Arch) -> float:
        model = supernet.extract(arch).train()
        with tempfile.TemporaryDirectory() as tmp:
            model = Trainer(model, cfg, fit, ctx.task_data.collate, loss, out_dir=tmp, desc=f"finetune {arch}").train().model
        return float(score(model, held_out)[task.main_metric])

    return evaluate


def candidate_evaluator(ctx: MethodContext, opts, supernet, projection, seed: int):
    """The search's score of a candidate (higher is better) per ``evaluator``, and its plot label."""
    evaluator = opts.evaluator
    if not ctx.task_data.task.kind_object.finetunes_teacher:  # an embedder: no label to probe, its objective instead
        rows = training_rows(ctx, opts)
        _, idx = held_out_split(len(rows), int(opts.proxy_examples), 0, seed)
        return (embedding_evaluator(supernet, projection, rows.select(idx), ctx.task_data.collate),
                "−(1 − cos + MSE) to the teacher's sentence vectors, held-out texts")
    if evaluator == "probe" and probe_positions(ctx.task_data) is None:
        evaluator = "proxy"
        ctx.notes.append("Search: the probe evaluator needs a label a row or a tag a word; QA candidates are scored "
                         "by the KD proxy.")
    if evaluator == "finetune":
        return (finetune_evaluator(supernet, ctx, opts, seed),
                f"{ctx.task_data.task.main_metric} after {opts.finetune_steps} fine-tune steps (held-out train)")
    if evaluator == "probe":
        return (probe_evaluator(supernet, ctx.task_data, int(opts.probe_examples), int(opts.proxy_examples), seed),
                "linear probe, held-out train " + ("(log-likelihood)" if ctx.task_data.task.class_names else "(−MSE)"))
    return (proxy_evaluator(supernet, ctx.teacher, projection, ctx.task_data, int(opts.proxy_examples), seed,
                            float(opts.prediction_weight), opts.kd_temperature()), "proxy score (−KD loss)")


def search_space(space: SearchSpace, opts, predict=None, budget_ms: float | None = None) -> SearchSpace:
    """The space the search explores: the super-net's own with ``search_hidden``, else its sub-space at
    the teacher's hidden size (see the option) — unless none of that is predicted under ``budget_ms``."""
    if opts.search_hidden:
        return space
    narrowed = space.at_full_width()
    if predict is not None and predict(narrowed.smallest()) > budget_ms:
        return space
    return narrowed


def write_search_plot(candidates, budget_ms: float, chosen: Arch, path, ylabel: str = "proxy score (−KD loss)") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    candidates = [c for c in candidates if c.score > -1e8]  # Optuna's over-budget trials were not evaluated
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.scatter([c.latency_ms for c in candidates], [c.score for c in candidates], c=[c.generation for c in candidates],
               cmap="viridis", s=18, label="candidates (colour: generation)")
    best = next(c for c in candidates if c.arch == chosen and c.latency_ms <= budget_ms)
    ax.scatter([best.latency_ms], [best.score], marker="*", s=160, color="red", label=f"chosen: {chosen}")
    ax.axvline(budget_ms, color="gray", linestyle="--", linewidth=0.8, label="budget")
    ax.set_xlabel("predicted latency at 1×128 (ms)")
    ax.set_ylabel(ylabel)
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    record(path)


def choose_architecture(ctx: MethodContext, opts, supernet, projection) -> tuple[Arch, float]:
    """The architecture to ship, and the budget's speed-up (teacher latency measured here ÷ budget)."""
    # the budget hangs on this one figure: three times the runs of an architecture's timing
    teacher = ctx.teacher.cpu().eval()
    teacher_ms = latency_ms({"teacher": teacher}, runs=3 * int(opts.latency_runs))["teacher"]
    budget = float(opts.budget_ms) if opts.budget_ms is not None else teacher_ms / float(opts.speedup)
    if isinstance(opts.arch, str) and opts.arch not in ("fast", "conventional"):
        arch = parse_arch(opts.arch)
        supernet.check(arch)
        ctx.notes.append(f"Architecture given: {arch}.")
        return arch, teacher_ms / budget
    predict = _fit_latency_predictor(ctx, opts, supernet, teacher, teacher_ms, budget)
    if opts.arch == "conventional":
        candidates = conventional(supernet.space, predict, budget)
    elif opts.arch == "fast":
        candidates = _fast_candidates(ctx, opts, supernet, projection, predict, budget)
    else:
        candidates = _searched_candidates(ctx, opts, supernet, projection, predict, budget)
    searched = opts.arch not in ("conventional", "fast")
    arch = _measured_choice(ctx, opts, supernet, projection, candidates, predict, teacher, teacher_ms, budget, searched)
    return arch, teacher_ms / budget


def _fit_latency_predictor(ctx: MethodContext, opts, supernet, teacher, teacher_ms: float,
                          budget: float) -> Callable[[Arch], float]:
    """Time sampled sub-networks beside the teacher, fit the latency predictor on them and save it
    (``latency.json``); return it as arch -> predicted ms."""
    space, seed = supernet.space, ctx.config.student.seed
    archs = space.sample_distinct(int(opts.latency_archs), random.Random(seed))
    logger.info("Timing %d sampled architectures as standalone models at 1×128 (teacher: %.2f ms; budget %.2f ms).",
                len(archs), teacher_ms, budget)
    ms = measure(supernet, archs, runs=int(opts.latency_runs), reference=teacher,
                 reference_ms=teacher_ms)  # in teacher-time units
    predictor, report = fit_predictor(space, archs, ms, seed=seed)
    save_predictor(ctx.out_dir / "latency.json", predictor, {**report, "teacher_ms": teacher_ms, "budget_ms": budget},
                   archs, ms, (1, 128), None)
    ctx.notes.append(f"Latency predictor: {len(archs)} architectures timed here; held-out MAPE {report['mape_mlp']:.1f} % "
                     f"(FLOP-count baseline {report['mape_flops']:.1f} %). Budget {budget:.2f} ms = teacher {teacher_ms:.2f} ms"
                     + (f" / {float(opts.speedup):g}." if opts.budget_ms is None else "."))
    return lambda a: float(predictor.predict([a])[0])


def _fast_candidates(ctx: MethodContext, opts, supernet, projection, predict, budget: float) -> list[Arch]:
    """AutoTinyBERT-Fast: the architectures its rule gives under the budget, the best evaluated first."""
    evaluate, _ = candidate_evaluator(ctx, opts, supernet, projection, ctx.config.student.seed)
    fast = fast_rule(supernet.space, predict, budget)
    if not fast:
        raise DistilleryError(f"No AutoTinyBERT-Fast architecture is predicted under {budget:.2f} ms.")
    return sorted(fast, key=evaluate, reverse=True)


def _searched_candidates(ctx: MethodContext, opts, supernet, projection, predict, budget: float) -> list[Arch]:
    """The search's best architectures, then the other evaluated ones under the budget (fastest first);
    writes ``search.json`` and ``search.png``."""
    space, seed = supernet.space, ctx.config.student.seed
    evaluate, ylabel = candidate_evaluator(ctx, opts, supernet, projection, seed)
    searched = search_space(space, opts, predict, budget)
    if searched == space and not opts.search_hidden:
        ctx.notes.append(f"Search: no architecture at the teacher's hidden size is predicted under {budget:.2f} ms; "
                         f"d_m is searched too.")
    result = _run_search(ctx, opts, space, searched, evaluate, predict, budget)
    candidates = [c.arch for c in result.best]
    # if the best all miss the budget when measured (the floor keeps them near it, and sub-millisecond
    # timings are noisy), the other evaluated ones, the fastest predicted first (score −1e9: a trial
    # Optuna did not evaluate)
    best = set(candidates)
    candidates += [c.arch for c in sorted(result.evaluated, key=lambda c: c.latency_ms)
                   if c.arch not in best and c.latency_ms <= budget and c.score > -1e8]
    write_search_plot(result.evaluated, budget, candidates[0], ctx.out_dir / "search.png", ylabel)
    ctx.notes.append(f"Search: {len(result.evaluated)} candidates over {opts.generations} generations "
                     f"(search.json, search.png).")
    return candidates


def _run_search(ctx: MethodContext, opts, space: SearchSpace, searched: SearchSpace, evaluate, predict,
                budget: float):
    """The search over ``searched`` (within the super-net's ``space``) with the chosen backend (Optuna or the paper's evolutionary search),
    its log written to ``search.json``; returns the search's result (best and evaluated candidates)."""
    seed, floor = ctx.config.student.seed, float(opts.budget_floor) * budget
    if opts.search_backend == "optuna":
        from distillery.autotinybert.search import optuna_search, write_log

        result = optuna_search(searched, evaluate, predict, budget, trials=int(opts.generations) * int(opts.population),
                               population=int(opts.population), seed=seed, journal=ctx.out_dir / "search.journal",
                               floor_ms=floor)
        record(ctx.out_dir / "search.journal")
        write_log(ctx.out_dir / "search.json", result.evaluated, budget)
        return result
    full = space.full()  # the distill baseline's shape: every other layer, full width
    baseline = Arch(len(select_layers(full.layers, None)), full.hidden, full.ffn, full.heads, full.qkv)
    return evolutionary_search(searched, evaluate, predict, budget, generations=int(opts.generations),
                               population=int(opts.population), p_mutation=float(opts.p_mutation),
                               p_exploration=float(opts.p_exploration), seed=seed,
                               log_path=ctx.out_dir / "search.json", floor_ms=floor, seeds=[baseline])


def _measured_choice(ctx: MethodContext, opts, supernet, projection, candidates: list[Arch], predict, teacher,
                     teacher_ms: float, budget: float, searched: bool) -> Arch:
    """The candidate to ship, checked by measurement (:func:`_first_within_budget`). When every searched
    candidate that met the budget ran faster than ``budget_floor`` of it, the predictor overestimates these
    sizes on this machine now (small models, few timed runs each): rescaled by what the check measured, the
    search runs once more, and what it finds is checked the same way."""
    ratios: list[float] = []
    arch = _first_within_budget(ctx, opts, supernet, candidates, predict, teacher, teacher_ms, budget, ratios,
                                settle=not searched)
    if arch is not None:
        return arch
    scale = statistics.median(ratios)
    ctx.notes.append(f"The candidates ran {100 * (1 - scale):.0f} % faster than predicted: the latency predictor "
                     f"is rescaled by {scale:.2f} and the search runs again.")
    corrected = lambda a: scale * predict(a)  # noqa: E731
    retried = _searched_candidates(ctx, opts, supernet, projection, corrected, budget)
    return _first_within_budget(ctx, opts, supernet, retried + [a for a in candidates if a not in retried], corrected,
                                teacher, teacher_ms, budget)


# Candidates measured in the window are looked for among the first few (each timing costs seconds at base size);
# past them the remaining ones are tried for the budget alone, the fastest predicted first.
WINDOW_CANDIDATES = 8


def _first_within_budget(ctx: MethodContext, opts, supernet, candidates: list[Arch], predict, teacher,
                        teacher_ms: float, budget: float, ratios: list[float] | None = None,
                        settle: bool = True) -> Arch | None:
    """The first candidate whose measured latency lies between ``budget_floor`` of the budget and the budget
    (5 % tolerance above), written to ``architecture.json``: what ships must meet the budget as measured, not
    only as predicted, and not leave much of it unused (0.93: a speed-up within 10 % of the one asked).
    Failing that, the first that meets the budget, with a note saying how far under it is; or None when not
    ``settle``. ``ratios`` receives measured ÷ predicted of each candidate measured."""
    floor = float(opts.budget_floor) * budget
    under = None  # (arch, measured) of the first candidate that meets the budget but lies under the floor
    for k, arch in enumerate(candidates):
        if under is not None and k >= WINDOW_CANDIDATES:
            break
        # timed beside the teacher like the predictor's architectures (see ``measure``), with more runs
        measured = measure(supernet, [arch], runs=3 * int(opts.latency_runs), progress=False, reference=teacher,
                           reference_ms=teacher_ms)[0]
        if ratios is not None:
            ratios.append(measured / predict(arch))
        if measured > 1.05 * budget:
            logger.info("%s measured %.2f ms (in teacher time), over the budget by more than 5 %%: next candidate.",
                        arch, measured)
        elif measured >= floor:
            return _chosen(ctx, opts, arch, predict(arch), measured, budget, teacher_ms)
        else:
            logger.info("%s measured %.2f ms, under %.2f of the budget: a candidate nearer the budget is looked for.",
                        arch, measured, float(opts.budget_floor))
            under = under or (arch, measured)
    if under is not None:
        if not settle:
            return None
        arch, measured = under
        ctx.notes.append(f"No candidate measured between {float(opts.budget_floor):g} of the budget and the budget; "
                         f"the chosen one is {100 * (1 - measured / budget):.0f} % under it (a speed-up "
                         f"{teacher_ms / measured:.2f}× for the {teacher_ms / budget:.2f}× asked).")
        return _chosen(ctx, opts, arch, predict(arch), measured, budget, teacher_ms)
    raise DistilleryError(f"None of the {len(candidates)} candidates met the {budget:.2f} ms budget when measured "
                          f"(the latency predictor is off on this machine now: re-run, or lower budget_floor).")


def _chosen(ctx: MethodContext, opts, arch: Arch, predicted: float, measured: float, budget: float,
            teacher_ms: float) -> Arch:
    ctx.notes.append(f"Architecture: {arch}; predicted {predicted:.2f} ms, measured {measured:.2f} ms "
                     f"(budget {budget:.2f} ms).")
    write_file(ctx.out_dir / "architecture.json", json.dumps(
        {**arch.as_dict(), "predicted_ms": predicted, "measured_ms": measured, "budget_ms": budget,
         "teacher_ms": teacher_ms, "choice": opts.arch or "search"}, indent=2))
    return arch


class AutoTinyBert(Method):
    name: ClassVar[str] = "autotinybert"

    def check(self, config, teacher_config) -> None:
        opts = self.options(config)
        check_family(teacher_config)  # every family of distillery.encoders, or a sentence saying what the student lacks
        if isinstance(opts.arch, str) and opts.arch not in ("fast", "conventional"):
            parse_arch(opts.arch)
        if opts.supernet and not config.teacher.finetuned:
            from distillery.autotinybert.pretrain import check_teacher, is_pretrained

            if is_pretrained(opts.supernet):  # before the teacher's fine-tuning
                check_teacher(opts.supernet, config.teacher.name)
        if opts.evaluator == "finetune" and distributed.launched():
            # the search runs on the main process alone, and a fine-tune there would wait for the others
            raise DistilleryError("evaluator=finetune trains each candidate on one process: run the search without a "
                                  "launcher of several processes, or use evaluator=probe (the default) or proxy.")

    def check_kind(self, task, config) -> None:
        super().check_kind(task, config)
        if self.options(config).evaluator == "finetune":  # before the one-shot phase, not at the search
            check_finetune_evaluator(task)

    def run(self, ctx: MethodContext) -> PreTrainedModel:
        opts = self.options(ctx.config)
        ctx.teacher.eval()
        supernet, projection = train_supernet_on_task(ctx, opts)
        chosen = chosen_before(ctx) if ctx.resume else None
        # timings on cores the processes share would disagree: the main process times, searches and
        # writes the search's files; every process then trains the architecture it chose
        arch, speedup = chosen or distributed.on_main(choose_architecture, ctx, opts, supernet, projection)
        student = supernet.extract(arch)
        if not opts.further_training:
            ctx.notes.append("No further training: the chosen sub-network as extracted from the super-net "
                             "(`distillery autotinybert train --arch ...` trains it).")
            return student.eval()
        kind = ctx.task_data.task.kind_object
        train = ctx.task_data.train
        augment, augment_reason = further_augment(ctx, opts, arch.layers)
        if kind.caches_teacher_outputs:
            train = ctx.distillation_train(opts.train_examples == "all", augment)
        chosen, notes = further_defaults(ctx, opts, student, train, speedup, augment_reason if augment else None)
        kd_weight, t = chosen.kd_weight, chosen.temperature
        lr = chosen.settings.get("lr", ctx.config.student.lr)
        loss, extra = further_training_loss(kind, ctx.teacher, student, projection, kd_weight, t, chosen.hidden_weight,
                                            chosen.hidden_layers, chosen.attention_weight)
        words = kind.loss_words(kd_weight, t) + chosen.layer_terms("sub-network")
        words += " (through a projection onto the teacher's width, in the loss only)" if extra else ""
        ctx.notes.append(f"Further training: {words} from the extracted sub-network, learning rate {lr:.2g}.")
        ctx.notes.extend(notes)
        return ctx.train(student.train(), loss, desc="autotinybert", train_dataset=train, extra_parameters=extra,
                         **{"lr": lr, **chosen.settings})


def chosen_before(ctx: MethodContext) -> tuple[Arch, float] | None:
    """The architecture (and budget speed-up) a run killed after its choice had written to
    architecture.json: its resume continues that one, as timings taken now could choose another."""
    path = ctx.out_dir / "architecture.json"
    if not path.is_file():
        return None
    try:
        saved = json.loads(path.read_text())
        arch = Arch(*(int(saved[k]) for k in ("layers", "hidden", "ffn", "heads", "qkv")))
        speedup = float(saved["teacher_ms"]) / float(saved["budget_ms"])
    except (OSError, ValueError, KeyError, TypeError, ZeroDivisionError):
        raise DistilleryError(f"{path} is damaged (it should hold the architecture this run chose); start the run "
                              f"again with --overwrite.") from None
    ctx.notes.append(f"Architecture chosen before the resume: {arch}.")
    return arch, speedup

