"""Evolutionary search under a latency constraint (AutoTinyBERT's Algorithm 2).

Generation 0 is S random architectures whose predicted latency is within the budget, after any
``seeds`` (architectures the caller wants judged, such as the ``distill`` baseline's shape) that are. Each later
generation makes S children: with probability p_e a fresh random feasible architecture (exploration),
otherwise a parent chosen by Russian-roulette selection among the best S so far (probability
proportional to its score minus the worst score, so the worst is never picked unless all tie) and
mutated (each dimension re-drawn with probability p_m) until it is feasible. Every candidate is
evaluated once (scores are cached by architecture) and logged. Nothing over budget is ever evaluated
or returned.

Feasible also means "not far under the budget" when a floor is given (``floor_ms``; the recipe's
``budget_floor`` = 0.93 of the budget). The paper constrains latency from above only, but uniform draws
over the space land mostly far below any useful budget (at 2× on MiniLM, 27 of 29 evaluated candidates
used under two thirds of it), and a sub-network that leaves latency unused is, after further training,
rarely better than a larger one: with a few dozen evaluations the floor spends them where the
answer is. If no architecture of the space lies between floor and budget, the floor is dropped.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from distillery.autotinybert.space import Arch, SearchSpace
from distillery.errors import DistilleryError
from distillery.folders import atomic_file


@dataclass
class Candidate:
    arch: Arch
    score: float
    latency_ms: float
    generation: int

    def as_dict(self) -> dict:
        return {**self.arch.as_dict(), "score": self.score, "latency_ms": self.latency_ms, "generation": self.generation}


@dataclass
class SearchResult:
    best: list[Candidate]  # the final population, best first
    evaluated: list[Candidate] = field(default_factory=list)  # every candidate, in evaluation order


def roulette(population: list[Candidate], rng: random.Random) -> Candidate:
    """Russian-roulette selection: P(i) ∝ score_i − min score (uniform when all scores tie)."""
    low = min(c.score for c in population)
    weights = [c.score - low for c in population]
    if sum(weights) <= 0:
        return rng.choice(population)
    return rng.choices(population, weights=weights, k=1)[0]


def evolutionary_search(space: SearchSpace, evaluate: Callable[[Arch], float], latency: Callable[[Arch], float],
                        budget_ms: float, generations: int = 4, population: int = 25, p_mutation: float = 0.5,
                        p_exploration: float = 0.5, seed: int = 0, max_tries: int = 10_000,
                        log_path: str | Path | None = None, floor_ms: float = 0.0,
                        seeds: list[Arch] = ()) -> SearchResult:
    """Search α maximising ``evaluate`` (higher is better) subject to ``floor_ms ≤ latency(α) ≤ budget_ms``."""
    if generations < 1 or population < 1:
        raise DistilleryError("The search needs at least one generation of at least one candidate.")
    if not (0.0 <= p_mutation <= 1.0 and 0.0 <= p_exploration <= 1.0):
        raise DistilleryError("p_mutation and p_exploration are probabilities (0 to 1).")
    rng = random.Random(seed)
    cache: dict[Arch, Candidate] = {}
    evaluated: list[Candidate] = []

    def feasible(make: Callable[[], Arch]) -> Arch:
        nonlocal floor_ms
        for _ in range(max_tries):
            arch = make()
            if floor_ms <= latency(arch) <= budget_ms:
                return arch
        if floor_ms > 0:  # nothing between floor and budget: the plain constraint from here on
            floor_ms = 0.0
            return feasible(make)
        raise DistilleryError(f"No architecture of the search space is predicted under {budget_ms:.2f} ms after "
                              f"{max_tries} draws: the budget is below the smallest architecture's latency.")

    def score(arch: Arch, generation: int) -> Candidate:
        if arch not in cache:
            cache[arch] = Candidate(arch, float(evaluate(arch)), float(latency(arch)), generation)
            evaluated.append(cache[arch])
            if log_path is not None:
                write_log(log_path, evaluated, budget_ms)
        return cache[arch]

    seeded = [a for a in dict.fromkeys(seeds) if space.contains(a) and floor_ms <= latency(a) <= budget_ms][:population]
    current = [score(a, 0) for a in seeded]
    current += [score(feasible(lambda: space.sample(rng)), 0) for _ in range(population - len(current))]
    for generation in range(1, generations):
        children = []
        for _ in range(population):
            if rng.random() < p_exploration:
                arch = feasible(lambda: space.sample(rng))
            else:
                parent = roulette(current, rng)
                arch = feasible(lambda: space.mutate(parent.arch, p_mutation, rng))
            children.append(score(arch, generation))
        pool = {c.arch: c for c in current + children}  # a candidate counts once
        current = sorted(pool.values(), key=lambda c: c.score, reverse=True)[:population]
    return SearchResult(best=sorted(current, key=lambda c: c.score, reverse=True), evaluated=evaluated)


def write_log(path: str | Path, evaluated: list[Candidate], budget_ms: float) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(path, "w") as f:
        f.write(json.dumps({"budget_ms": budget_ms, "candidates": [c.as_dict() for c in evaluated]}, indent=2))


def fast_candidates(space: SearchSpace, latency: Callable[[Arch], float], budget_ms: float) -> list[Arch]:
    """AutoTinyBERT-Fast: for each layer count, the architecture with 1.6·d_m ≤ d_f ≤ 1.9·d_m and
    0.7·d_m ≤ d_qkv ≤ d_m whose predicted latency comes closest to the budget from below."""
    c = space.choices()
    qkv_options = ([(h, h * space.head_size) for h in c["heads"]] if space.strategy == "heads"
                   else [(space.max_heads, q) for q in c["qkv"]])
    out = []
    for layers in c["layers"]:
        best = None
        for hidden in c["hidden"]:
            for ffn in (f for f in c["ffn"] if 1.6 * hidden <= f <= 1.9 * hidden):
                for heads, qkv in ((h, q) for h, q in qkv_options if 0.7 * hidden <= q <= hidden):
                    arch = Arch(layers, hidden, ffn, heads, qkv)
                    ms = latency(arch)
                    if ms <= budget_ms and (best is None or ms > best[0]):
                        best = (ms, arch)
        if best is not None:
            out.append(best[1])
    return out


def conventional(space: SearchSpace, latency: Callable[[Arch], float], budget_ms: float, k: int | None = None) -> list[Arch]:
    """The comparison row: the usual BERT shape d_f = 4·d_m, d_qkv = d_m (nearest allowed values) whose
    predicted latency comes closest to the budget from below — the same latency as the searched one.
    The ``k`` closest (default: all under the budget), closest first: the next ones are the fallbacks if
    the first misses the budget when measured."""
    c = space.choices()
    nearest = lambda values, target: min(values, key=lambda v: (abs(v - target), -v))
    found = []
    for layers in c["layers"]:
        for hidden in c["hidden"]:
            ffn = nearest(c["ffn"], 4 * hidden)
            if space.strategy == "heads":
                heads = nearest(c["heads"], max(1, round(hidden / space.head_size)))
                qkv = heads * space.head_size
            else:
                heads, qkv = space.max_heads, nearest(c["qkv"], hidden)
            arch = Arch(layers, hidden, ffn, heads, qkv)
            ms = latency(arch)
            if ms <= budget_ms:
                found.append((ms, arch))
    if not found:
        raise DistilleryError(f"No conventional architecture is predicted under {budget_ms:.2f} ms.")
    return [arch for _, arch in sorted(found, key=lambda f: -f[0])[:k]]


def optuna_search(space: SearchSpace, evaluate: Callable[[Arch], float], latency: Callable[[Arch], float],
                  budget_ms: float, trials: int = 100, population: int = 25, seed: int = 0,
                  journal: str | Path | None = None, study_name: str = "autotinybert", floor_ms: float = 0.0) -> SearchResult:
    """The alternative backend: Optuna's NSGA-II on (score ↑, predicted latency ↓) with the budget as a
    constraint. With ``journal`` (a file) the study lives in Optuna's journal storage, so several
    workers can search the same study in parallel (each calls this with the same journal and name).
    An architecture over budget (or under ``floor_ms``, a second constraint) is not evaluated (its score is
    recorded as −1e9) and never returned."""
    try:
        import optuna
        from optuna.storages import JournalStorage
        from optuna.storages.journal import JournalFileBackend
    except ImportError:
        raise DistilleryError("The Optuna backend needs optuna: pip install 'distillery[search]'.") from None

    c = space.choices()
    sampler = optuna.samplers.NSGAIISampler(population_size=population, seed=seed,
                                            constraints_func=lambda t: [t.user_attrs["latency_ms"] - budget_ms,
                                                                        floor_ms - t.user_attrs["latency_ms"]])
    storage = JournalStorage(JournalFileBackend(str(journal))) if journal is not None else None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(directions=["maximize", "minimize"], sampler=sampler, storage=storage,
                                study_name=study_name, load_if_exists=journal is not None)

    def objective(trial) -> tuple[float, float]:
        heads = trial.suggest_categorical("heads", c["heads"])
        qkv = heads * space.head_size if space.strategy == "heads" else trial.suggest_categorical("qkv", c["qkv"])
        arch = Arch(trial.suggest_categorical("layers", c["layers"]), trial.suggest_categorical("hidden", c["hidden"]),
                    trial.suggest_categorical("ffn", c["ffn"]), heads, qkv)
        ms = float(latency(arch))
        trial.set_user_attr("latency_ms", ms)
        trial.set_user_attr("arch", arch.as_dict())
        return (float(evaluate(arch)) if floor_ms <= ms <= budget_ms else -1e9), ms

    study.optimize(objective, n_trials=trials)
    evaluated = [Candidate(Arch(**t.user_attrs["arch"]), t.values[0], t.user_attrs["latency_ms"], t.number // population)
                 for t in study.trials if t.values is not None]
    feasible = {cand.arch: cand for cand in evaluated if cand.latency_ms <= budget_ms and cand.score > -1e9}
    if not feasible:
        raise DistilleryError(f"Optuna found no architecture under {budget_ms:.2f} ms in {trials} trials.")
    best = sorted(feasible.values(), key=lambda cand: cand.score, reverse=True)[:population]
    return SearchResult(best=best, evaluated=evaluated)
