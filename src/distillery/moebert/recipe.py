"""Method ``moebert``: importance → conversion → layer-wise distillation (MoEBERT §3).

setup:  importance of every FFN neuron on the task's train split (Eq. 4), then the fine-tuned
        teacher's FFNs cut into experts (§3.1), routed by hash or a sentence gate; with ``refit``
        (ours, on by default where the head reads one pooled state: off for QA and token classification) the
        experts' output weights are then refitted by least squares to reproduce the dense FFN on the same train
        sample (:mod:`distillery.moebert.refit`).
train:  L = CE(f(x), y) + λ·(L_trm + L_pred) (§3.2–3.3) with the one trainer, the teacher being the
        dense model the student was converted from:
        L_trm = Σ_l MSE(X_l, X_l_teacher) over the distilled layers (l = 0 is the embedding output),
        L_pred = ½(KL(p‖p_t) + KL(p_t‖p)); regression: MSE of the predictions; QA: the mean over
        start and end; token classification: over each word's first sub-word (the batch's word_mask).
        ``distill_layers``: all (Eq. 5), last, skip (every other: 0, 2, 4, …), none (no distillation at
        all: Table 3's "−distill").
save:   the run folder as every method; plus importance.safetensors and the per-expert load on dev
        (expert_load.json, expert_load.png).

Options (``RunConfig.method_options``): see MoEBertOptions. ``init`` is a folder with an already converted
MoEBERT model (``distillery moebert convert``): training starts from it instead of converting.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import ClassVar

import torch
from safetensors.torch import load_file, save
from transformers import PreTrainedModel

from distillery.config import cache_root, resolve_data_dir, run_inputs
from distillery.data.encode import model_inputs, prepare_task_data
from distillery.data.files import regular_file
from distillery.data.loading import task_for
from distillery.encoders import ffn_width
from distillery.errors import DistilleryError
from distillery.folders import check_file_target, check_target, record, write_file
from distillery.importance import ffn_importance, sample_loader
from distillery.kinds import TaskKind, kind_of
from distillery.method import Method
from distillery.method_context import MethodContext
from distillery.modeling import load_pretrained, save_model
from distillery.moebert.convert import convert, count_tokens, teacher_layout
from distillery.moebert.modeling_moebert import MoEBertPreTrainedModel, resolve_expert_shape
from distillery.moebert.options import MoEBertOptions
from distillery.moebert.refit import refit_outputs
from distillery.teacher import get_finetuned_teacher, resolve_teacher, teacher_tokenizer
from distillery.training.losses import hidden_mse, prediction_distillation, task_loss
import distillery.encoders as encoders
import distillery.distributed as distributed

logger = logging.getLogger("distillery")

def expert_shape(opts: MoEBertOptions, d_h: int) -> tuple[int, int, int]:
    """(N, d_e, s) from the options and the teacher's FFN size (:func:`resolve_expert_shape`); a sentence if impossible."""
    return resolve_expert_shape(d_h, opts.experts, opts.expert_size, opts.shared)


def teacher_width(teacher_config) -> int:
    """d_h of the teacher's FFN, read through its family's layout; a sentence where MoEBERT cannot cut it."""
    return ffn_width(teacher_layout(teacher_config), teacher_config)


def distilled_layers(which: str, num_layers: int) -> list[int]:
    """Indices into hidden_states (0 = embedding output, l = output of layer l)."""
    return {"all": list(range(num_layers + 1)), "last": [num_layers],
            "skip": list(range(0, num_layers + 1, 2)), "none": []}[which]


def layerwise_distillation_loss(kind: TaskKind | str, teacher: PreTrainedModel, lam: float, layers: list[int] | None,
                                balance_weight: float = 0.0):
    """loss_fn for the trainer: CE + λ·(L_trm + L_pred) (+ the gate's load-balancing loss).

    ``layers`` None: no distillation (CE only); [] : prediction distillation only.
    """
    distill = layers is not None and lam > 0

    def loss_fn(model, batch):
        hidden = distill and bool(layers)
        out = model(**model_inputs(batch, model), output_hidden_states=hidden)
        ce = task_loss(kind, out, batch)
        loss, logs = ce, {"ce": float(ce.detach())}
        if distill:
            with torch.no_grad():
                t_out = teacher(**model_inputs(batch, teacher), output_hidden_states=hidden)
            pred = prediction_distillation(kind, out, t_out, loss="symmetric_kl", batch=batch)
            trm = sum((hidden_mse(out.hidden_states[i], t_out.hidden_states[i], attention_mask=batch.get("attention_mask"))
                       for i in layers), torch.zeros((), device=ce.device))
            loss = loss + lam * (trm + pred)
            logs.update(pred=float(pred.detach()), trm=float(trm.detach()))
        balance = getattr(out, "balance_loss", None)
        if balance is not None and balance_weight > 0:
            loss = loss + balance_weight * balance
            logs["balance"] = float(balance.detach())
        return loss, logs

    return loss_fn


