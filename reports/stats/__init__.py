"""The statistics of twice, in one place: pure functions on counts and outcome arrays.

- intervals: :func:`wilson` (the report's and the fixed gate's 95 % interval of a rate);
- two samples: :func:`difference` (Newcombe's interval and the score test, prompt vs
  prompt) and :func:`fisher_tails` (Fisher's exact test, a run vs its baseline);
- :func:`pass_hat_k`: τ-bench's pass^k estimator (the report's ``no_dup^k``);
- anytime-valid bounds: a betting confidence sequence (:func:`bounds`, :func:`proves`,
  :func:`log_wealth`), and the simulations that check it (:func:`simulate_max_rule`,
  :func:`peeking_wilson_false_pass`);
- :func:`trials_needed`: how many trials a Wilson bound needs.

Nothing here reads a trial frame, a metric or a gate rule: ``twice.reports`` and
``twice.evals.gate`` apply these to their frames and rules, and say what they mean.
"""

from ._intervals import ALPHA, alpha_of, wilson, wilson_bounds, wilson_many
from ._pass_k import pass_hat_k
from ._power import MIN_RATE, trials_needed
from ._sequential import (
    GRID,
    METHOD,
    TRUNCATION,
    Bounds,
    Side,
    Simulated,
    bounds,
    log_wealth,
    peeking_wilson_false_pass,
    proves,
    simulate_max_rule,
)
from ._two_sample import Difference, difference, fisher_tails

__all__ = [
    "ALPHA",
    "GRID",
    "METHOD",
    "MIN_RATE",
    "TRUNCATION",
    "Bounds",
    "Difference",
    "Side",
    "Simulated",
    "alpha_of",
    "bounds",
    "difference",
    "fisher_tails",
    "log_wealth",
    "pass_hat_k",
    "peeking_wilson_false_pass",
    "proves",
    "simulate_max_rule",
    "trials_needed",
    "wilson",
    "wilson_bounds",
    "wilson_many",
]
