"""Elementwise ops (relu, clamp, maximum, ...): the spec's own max/min of pieces of its named
inputs, broadcast; and expressions (expr.py), whose derivation and code are their own."""

from __future__ import annotations

from .base import Kind


def _settings(name: str, ties: str, nan: str) -> None:
    if nan == "each" and name not in ("maximum", "minimum"):
        raise ValueError(f"{name}: NaN rule 'each' is defined for a single max/min (maximum, "
                         f"minimum, windows), not for {name}: nan must be another rule")


ELEMENTWISE = Kind("elementwise", elementwise=True, lowering="elementwise", settings=_settings)
EXPRESSION = Kind("expression", expression=True, derivation="expression", lowering="expression")
