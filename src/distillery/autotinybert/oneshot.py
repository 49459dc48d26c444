"""One-shot training of the super-network (AutoTinyBERT's Algorithm 1), knowledge-distillation setting.

Each optimizer step, every process takes its share of the batch (Accelerate splits it), takes M
sub-networks and accumulates their gradients; one update follows with the averaged gradients. The M
follow the sandwich rule (Yu & Huang's slimmable networks, as in BigNAS and DynaBERT): the largest,
the smallest and M − 2 random ones — the paper draws all M at random, which leaves the extremes of
the space rarely trained and the super-net's ranking of small against large sub-networks poor. With
``inplace`` the smaller ones learn from the largest one's (detached) outputs instead of the teacher's
(in-place distillation); the largest always learns from the teacher. The
objective is the paper's KD setting on unlabelled text: the last layer's hidden state of the
sub-network, through a shared projection (d_m → the teacher's width; its first d_m columns for a
narrower sub-network), against the teacher's (MSE), plus the MSE between the last layer's pre-softmax
attention scores (padding entries zeroed), sub-network head j against teacher head j. A super-net
trained on a task (cut from a fine-tuned teacher with its head) adds the prediction layer's KD, as
TinyBERT's task-specific stage does: the sub-network's head outputs against the teacher's (KL at
temperature T; MSE for regression; a tagger's on each word's first sub-word). Without it the one-shot phase never trains the
pooler and head that every sub-network shares, and the search's proxy, the same loss on held-out
examples, would judge sub-networks on hidden states alone rather than on the task's predictions.

Sub-networks are drawn from an RNG seeded by the run seed, the process rank and the batch's own token
ids: the same batch gets the same sub-networks on a resume, and ranks (which see different batches)
draw their own, as the paper intends (its code gives every GPU the same draw).
"""

from __future__ import annotations

import hashlib
import random
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from distillery.autotinybert.convert import layer_qk
from distillery.autotinybert.space import Arch
from distillery.autotinybert.supernet import SuperNet, attention_scores
from distillery.data.encode import model_inputs
from distillery.data.tasks import TASKS
from distillery.encoders import encoder_layers, layout_of
from distillery.errors import DistilleryError
from distillery.folders import record
from distillery.kinds import kind_for_head, kind_of
from distillery.modeling import load_checked
from distillery.training.losses import prediction_distillation
from distillery.weights import record_weights


LAYER_RULE = "spread"  # recorded in supernet.json: a folder trained under another rule is refused


def batch_rng(input_ids: Tensor, seed: int, rank: int = 0) -> random.Random:
    digest = hashlib.sha256(input_ids.detach().cpu().numpy().tobytes()).digest()
    return random.Random(int.from_bytes(digest[:8], "little") ^ (seed * 1_000_003 + rank))


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def make_projection(supernet: SuperNet, teacher_hidden: int) -> nn.Linear:
    """d_m → the teacher's width; the identity when the widths match (a super-net cut from the teacher
    then starts with a zero loss at full size)."""
    d = supernet.config.hidden_size
    proj = nn.Linear(d, teacher_hidden)
    if d == teacher_hidden:
        with torch.no_grad():
            proj.weight.copy_(torch.eye(d))
            proj.bias.zero_()
    return proj


class Targets(NamedTuple):
    """What a sub-network is distilled towards: the teacher's last hidden state (B, T, D), last-layer
    pre-softmax scores (B, H, T, T), and its head's outputs (``logits`` or start/end logits; None for
    a teacher without a head)."""

    hidden: Tensor
    scores: Tensor
    head: dict | None = None


class KDTerms(NamedTuple):
    """One sub-network's distillation losses: hidden-state MSE, attention-score MSE and the task
    head's prediction KD (zero for a super-net without a head, or a teacher without one)."""

    hidden: Tensor
    attention: Tensor
    prediction: Tensor

    def total(self, attention_weight: float = 1.0, prediction_weight: float = 1.0) -> Tensor:
        return self.hidden + attention_weight * self.attention + prediction_weight * self.prediction


@torch.no_grad()
def teacher_targets(teacher, batch: dict) -> Targets:
    """The teacher's :class:`Targets` for a batch (its head's outputs when it has a task head); the
    scores are the last layer's content scores q·kᵀ/√d_head, read through the family's layout."""
    out = teacher(**model_inputs(batch, teacher), output_hidden_states=True)
    q, k = layer_qk(layout_of(teacher.config), encoder_layers(teacher)[-1], out.hidden_states[-2])
    scores = attention_scores(q, k, teacher.config.num_attention_heads)
    head = {k: out[k] for k in ("logits", "start_logits", "end_logits") if k in out and out[k] is not None}
    return Targets(out.hidden_states[-1], scores, head or None)