def conversion_rows(task_data, train=None):
    """The rows the conversion reads (importance, refit, hash-b's token counts): the train split, or where the task's
    own split is empty (an embedder, which learns from the texts given only) the student's training rows ``train``."""
    return train if train is not None and not len(task_data.train) else task_data.train


def student_rows(ctx: MethodContext, opts: MoEBertOptions):
    """The student's training rows where the teacher's outputs must be computed first (new rows, which the teacher
    labels; an embedder's texts, whose vectors are its targets), else None: the loss runs the teacher on every
    batch, so the train split serves as it is."""
    if not ctx.task_data.task.kind_object.takes_new_rows:
        return None
    return ctx.distillation_train(opts.train_examples == "all", opts.augment, logits=False)


def compute_importance(teacher: PreTrainedModel, task_data, config, opts: MoEBertOptions, rows=None) -> torch.Tensor:
    """Eq. 4 scores of the teacher's FFN neurons on the train split (or its seeded sample; ``rows``: those rows)."""
    n, rows = opts.importance_examples, task_data.train if rows is None else rows
    logger.info("Importance of the FFN neurons on %s training examples.", min(n or len(rows), len(rows)))
    return ffn_importance(teacher, rows, task_data.collate, task_data.task.kind_object,
                          batch_size=config.student.batch_size, max_examples=n, seed=config.student.seed)


def save_importance(scores: torch.Tensor, path: str | Path, config, task_data, opts: MoEBertOptions, rows=None) -> Path:
    """A safetensors file (``importance``: (layers, d_h)) with the settings in its metadata."""
    n, rows = opts.importance_examples, task_data.train if rows is None else rows
    return write_file(path, save({"importance": scores.contiguous()}, metadata={
        "teacher": config.teacher.name, "task": task_data.task.name,
        "split": "train" if rows is task_data.train else "the student's training rows",
        "examples": str(min(n or len(rows), len(rows)))}))


def load_importance(path: str | Path, teacher_config) -> torch.Tensor:
    """The scores ``distillery moebert importance`` wrote to ``path``: one per FFN neuron of each of the
    teacher's layers, finite; anything else is a sentence naming the file and what it holds instead."""
    from safetensors import SafetensorError

    path = regular_file(path, "Importance file")
    written_by = "give a file written by `distillery moebert importance` for this teacher"
    try:
        tensors = load_file(str(path))
    except (OSError, SafetensorError) as e:  # unreadable, not a safetensors file
        raise DistilleryError(f"{path} is not a readable safetensors file ({e}); {written_by}.") from None
    if "importance" not in tensors:
        held = ", ".join(sorted(tensors)[:5]) or "no tensor"
        raise DistilleryError(f"{path} holds no 'importance' tensor (it holds {held}); {written_by}.")
    scores = tensors["importance"]
    expected = (teacher_config.num_hidden_layers, teacher_width(teacher_config))
    if tuple(scores.shape) != expected:
        raise DistilleryError(f"{path} holds importance scores of shape {tuple(scores.shape)}, but the teacher has "
                              f"{expected[0]} layers of {expected[1]} FFN neurons; {written_by}.")
    if not scores.is_floating_point() or not bool(torch.isfinite(scores).all()):
        raise DistilleryError(f"{path} holds importance scores that are not finite numbers; {written_by}.")
    return scores


def wants_refit(opts: MoEBertOptions, kind: TaskKind | str) -> bool:
    """Whether to refit: as set, else on for a kind whose head reads one pooled state (measured: it helped on
    SST-2, 7 seeds, and lost 5.7 F1 on SQuAD's per-token span head, one seed)."""
    return bool(opts.refit) if opts.refit is not None else kind_of(kind).pooled_output


