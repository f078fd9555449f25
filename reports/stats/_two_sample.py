"""Two independent proportions: their difference with an interval, and Fisher's exact test."""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np

from ._intervals import ALPHA


@dataclass(frozen=True)
class Difference:
    """``rate - rate_ref`` with its interval and the p-value of "no difference"."""

    rate_ref: float
    rate: float
    diff: float
    ci: tuple[float, float]
    p_value: float

    @property
    def significant(self) -> bool:
        """Whether the score test rejects "no difference" at the 5 % level."""
        return not math.isnan(self.p_value) and self.p_value < ALPHA


def difference(k: int, n: int, k_ref: int, n_ref: int, alpha: float = ALPHA) -> Difference:
    """Compare ``k`` of ``n`` against ``k_ref`` of ``n_ref`` (two independent samples).

    The interval is Newcombe's hybrid score interval for the difference (statsmodels'
    ``confint_proportions_2indep(method="newcomb")``), the p-value the two-sided score test
    of equal proportions (``test_proportions_2indep(method="score")``).

    Returns NaNs when either side has no trials. When both sides are all-0 or all-1 the
    score statistic is 0/0; the observed difference is then exactly 0 and the p-value is 1.
    """
    if n == 0 or n_ref == 0:
        nan = math.nan
        return Difference(
            k_ref / n_ref if n_ref else nan, k / n if n else nan, nan, (nan, nan), nan
        )
    # Imported here, not with the module: scipy.stats and statsmodels cost 0.8 s of import
    # that a run's workers and a gate without --baseline never need (see prepare_report).
    from statsmodels.stats.proportion import confint_proportions_2indep, test_proportions_2indep

    with warnings.catch_warnings(), np.errstate(divide="ignore", invalid="ignore"):
        # statsmodels also computes ratio and odds ratio, which divide by zero at 0 % / 100 %.
        warnings.simplefilter("ignore", RuntimeWarning)
        lo, hi = confint_proportions_2indep(
            k, n, k_ref, n_ref, method="newcomb", compare="diff", alpha=alpha
        )
        p = float(
            test_proportions_2indep(k, n, k_ref, n_ref, method="score", compare="diff").pvalue
        )
    if math.isnan(p) and k * n_ref == k_ref * n:
        p = 1.0
    return Difference(k_ref / n_ref, k / n, k / n - k_ref / n_ref, (float(lo), float(hi)), p)


def fisher_tails(k: int, n: int, k_ref: int, n_ref: int) -> tuple[float, float]:
    """Fisher's exact test of ``k`` of ``n`` against ``k_ref`` of ``n_ref``, both one-sided.

    It conditions on the margins and computes the tail exactly, so its false-alarm rate stays
    at or below ``alpha`` at the small counts and extreme rates of a cell (where the normal
    approximation of a z or score test is poor).

    Args:
        k, n: Events and trials in the sample tested (``n > 0``).
        k_ref, n_ref: The same in the reference sample (``n_ref > 0``).

    Returns:
        ``(p_higher, p_lower)``: the p-values of "the rate is higher than the reference" and
        of "it is lower".
    """
    from scipy.stats import fisher_exact  # on first use: see difference

    table = [[k, n - k], [k_ref, n_ref - k_ref]]
    p_higher = float(fisher_exact(table, alternative="greater")[1])
    p_lower = float(fisher_exact(table, alternative="less")[1])
    return p_higher, p_lower
