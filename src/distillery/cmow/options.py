"""Options of method ``cmow`` (:mod:`distillery.cmow.recipe`), and the choices its student offers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from distillery.method import MethodOptions, augment_option, flag, number, one_of, option, text

COMPONENTS = ("hybrid", "cmow", "cbow")
PAIR_MODES = ("joint", "diffcat")
HEADS = ("linear", "mlp", "cnn", "bilstm")
VECTOR_STARTS = ("random", "static")


@dataclass
class CMOWOptions(MethodOptions):
    METHOD: ClassVar[str] = "cmow"
    component: str = option("hybrid", one_of(*COMPONENTS), "the encoder: CMOW/CBOW-Hybrid, CMOW alone or CBOW alone")
    bidirectional: bool = option(True, flag(), "a second CMOW reading the sentence backwards", paper="bidirectional CMOW")
    matrix_dim: int = option(20, number(1, whole=True), "side of each token's matrix embedding", paper="d")
    vector_dim: int = option(400, number(1, whole=True), "size of each token's CBOW vector", paper="d_vec")
    pair_mode: str | None = option(None, one_of(*PAIR_MODES, optional=True), "sentence pairs: both encoded "
                                   "together, or each alone and combined (diffcat: a task of pairs only)",
                                   default_text="diffcat for pairs",
                                   paper="DiffCat")
    head: str | None = option(None, one_of(*HEADS, optional=True), "the classifier over the sentence embedding "
                              "(a tagger's at each token: linear or mlp)", default_text="mlp; linear for tags")
    dropout: float = option(0.1, number(0, below=1), "dropout on the embeddings")
    head_dropout: float = option(0.2, number(0, below=1), "dropout in the head")
    kd_weight: float = option(0.5, number(0, 1), "weight of the KD term (1 - kd_weight on the task's own "
                              "loss)", flag=True, steps=("pretrain",))
    temperature: float = option(1.0, number(above=0), "softmax temperature of the KD loss", paper="T", flag=True,
                                steps=("pretrain",))
    bin_width: float = option(0.2, number(above=0), "regression: width of the score bins classified over")
    vectors: str | None = option(None, one_of(*VECTOR_STARTS, optional=True), "where the CBOW vectors start: "
                                 "random, or the teacher's static token vectors (each vocabulary token through the "
                                 "teacher, PCA to vector_dim, SIF-weighted on the run's text: method static's table)",
                                 default_text="static for an embedder, else random")
    init: str | None = option(None, text(optional=True), "a general-distilled CMOW encoder (`distillery cmow "
                              "pretrain`'s <out>/model) the student starts from")
    augment: int = augment_option()
    train_examples: str = option("all", one_of("all", "budget"), "all: the whole train split, labelled by the "
                                 "teacher; budget: the run's examples (--train-limit)")


Options = CMOWOptions