def convert_teacher(teacher: PreTrainedModel, task_data, config, opts: MoEBertOptions,
                    importance: torch.Tensor | None, rows=None) -> tuple[PreTrainedModel, str | None]:
    """The teacher converted by the options (importance None: the random split needs none), and a
    line on the output refit when there was one (``rows``: the rows read, :func:`conversion_rows`)."""
    rows = task_data.train if rows is None else rows
    n, d_e, s = expert_shape(opts, teacher_width(teacher.config))
    counts = count_tokens(rows["input_ids"], teacher.config.vocab_size) if opts.routing == "hash-b" else None
    student = convert(teacher, importance, num_experts=n, expert_size=d_e, shared_size=s, split=opts.split,
                      shared_mode=opts.shared_mode, routing=opts.routing, gate_scale=opts.gate_scale,
                      token_counts=counts, seed=config.student.seed)
    if wants_refit(opts, task_data.task.kind_object):
        loader = sample_loader(rows, task_data.collate, config.student.eval_batch_size,
                               opts.importance_examples, config.student.seed)
        errors = refit_outputs(student, teacher, loader)
        line = (f"Output weights refitted by least squares on {len(loader.dataset)} training examples: FFN output "
                f"MSE against the dense FFN per layer {' '.join(f'{b:.3g}' for b, _ in errors)} -> "
                f"{' '.join(f'{a:.3g}' for _, a in errors)}.")
        logger.info(line)
        return student, line
    return student, None


def build_student(ctx: MethodContext, opts: MoEBertOptions, rows=None) -> PreTrainedModel:
    """The converted model (or the --init one), before training, read from ``rows`` (the train split when None).
    The importance scores are kept in the run folder, so that a resumed run converts the same way without
    scoring again."""
    if opts.init is not None:
        student = load_pretrained(opts.init)
        if not isinstance(student, MoEBertPreTrainedModel):
            raise DistilleryError(f"--init {opts.init} holds a {type(student).__name__}, not a MoEBERT model.")
        ctx.notes.append(f"Student: the converted MoEBERT model in {opts.init}.")
        return student
    teacher, task_data, config = ctx.teacher, ctx.task_data, ctx.config
    importance = None
    if opts.split != "random":
        path = ctx.out_dir / "importance.safetensors"
        if ctx.resume and path.is_file():
            importance = load_importance(path, teacher.config)
        else:
            importance = compute_importance(teacher, task_data, config, opts, rows)
            if distributed.is_main():
                save_importance(importance, path, config, task_data, opts, rows)
    student, refit_line = convert_teacher(teacher, task_data, config, opts, importance, rows)
    d_h, c = teacher_width(teacher.config), student.config
    n, d_e, s = c.num_experts, c.expert_size, c.shared_size
    ctx.notes.append(f"Student: every FFN ({d_h} neurons) cut into {n} experts of {d_e} neurons, the top {s} "
                     f"shared ({opts.shared_mode}), split {opts.split}, routing {opts.routing}; "
                     f"{d_h - s - n * (d_e - s)} least important neurons per layer dropped.")
    if refit_line:
        ctx.notes.append(refit_line)
    return student


def expert_load(model: PreTrainedModel, task_data, batch_size: int) -> torch.Tensor:
    """(layers, experts): real dev tokens routed to each expert."""
    from torch.utils.data import DataLoader

    total = None
    model.eval()
    with torch.inference_mode():
        for batch in DataLoader(task_data.dev, batch_size=batch_size, collate_fn=task_data.collate):
            load = model(**model_inputs(batch, model), output_expert_load=True).expert_load.cpu()
            total = load if total is None else total + load
    return total


