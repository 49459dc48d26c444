"""The toy method's recipe: the teacher's first ``keep_layers`` layers, copied by distill's helper."""

from __future__ import annotations

from typing import ClassVar

from distillery.distill.recipe import build_student
from distillery.errors import DistilleryError
from distillery.method import Method


class Toy(Method):
    name: ClassVar[str] = "toy"

    def check(self, config, teacher_config) -> None:
        keep = self.options(config).keep_layers
        if keep >= teacher_config.num_hidden_layers:
            raise DistilleryError(f"Option keep_layers must be below the teacher's {teacher_config.num_hidden_layers} "
                                  f"layers, got {keep}.")

    def run(self, ctx):
        keep = self.options(ctx.config).keep_layers
        ctx.notes.append(f"Toy student: the teacher's first {keep} layer(s), untrained.")
        return build_student(ctx.teacher, list(range(keep)))
