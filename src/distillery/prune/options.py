"""Options of method ``prune`` (:mod:`distillery.prune.recipe`); ``presets.yaml`` sizes the full budget (these
defaults are the quick one's)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

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
    augment: int = augment_option()
    kd_weight: float = option(0.5, number(0, 1), "fine-tuning: weight of the KD term (1 - kd_weight on the task's own "
                              "loss)", flag=True)
    temperature: float = option(2.0, number(above=0), "softmax temperature of the KD loss", flag=True)

    def check(self) -> None:
        if self.speedup <= 1.0:
            raise DistilleryError(f"Option speedup must be above 1 (a student faster than the teacher), got {self.speedup}.")


Options = PruneOptions