def write_expert_load(load: torch.Tensor, out_dir: Path) -> list[str]:
    """expert_load.json and a per-layer bar chart; returns report lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    share = load.double() / load.sum(1, keepdim=True).clamp_min(1)
    write_file(out_dir / "expert_load.json", json.dumps({"tokens": load.tolist(), "share": share.tolist()}, indent=2))
    layers, n = load.shape
    fig, ax = plt.subplots(figsize=(max(5, layers * 0.9), 3))
    width = 0.8 / n
    for e in range(n):
        ax.bar([l + e * width for l in range(layers)], share[:, e].tolist(), width, label=f"expert {e}")
    ax.axhline(1 / n, color="gray", linestyle="--", linewidth=0.8)
    ax.set_xticks([l + 0.4 - width / 2 for l in range(layers)], [f"layer {l}" for l in range(layers)])
    ax.set_ylabel("share of dev tokens")
    ax.legend(fontsize="small", ncol=n)
    fig.tight_layout()
    fig.savefig(out_dir / "expert_load.png", dpi=100)
    plt.close(fig)
    record(out_dir / "expert_load.png")
    busiest = float(share.max())
    return [f"Per-expert load on dev (share of real tokens, ideal {1 / n:.2f}): busiest expert {busiest:.2f}; "
            f"expert_load.png / expert_load.json."]


class MoEBert(Method):
    name: ClassVar[str] = "moebert"

    def check(self, config, teacher_config) -> None:
        opts = self.options(config)
        encoders.require(teacher_config, None, "method moebert")  # any family; teacher_width says where its FFN cannot be cut
        if opts.init is None:
            expert_shape(opts, teacher_width(teacher_config))
        elif not (Path(opts.init) / "config.json").is_file():
            raise DistilleryError(f"--init {opts.init} is not a saved model folder (no config.json).")

    def run(self, ctx: MethodContext) -> PreTrainedModel:
        opts = self.options(ctx.config)
        teacher, task_data, kind = ctx.teacher, ctx.task_data, ctx.task_data.task.kind_object
        teacher.eval()
        train = student_rows(ctx, opts)
        student = build_student(ctx, opts, conversion_rows(task_data, train))
        layers = None if opts.distill_layers == "none" else distilled_layers(opts.distill_layers, teacher.config.num_hidden_layers)
        lam = float(opts.lam)
        # an embedder's task loss is the distance to the teacher's vectors, and its prediction term the same distance
        pred = "symmetric KL of predictions" if kind.finetunes_teacher else "the same distance to the teacher run on the batch"
        task = "CE" if kind.finetunes_teacher else kind.loss_words(1.0, 1.0)
        ctx.notes.append(f"Loss: {task}" + (f" + {lam}·(Σ hidden MSE over layers {layers} + {pred})" if layers is not None and lam > 0 else " only (no distillation)")
                         + (f" + {opts.balance_weight}·load balance" if student.config.routing == "gate" else "") + ".")
        loss_fn = layerwise_distillation_loss(kind, teacher, lam, layers, float(opts.balance_weight))
        student = ctx.train(student, loss_fn, desc="moebert", train_dataset=train)
        if distributed.is_main():  # the dev pass and its chart are part of the report
            ctx.notes.extend(write_expert_load(expert_load(student, task_data, ctx.config.student.eval_batch_size), ctx.out_dir))
        return student


# ------------------------------------------------------------------------------------------------
# The steps on their own (`distillery moebert importance|convert`), for users who inspect or reuse
# the scores and the converted model between steps.


def _teacher_and_data(config, out: Path):
    """The fine-tuned teacher, its tokenizer, the task's data and the rows the conversion reads, as a compress run
    reads them (:func:`conversion_rows`): the train split, or where the task's own is empty (an embedder) the
    student's texts (``--unlabeled-file``, refused in a sentence when none is given) with the teacher's vectors,
    computed once and cached as the run's are. ``out``: where the step writes."""
    task = task_for(config.data)
    task.kind_object.check_data(task, config.data)
    task.kind_object.check_teacher(f"Teacher {config.teacher.name}", resolve_teacher(config.teacher.name))
    tokenizer = teacher_tokenizer(config.teacher.name)
    task_data = prepare_task_data(task, tokenizer, config.data)
    teacher, tokenizer, _ = get_finetuned_teacher(config.teacher, task, config.data, task_data)
    teacher.eval()
    rows = task_data.train
    if not len(rows):
        ctx = MethodContext(config, teacher, tokenizer, task_data, out_dir=Path(out).parent)
        rows = conversion_rows(task_data, student_rows(ctx, MoEBert().options(config)))
    return teacher, tokenizer, task_data, rows


def importance_step(config, out: str | Path, overwrite: bool = False) -> Path:
    """Fine-tuned teacher (cached) → Eq. 4 scores on the train split → a safetensors file (checked
    first: never the teacher's files, the data's or the teacher cache's, an existing one only with
    ``overwrite``)."""
    check_file_target(out, overwrite=overwrite, inputs=[*run_inputs(config), cache_root() / "teachers"])
    opts = MoEBert().options(config)
    teacher, _, task_data, rows = _teacher_and_data(config, Path(out))
    return save_importance(compute_importance(teacher, task_data, config, opts, rows), out, config, task_data, opts, rows)


def convert_step(config, importance_path: str | Path | None, out: str | Path, overwrite: bool = False) -> Path:
    """Fine-tuned teacher → MoEBERT model saved in ``out`` (with the tokenizer), not yet trained.
    Importance comes from ``importance_path``, or is computed when none is given."""
    out = Path(out)
    check_target(out, overwrite=overwrite, kind="model",
                 inputs=[config.teacher.name, resolve_data_dir(config.data.data_dir), importance_path])
    opts = MoEBert().options(config)
    teacher, tokenizer, task_data, rows = _teacher_and_data(config, out)
    expert_shape(opts, teacher_width(teacher.config))  # an impossible shape fails before any scoring
    importance = None
    if opts.split != "random":
        importance = (load_importance(importance_path, teacher.config) if importance_path is not None
                      else compute_importance(teacher, task_data, config, opts, rows))
    save_model(convert_teacher(teacher, task_data, config, opts, importance, rows)[0], tokenizer, out)
    return out
