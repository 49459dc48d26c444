"""Options of method ``moebert`` (:mod:`distillery.moebert.recipe`), and the choices its student offers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from distillery.method import MethodOptions, augment_option, flag, number, one_of, option, text

SPLITS = ("import", "random", "inverse")  # how neurons are dealt to experts (Fig. 3a)
ROUTINGS = ("hash-r", "hash-b", "gate")
SHARED_MODES = ("tied", "cloned")
GATE_SCALES = ("prob", "straight-through")
DISTILL_LAYERS = ("all", "last", "skip", "none")


@dataclass
class MoEBertOptions(MethodOptions):
    METHOD: ClassVar[str] = "moebert"
    ALIASES: ClassVar[dict[str, str]] = {"lambda": "lam"}  # `lambda` is a Python keyword
    experts: int = option(4, number(1, whole=True), "number of experts", paper="N", flag=True, steps=("convert",))
    expert_size: int | None = option(None, number(1, whole=True, optional=True), "neurons per expert",
                                     default_text="d_h/N", paper="d_e", flag=True, steps=("convert",))
    shared: int | None = option(None, number(0, whole=True, optional=True),
                                "most important neurons shared by all experts", default_text="d_h/6, a multiple of 8",
                                paper="s", flag=True, steps=("convert",))
    split: str = option("import", one_of(*SPLITS), "how neurons are dealt to experts: by importance, at random, "
                        "or by inverse importance", paper="adaptation split (Fig. 3a)", flag=True, steps=("convert",))
    routing: str = option("hash-r", one_of(*ROUTINGS), "token routing: hash by token id (random or balanced "
                          "tables) or a sentence-level gate", paper="routing (Fig. 3c)", flag=True, steps=("convert",))
    shared_mode: str = option("tied", one_of(*SHARED_MODES), "tied: one shared block computed once; cloned: the "
                              "paper's per-expert copies", flag=True, steps=("convert",))
    gate_scale: str = option("prob", one_of(*GATE_SCALES), "gate routing: the expert's output scaled by the gate's "
                             "probability, or a straight-through estimate")
    distill_layers: str = option("all", one_of(*DISTILL_LAYERS), "hidden states distilled: every layer, the last, "
                                 "every other, or no distillation at all", paper="Eq. 5; Table 3's -distill",
                                 flag=True, steps=("train",))
    lam: float = option(1.0, number(0), "weight of the layer-wise distillation loss", paper="λ_distill", flag=True,
                        steps=("train",))
    balance_weight: float = option(0.01, number(0), "gate routing: weight of the load-balancing loss", flag=True,
                                   steps=("train",))
    importance_examples: int | None = option(2048, number(1, whole=True, optional=True),
                                             "training examples sampled for the importance scores (unset: all)",
                                             paper="Eq. 4", flag=True, steps=("importance",))
    # on for classification and regression, off for QA, where it lost (SQuAD quick: F1 39.6 with, 45.3 without),
    # and for token classification, whose head reads every token as QA's does
    refit: bool | None = option(None, flag(optional=True), "least-squares refit of the experts' output weights "
                                "after conversion (ours; off: the paper's conversion)", default_text="on, off for QA and NER",
                                flag=True, steps=("convert",))
    augment: int = augment_option()
    train_examples: str = option("all", one_of("all", "budget"), "all: the whole train split (the teacher's hidden "
                                 "states and predictions are computed on every batch, so past the budget's limit "
                                 "it distils the teacher on them); budget: the run's examples only (--train-limit)",
                                 steps=("train",))
    init: str | None = option(None, text(optional=True), "a converted MoEBERT model folder (`distillery moebert "
                              "convert`): training starts from it")


Options = MoEBertOptions
