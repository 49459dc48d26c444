"""Options of the toy method: the command line, ``--option`` checks and validation are generated from them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from distillery.method import MethodOptions, number, option


@dataclass
class ToyOptions(MethodOptions):
    METHOD: ClassVar[str] = "toy"

    keep_layers: int = option(1, number(1, whole=True), "teacher layers the toy student keeps, from the bottom",
                              flag=True)


Options = ToyOptions
