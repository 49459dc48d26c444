"""Options of method ``autotinybert`` (:mod:`distillery.autotinybert.recipe`); ``presets.yaml``
sizes the full budget (these defaults are the quick one's)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from distillery.distill.deep_cut import FALLBACK_TEMPERATURE, KD_WEIGHT
from distillery.errors import DistilleryError
from distillery.method import MethodOptions, augment_option, flag, number, one_of, option, text


STRATEGIES = ("heads", "head-dims")  # attention sub-matrices: whole heads, or dimensions of every head


def _steps(low: int = 1):
    return number(low, whole=True)


@dataclass
class AutoTinyBertOptions(MethodOptions):
    """Defaults are the quick budget's; ``presets.yaml`` sizes the full one."""

    METHOD: ClassVar[str] = "autotinybert"
    speedup: float = option(2.0, number(above=0), "latency budget as a speed-up over the teacher measured here "
                            "(with --method auto: the target of every candidate)",
                            flag=True, steps=("search", "train"))
    budget_ms: float | None = option(None, number(above=0, optional=True), "budget in ms at 1x128 (instead of speedup)",
                                     default_text="from speedup", steps=("search",))
    strategy: str = option("head-dims", one_of(*STRATEGIES), "attention sub-matrices: whole heads or dimensions "
                           "of every head", steps=("pretrain",))
    arch: str | None = option(None, text(optional=True), "skip the search: fast (AutoTinyBERT-Fast's rule), "
                              "conventional (d_f = 4 d_m, d_qkv = d_m) or l,d_m,d_f,h,d_qkv", default_text="search")
    samples: int = option(3, _steps(), "sub-networks per batch", paper="M (Algorithm 1)", steps=("pretrain",))
    # the M are the largest, the smallest and M - 2 random ones (False: all random, as the paper)
    sandwich: bool = option(True, flag(), "the sandwich rule: the largest, the smallest and M - 2 random "
                            "sub-networks (off: all random, as the paper)")
    inplace_kd: bool = option(False, flag(), "the smaller sub-networks learn from the largest's outputs "
                              "instead of the teacher's")
    prediction_weight: float = option(1.0, number(0), "weight of the prediction-layer KD in the one-shot objective "
                                      "and the search proxy (0: hidden + attention only, as the paper)")
    rewire: bool = option(True, flag(), "order FFN neurons and heads by importance before one-shot training")
    rewire_examples: int | None = option(2048, number(1, whole=True, optional=True),
                                         "training examples the rewiring's importance is scored on (unset: all)")
    supernet_steps: int = option(300, _steps(), "optimizer steps of the one-shot phase")
    supernet_lr: float = option(1e-4, number(above=0), "learning rate of the one-shot phase")
    # A quick one-shot phase (300 steps) does not teach sub-networks to run on a slice of the residual
    # stream: at 4x the searched narrow picks scored near chance (MRPC 4,96,1216 F1 0.814, RTE 3,128,1280 0.542,
    # STS-B 5,64,1088 Pearson 0.095), and on STS-B the full-width 3,384,384,12,144 reached 0.524 against 0.240
    # for the conventional 2,288,1152 at the same budget (docs/autotinybert.md)
    search_hidden: bool = option(False, flag(), "search d_m too (the paper's space); off: candidates keep the "
                                 "teacher's hidden size and shrink depth, FFN and attention")
    # the predictor needs training and held-out architectures; 100 timed: ~30 s, 40 gave 8 % MAPE
    latency_archs: int = option(100, _steps(8), "architectures timed to fit the latency predictor")
    latency_runs: int = option(10, _steps(), "timed runs per architecture")
    generations: int = option(3, _steps(), "generations of the evolutionary search", paper="Algorithm 2")
    population: int = option(10, _steps(), "candidates per generation")
    search_backend: str = option("evolution", one_of("evolution", "optuna"), "evolution (Algorithm 2) or optuna "
                                 "(NSGA-II, constraint on the predicted latency)", steps=("search",), cli="backend")
    p_mutation: float = option(0.5, number(0, 1), "mutation probability of the evolutionary search")
    p_exploration: float = option(0.5, number(0, 1), "exploration probability of the evolutionary search")
    # 0.93, not 1/1.1: a student measured at 0.91 of its 4x budget in its run measured 4.44x (+11 %) in the
    # base-size benchmark's own process (docs/results.md); timings of one process carry ~3 % of noise
    budget_floor: float = option(0.93, number(0, below=1), "candidates predicted under this share of the budget "
                                 "are not evaluated, and the student shipped is the first measured between it and "
                                 "the budget (0.93: a speed-up within 10 % of the one asked, with room for timing "
                                 "noise; 0: no floor)")
    proxy_examples: int = option(512, _steps(), "held-out train examples a candidate is scored on")
    evaluator: str = option("probe", one_of("probe", "proxy", "finetune"), "a candidate's score: a linear probe on "
                            "its inherited [CLS] state, its KD loss in the super-net, or a short fine-tune "
                            "(all on held-out train examples)", steps=("search",))
    probe_examples: int = option(1024, _steps(8), "train examples the probe is fitted on")
    finetune_examples: int = option(1024, _steps(), "evaluator finetune: train examples of each fine-tune")
    finetune_steps: int = option(100, _steps(), "evaluator finetune: optimizer steps of each fine-tune")
    further_training: bool = option(True, flag(), "train the chosen sub-network further on the task (off: as "
                                    "extracted, `autotinybert search`)")
    supernet: str | None = option(None, text(optional=True), "a trained super-net folder: a run's supernet/ (no "
                                  "one-shot phase), or one pre-trained on a corpus by `autotinybert pretrain`",
                                  default_text="train one")
    # The pre-trained super-net copies the base encoder; the further training distils the fine-tuned one, and
    # the pooler and head every sub-network shares were never trained on the pre-trained representation
    task_phase: bool = option(True, flag(), "with a super-net from `autotinybert pretrain`: train it one-shot on the "
                              "task (supernet_steps) before the search (off: search it as pre-trained, as the paper)")
    # A smaller sub-network, further from the teacher it was cut from, needs larger steps (SST-2, quick: at 2x
    # 5,384,384,12,336 0.874 at 1e-4, 0.865 at 3e-4; at 4x 3,384,384,12,144 0.822 at 1e-4, 0.843 at 3e-4, 0.844
    # at 5e-4; STS-B at 4x 0.524 at 1e-4, 0.605 at 3e-4)
    further_lr: float | None = option(None, number(above=0, optional=True), "learning rate of the further training",
                                      default_text="the student's (--lr) x (speed-up - 1), within 1-3x; x lr_scale "
                                      "when the sub-network keeps fewer than half of the layers")
    augment: int | None = augment_option(
        default_text="0; further training of a sub-network keeping fewer than half of the teacher's layers on a train "
        "split of fewer than 20,000 rows: 8 (read twice)")
    train_examples: str = option("all", one_of("all", "budget"), "further training: all: the whole train split, "
                                 "labelled by the teacher; budget: the run's examples (--train-limit)")
    kd_weight: float | None = option(
        None, number(0, 1, optional=True), "weight of the KD term (1 - kd_weight on the task's own loss)", flag=True,
        default_text="0.5; in the further training of a sub-network keeping fewer than half of the teacher's layers, "
        "1 where the teacher's outputs are logits (the teacher's outputs only)")
    # The deep-cut rule's options (distill's names, distillery.distill.deep_cut), for the further training of a
    # sub-network keeping fewer than half of the teacher's layers; each one given turns that choice off
    temperature: float | None = option(
        None, number(above=0, optional=True), "softmax temperature of the KD loss", flag=True,
        default_text="2.0; further training of a sub-network keeping fewer than half of the teacher's layers: from "
        "the teacher's logits, the softest of 1, 2, 4 at which its mean top-1 probability stays >= 0.8")
    hidden_weight: float | None = option(
        None, number(0, optional=True), "further training: weight of hidden-state MSE, each sub-network layer onto "
        "the teacher layer it was cut from (where the sub-network keeps the teacher's width); 0 = off",
        paper="β", default_text="1.0 when the sub-network keeps fewer than half of the teacher's layers, else 0")
    attention_weight: float | None = option(
        None, number(0, optional=True), "further training: weight of self-attention distillation (MiniLM's KL) on "
        "the layers hidden_weight pairs (where the sub-network keeps the teacher's head count); 0 = off",
        default_text="3.0 when the sub-network keeps fewer than half of the teacher's layers, else 0")
    min_steps: int | None = option(
        None, number(0, whole=True, optional=True), "further training: optimizer steps at least (more passes over a "
        "small split), the first 10 % warming up; 0 = the budget's schedule as it is",
        default_text="600 when the sub-network keeps fewer than half of the teacher's layers, else 0")
    lr_scale: float | None = option(
        None, number(above=0, optional=True), "further training: the student's learning rate (--lr) times this",
        default_text="3 when the sub-network keeps fewer than half of the teacher's layers, else (speed-up - 1) "
        "within 1-3")

    def kd_temperature(self) -> float:
        """The temperature of the one-shot phase and the search's: ``temperature``, else 2 (the further training's
        may come from the teacher's logits: :mod:`distillery.autotinybert.further`)."""
        return FALLBACK_TEMPERATURE if self.temperature is None else float(self.temperature)

    def kd_share(self) -> float:
        """The search's fine-tuning's ``kd_weight``: the user's, else 0.5 (the further training's may be the deep-cut
        rule's: :mod:`distillery.autotinybert.further`)."""
        return KD_WEIGHT if self.kd_weight is None else float(self.kd_weight)

    def check(self) -> None:
        if self.further_lr is not None and self.lr_scale is not None:
            raise DistilleryError("Options further_lr and lr_scale both set the further training's learning rate; "
                                  "give one.")
        if self.budget_ms is None and self.speedup <= 1.0:
            raise DistilleryError(f"Option speedup must be above 1 (a student faster than the teacher), got {self.speedup}.")


Options = AutoTinyBertOptions
