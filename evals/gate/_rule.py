"""A gate rule: one threshold on one metric's statistic, in every cell it matches."""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

STATISTICS = ("point", "lower", "upper")

Statistic = Literal["point", "lower", "upper"]


@dataclass(frozen=True)
class Rule:
    """One threshold: ``statistic(metric) <= max`` (or ``>= min``) in every matching cell."""

    name: str
    metric: str
    bound: float
    direction: Literal["max", "min"]
    statistic: Statistic
    min_trials: int = 1
    filters: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Cell axis (``model``, ``prompt``...) → glob patterns; a cell must match one per axis."""

    def matches(self, cell: Mapping[str, Any]) -> bool:
        """Whether the rule applies to a cell (a mapping with the :data:`CELL` keys)."""
        return all(
            any(fnmatch.fnmatchcase(str(cell[axis]), pat) for pat in pats)
            for axis, pats in self.filters.items()
        )
