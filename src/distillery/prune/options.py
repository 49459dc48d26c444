"""Options of method ``prune`` (:mod:`distillery.prune.recipe`); ``presets.yaml`` sizes the full budget (these
defaults are the quick one's)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from distillery.distill.deep_cut import FALLBACK_TEMPERATURE
from distillery.errors import DistilleryError
from distillery.method import MethodOptions, augment_option, flag, number, one_of, option, text


def _steps(low: int = 1):
    return number(low, whole=True)


@dataclass
class PruneOptions(MethodOptions):
    """Defaults are the quick budget's; ``presets.yaml`` sizes the full one."""

    METHOD: ClassVar[str] = "prune"
    mode: str = option("full", one_of("full", "cheap"), "full: CoFi's masks learned with layer-wise distillation, from the cheap mode's selection; "
                       "cheap: retraining-free, heads and neurons kept by Fisher information per latency saved "
                       "(Kwon et al. 2022), no masks' phase", paper="Kwon et al. 2022 (cheap)")
    fisher_examples: int = option(512, _steps(), "training examples that score the heads and neurons by Fisher "
                                  "information (the cheap mode's selection, where the full mode's masks start)")
    min_heads: int | None = option(
        None, number(0, whole=True, optional=True), "heads each layer keeps at least in the Fisher selection (its "
        "best-scored ones; the full mode's masks start there), unless no other shape reaches the target",
        default_text="the task kind's share of the teacher's heads (TaskKind.prune_head_floor: an embedder half, "
        "else 0)")
    speedup: float = option(2.0, number(above=0), "latency target as a speed-up over the teacher measured here",
                            flag=True)
    # --latency-ms (compress routes it here for this method): a latency on this machine, turned into a speed-up
    # once the teacher has been timed with the latency model's shapes
    latency_ms: float | None = option(None, number(above=0, optional=True), "latency target in ms at 1x128 on this "
                                      "machine (compress --latency-ms), instead of speedup")
    mask_steps: int = option(300, _steps(), "optimizer steps of the masks' phase (masks and weights learned with "
                             "layer-wise distillation)", paper="CoFi's pruning epochs")
    # CoFi ramps the target sparsity over its first epochs; a latency target reached at once prunes before
    # the distillation has told the masks what matters
    target_warmup: float = option(0.5, number(0, 1), "mask_init=0 only: share of the masks' phase over which the "
                                  "latency target falls linearly from the teacher's to the one asked (the cheap "
                                  "mode's selection starts at the target)", paper="Lagrangian warm-up")
    prune_hidden: bool = option(True, flag(), "prune the hidden dimension too (off: heads, neurons and sub-layers)")
    layer_weight: float = option(1.0, number(0), "weight of the layer-wise hidden-state distillation in the masks' "
                                 "phase", paper="λ (Eq. 6)")
    mask_lr_scale: float = option(200.0, number(above=0), "the masks' and Lagrange multipliers' learning rate as a "
                                  "multiple of the student's (CoFi: 0.01 against 2e-5 to 5e-5)")
    # log α 0 everywhere (CoFi's start) drew every gate at random in a 300-step phase and wrecked the weights:
    # STS-B 4x kept 22 % of the teacher against the cheap mode's 100.7 % (docs/prune.md)
    mask_init: float = option(6.0, number(0), "where the masks' phase starts: m > 0, the cheap mode's selection at "
                              "the target, log α about +m for the units it keeps and -m for those it removes (in "
                              "between near its Fisher threshold); 0: CoFi's start, every log α 0 (drop rate 0.5, "
                              "each gate drawn at 0 with p 0.17)")
    latency_shapes: int = option(24, _steps(8), "random pruned shapes timed to fit the latency model")
    latency_runs: int = option(10, _steps(), "timed runs per shape (a round: all shapes and the teacher interleaved)")
    latency_from: str | None = option(None, text(optional=True), "the latency.json of an earlier prune run on this "
                                      "machine and teacher, read instead of timing again (one model, several targets)")
    finetune: bool = option(True, flag(), "fine-tune the pruned model with the masks fixed (off: as extracted)")
    augment: int | None = augment_option(
        default_text="0; a target above 2x (a deep cut: distillery.distill.deep_cut) on a train split of fewer "
        "than 20,000 rows: 8 (read twice)")
    kd_weight: float | None = option(
        None, number(0, 1, optional=True), "fine-tuning: weight of the KD term (1 - kd_weight on the task's own loss)",
        flag=True, default_text="0.5; 1 for a target above 2x (a deep cut) where the teacher's outputs are logits "
        "(the teacher's outputs only)")
    # The deep-cut rule's options (distill's names), for the fine-tuning of a model pruned past 2x, which keeps
    # less of the teacher than a layer-drop student of half its layers; each one given turns that choice off
    temperature: float | None = option(
        None, number(above=0, optional=True), "softmax temperature of the KD loss", flag=True,
        default_text="2.0; fine-tuning past 2x: from the teacher's logits, the softest of 1, 2, 4 at which its mean "
        "top-1 probability stays >= 0.8")
    hidden_weight: float | None = option(
        None, number(0, optional=True), "fine-tuning: weight of hidden-state MSE, each pruned layer onto the teacher "
        "layer it was pruned from (on the dimensions kept where the hidden one was pruned); 0 = off", paper="β",
        default_text="1.0 past 2x, else the task kind's (TaskKind.prune_hidden_weight: an embedder 1, else 0)")
    min_steps: int | None = option(
        None, number(0, whole=True, optional=True), "fine-tuning: optimizer steps at least (more passes over a small "
        "split), the first 10 % warming up; 0 = the budget's schedule as it is", default_text="600 past 2x, else 0")
    lr_scale: float | None = option(
        None, number(above=0, optional=True), "fine-tuning: the student's learning rate (--lr) times this",
        default_text="3 past 2x, else 1")

    def kd_temperature(self) -> float:
        """The masks' phase's temperature: ``temperature``, else 2 (the fine-tuning's may come from the teacher's
        logits: :func:`distillery.prune.recipe.finetune_defaults`)."""
        return FALLBACK_TEMPERATURE if self.temperature is None else float(self.temperature)

    def check(self) -> None:
        if self.speedup <= 1.0:
            raise DistilleryError(f"Option speedup must be above 1 (a student faster than the teacher), got {self.speedup}.")


Options = PruneOptions
