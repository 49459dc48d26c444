"""Options of method ``static`` (:mod:`distillery.static.recipe`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from distillery.method import MethodOptions, flag, number, option

# SIF's a in a / (a + p(token)) for an embedder's static vectors: this method's default and an embedder run's
# static-embedding baseline (distillery.live_baselines)
EMBEDDER_SIF = 1e-4


@dataclass
class StaticOptions(MethodOptions):
    METHOD: ClassVar[str] = "static"
    pca_dims: int | None = option(256, number(1, whole=True, optional=True), "width of the token vectors after PCA "
                                  "(unset: the teacher's width)", paper="pca_dims")
    sif: float | None = option(EMBEDDER_SIF, number(above=0, below=1, optional=True), "SIF weight a / (a + p(token)), p "
                               "counted on the run's text (unset: a plain mean)", paper="sif_coefficient")
    fine_tune: bool = option(True, flag(), "train the token vectors on the teacher's sentence vectors of the run's "
                             "text (false: model2vec's vectors as they are)")


Options = StaticOptions
