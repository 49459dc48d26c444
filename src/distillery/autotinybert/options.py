"""The options of method ``autotinybert`` (``RunConfig.method_options``), one typed dataclass checked
up front, and the budgets' sizes. Its own module: the recipe and the one-shot command both read it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from distillery.autotinybert.space import STRATEGIES
from distillery.errors import DistilleryError
from distillery.recipe import MethodOptions, flag, number, one_of, option, text


def _steps(low: int = 1):
    return number(low, whole=True)


@dataclass
class AutoTinyBertOptions(MethodOptions):
    """Defaults are the quick budget's; :func:`budget_overrides` sizes the full one."""

    METHOD: ClassVar[str] = "autotinybert"
    speedup: float = option(2.0, number(above=0))
    budget_ms: float | None = option(None, number(above=0, optional=True))
    strategy: str = option("head-dims", one_of(*STRATEGIES))
    arch: str | None = option(None, text(optional=True))  # None: search; "fast", "conventional" or "l,d_m,d_f,h,d_qkv"
    samples: int = option(3, _steps())  # M sub-networks per batch (Algorithm 1)
    # the M are the largest, the smallest and M − 2 random ones (False: all random, as the paper)
    sandwich: bool = option(True, flag())
    inplace_kd: bool = option(False, flag())  # the smaller ones learn from the largest's outputs instead of the teacher's
    # the one-shot objective's (and the search proxy's) prediction-layer KD weight; 0: hidden + attention only, as the paper
    prediction_weight: float = option(1.0, number(0))
    rewire: bool = option(True, flag())  # order FFN neurons and heads by importance before one-shot training
    rewire_examples: int | None = option(2048, number(1, whole=True, optional=True))  # None: all train examples
    supernet_steps: int = option(300, _steps())
    supernet_lr: float = option(1e-4, number(above=0))
    # search d_m too (the paper's space). Off: candidates keep the teacher's hidden size and shrink depth, FFN and
    # attention. A quick one-shot phase (300 steps) does not teach sub-networks to run on a slice of the residual
    # stream: at 4× the searched narrow picks scored near chance (MRPC 4,96,1216 F1 0.814, RTE 3,128,1280 0.542,
    # STS-B 5,64,1088 Pearson 0.095), and on STS-B the full-width 3,384,384,12,144 reached 0.524 against 0.240
    # for the conventional 2,288,1152 at the same budget (docs/autotinybert.md)
    search_hidden: bool = option(False, flag())
    latency_archs: int = option(100, _steps(8))  # the predictor needs training and held-out architectures; 100 timed: ~30 s, 40 gave 8 % MAPE
    latency_runs: int = option(10, _steps())
    generations: int = option(3, _steps())
    population: int = option(10, _steps())
    search_backend: str = option("evolution", one_of("evolution", "optuna"))  # optuna: NSGA-II, constraint on the predicted latency
    p_mutation: float = option(0.5, number(0, 1))
    p_exploration: float = option(0.5, number(0, 1))
    budget_floor: float = option(0.85, number(0, below=1))  # candidates predicted under this share of the budget are not evaluated (0: none)
    proxy_examples: int = option(512, _steps())  # held-out train examples a candidate is scored on
    # probe: a linear probe on the inherited sub-network's [CLS] state; proxy: its KD loss in the super-net;
    # finetune: a short fine-tune of each candidate (all scored on held-out train examples)
    evaluator: str = option("probe", one_of("probe", "proxy", "finetune"))
    probe_examples: int = option(1024, _steps(8))  # train examples the probe is fitted on
    finetune_examples: int = option(1024, _steps())
    finetune_steps: int = option(100, _steps())
    further_training: bool = option(True, flag())  # False: the chosen sub-network as extracted (`autotinybert search`)
    # a trained super-net folder (a run's supernet/, or `autotinybert supernet`): no one-shot phase
    supernet: str | None = option(None, text(optional=True))
    # further training's learning rate; None: the student's (--lr) × (speed-up − 1), within 1–3×. A smaller
    # sub-network, further from the teacher it was cut from, needs larger steps (SST-2, quick: at 2× 5,384,384,12,336
    # 0.874 at 1e-4, 0.865 at 3e-4; at 4× 3,384,384,12,144 0.822 at 1e-4, 0.843 at 3e-4, 0.844 at 5e-4;
    # STS-B at 4× 0.524 at 1e-4, 0.605 at 3e-4)
    further_lr: float | None = option(None, number(above=0, optional=True))
    # further training's examples: "all" the task's train split, labelled by the teacher, or the run's "budget" (data.train_limit)
    train_examples: str = option("all", one_of("all", "budget"))
    kd_weight: float = option(0.5, number(0, 1))  # further training: (1 − w)·CE + w·KD, as the distill baseline
    temperature: float = option(2.0, number(above=0))

    def check(self) -> None:
        if self.budget_ms is None and self.speedup <= 1.0:
            raise DistilleryError(f"Option speedup must be above 1 (a student faster than the teacher), got {self.speedup}.")


def budget_overrides(budget: str, task: str) -> dict[str, Any]:
    """The full budget's larger one-shot phase, predictor and search (the quick one is the default)."""
    if budget == "quick":
        return {}
    return {"method_options": {"supernet_steps": 3000, "latency_archs": 200, "generations": 4, "population": 25}}