def kd_loss(supernet: SuperNet, projection: nn.Linear, arch: Arch, batch: dict, targets: Targets,
            temperature: float = 1.0, encoded: dict | None = None) -> KDTerms:
    """The :class:`KDTerms` of sub-network α against the teacher's targets. ``encoded``: α's outputs
    (``SuperNet.forward`` with ``sub_networks``) when the caller already ran it."""
    mask = batch["attention_mask"]
    if encoded is None:
        encoded = supernet(batch["input_ids"], mask, batch.get("token_type_ids"), sub_networks=[arch])["sub_networks"][0]
    h, scores = encoded["last_hidden_state"], encoded["scores"]
    pred = F.linear(h, projection.weight[:, : arch.hidden], projection.bias)
    real = mask.bool()
    hidden = F.mse_loss(pred[real], targets.hidden[real])
    pair = (real[:, None, :, None] & real[:, None, None, :]).to(scores.dtype)  # (B, 1, T, T): padding entries zeroed
    heads = scores.shape[1]
    att = F.mse_loss(scores * pair, targets.scores[:, :heads] * pair)
    if supernet.kind is not None and targets.head is not None:
        # KL rather than soft cross-entropy: the same gradients, and zero when α predicts as the teacher; the batch
        # says which outputs are compared (a tagger's: each word's first sub-word)
        prediction = prediction_distillation(supernet.kind, encoded, targets.head, temperature, loss="kl", batch=batch)
    else:
        prediction = hidden.new_zeros(())
    return KDTerms(hidden, att, prediction)


def inplace_targets(largest: dict, projection: nn.Linear, arch: Arch) -> Targets:
    """The largest sub-network's (detached) outputs as targets for the others (in-place distillation)."""
    h = F.linear(largest["last_hidden_state"], projection.weight[:, : arch.hidden], projection.bias).detach()
    head = {k: v.detach() for k, v in largest.items() if k.endswith("logits")}
    return Targets(h, largest["scores"].detach(), head or None)


def sandwich(space, rng: random.Random, samples: int) -> list[Arch]:
    """The sub-networks of one step: largest, smallest, then ``samples`` − 2 drawn at random."""
    fixed = [space.full(), space.smallest()][:samples]
    return fixed + [space.sample(rng) for _ in range(samples - len(fixed))]


def one_shot_loss(teacher, projection: nn.Linear, samples: int = 3, seed: int = 0, attention_weight: float = 1.0,
                  rank: int | None = None, sandwich_rule: bool = True, inplace: bool = False,
                  prediction_weight: float = 1.0, temperature: float = 1.0):
    """loss_fn for the trainer: the mean over ``samples`` sub-networks (the sandwich rule's, or all drawn
    at random) of hidden MSE + w_a · score MSE + w_p · prediction KD (T = ``temperature``; a super-net
    with a task head only). One backward of the mean accumulates exactly the gradients of one
    backward per sub-network / M."""
    if inplace and not sandwich_rule:
        raise DistilleryError("In-place distillation learns from the largest sub-network: it needs the sandwich rule.")

    def loss_fn(model, batch):  # model: the SuperNet, or the DDP wrapper around it under a launcher
        net: SuperNet = getattr(model, "module", model)
        targets = teacher_targets(teacher, batch)
        rng = batch_rng(batch["input_ids"], seed, _rank() if rank is None else rank)
        archs = sandwich(net.space, rng, samples) if sandwich_rule else [net.space.sample(rng) for _ in range(samples)]
        # every sub-network through one call of ``model``: DDP syncs gradients only through its forward
        encoded = model(batch["input_ids"], batch["attention_mask"], batch.get("token_type_ids"),
                        sub_networks=archs)["sub_networks"]
        total, logs = 0.0, {"hidden": 0.0, "attention": 0.0, "prediction": 0.0}
        for k, (arch, enc) in enumerate(zip(archs, encoded)):
            terms = kd_loss(net, projection, arch, batch, targets, temperature, encoded=enc)
            if inplace and k == 0:
                targets = inplace_targets(enc, projection, arch)
            total = total + terms.total(attention_weight, prediction_weight) / samples
            for name, value in terms._asdict().items():
                logs[name] += float(value.detach()) / samples
        return total, logs

    return loss_fn


