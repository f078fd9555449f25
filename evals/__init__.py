"""The twice CLI, the suite matrix and the release gate."""

from ._rates import CellRates, EvalRates, eval_rates

__all__ = [
    "CellRates",
    "EvalRates",
    "eval_rates",
]