def save_supernet(supernet: SuperNet, projection: nn.Linear | None, folder, tokenizer=None, facts=None):
    """A trained super-net as a folder: the BERT weights (``save_pretrained``), its task head and the
    KD projection (safetensors), and ``supernet.json`` (strategy, head kind, how it was trained)."""
    import json
    from pathlib import Path

    from safetensors.torch import save_file

    folder = Path(folder)
    supernet.bert.save_pretrained(folder)
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)
    for name, linear in (("head", supernet.head), ("projection", projection)):
        if linear is not None:
            save_file({k: v.contiguous() for k, v in linear.state_dict().items()}, folder / f"{name}.safetensors")
    info = {**(facts or {}), "strategy": supernet.space.strategy,
            "head_kind": None if supernet.kind is None else supernet.kind.name,
            "layer_rule": LAYER_RULE}
    (folder / "supernet.json").write_text(json.dumps(info, indent=2))
    record_weights(folder)
    record(folder)
    return folder


def load_supernet(folder) -> SuperNet:
    """A trained super-net saved by :func:`save_supernet`, with its task head when it was saved with one."""
    import json
    from pathlib import Path

    from transformers import AutoModel

    folder = Path(folder)
    if not (folder / "supernet.json").is_file():
        raise DistilleryError(f"{folder} is not a super-net folder (no supernet.json); make one with `distillery autotinybert pretrain`.")
    facts = json.loads((folder / "supernet.json").read_text())
    if facts.get("layer_rule") != LAYER_RULE:
        raise DistilleryError(f"{folder} was trained with sub-networks taking the first l layers; sub-networks take layers "
                              f"spread over the depth, so its ranking does not carry over: train it again.")
    # an AutoTinyBERT model (or a BERT one with BERT's config: SuperNet converts it); verifies its weights record too
    bert, _ = load_checked(AutoModel, folder, f"the super-net {folder}", new_head=True, strict=True)
    head, kind = _load_linear(folder / "head.safetensors"), None
    if head is not None:
        # the kind of the head saved (a folder of before the kinds wrote "classification" for a regressor too)
        kind = kind_for_head(kind_of(facts.get("head_kind")).head, head.out_features)
    return SuperNet(bert, head, kind, facts["strategy"])


def trained_kind(folder, supernet: SuperNet) -> str | None:
    """The name of the task kind a task super-net saved in ``folder`` was trained for: its head's, or where it has no
    head (an embedder's: its student is the bare encoder, mean-pooled) the kind its ``supernet.json`` records (a
    folder saved before it did: its built-in task's kind); None where neither says."""
    import json
    from pathlib import Path

    if supernet.kind is not None:
        return supernet.kind.name
    facts = json.loads((Path(folder) / "supernet.json").read_text())
    spec = TASKS.get(str(facts.get("task")))
    return facts.get("kind") or (spec.kind if spec is not None else None)


def check_task_supernet(folder, supernet: SuperNet, projection: nn.Linear | None, kind, teacher, strategy: str) -> None:
    """Refuse, in one sentence, a task super-net (``--option supernet=RUN/supernet``) this run cannot search: trained
    for another kind of task than ``kind`` (:func:`trained_kind`), without its KD projection, for a teacher of
    another head size, vocabulary or width, or with another ``strategy``. A headless super-net (an embedder's) is
    the teacher's encoder distilled on its hidden states and attention alone, as every task's one-shot phase is:
    reused by an embedding run like any task's by its own kind."""
    trained = trained_kind(folder, supernet)
    if trained != kind.name or projection is None:
        what = trained.replace("_", " ") if trained else "a kind of task it does not record"
        raise DistilleryError(f"{folder} is not a super-net trained on a task like this one (trained for {what}, this "
                              f"run's task is {kind.name.replace('_', ' ')}; projection "
                              f"{'saved' if projection is not None else 'missing'}).")
    if (supernet.head is not None and supernet.head.out_features != getattr(teacher, "num_labels", supernet.head.out_features)) \
            or supernet.config.vocab_size != teacher.config.vocab_size \
            or projection.out_features != teacher.config.hidden_size:
        raise DistilleryError(f"{folder} has another head size, vocabulary or width than this task's teacher.")
    if supernet.space.strategy != strategy:
        raise DistilleryError(f"{folder} uses the {supernet.space.strategy} strategy, not {strategy}.")


def load_projection(folder) -> nn.Linear | None:
    """The KD projection saved beside a super-net (None for a folder without one)."""
    from pathlib import Path

    return _load_linear(Path(folder) / "projection.safetensors")


def _load_linear(path) -> nn.Linear | None:
    """An ``nn.Linear`` from a safetensors file of its state dict (None when the file is absent)."""
    from safetensors.torch import load_file

    if not path.is_file():
        return None
    weights = load_file(path)
    linear = nn.Linear(weights["weight"].shape[1], weights["weight"].shape[0])
    linear.load_state_dict(weights)
    return linear


