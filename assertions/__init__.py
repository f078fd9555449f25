"""Side-effect assertions over a ledger, and the inspect scorers that apply them.

An assertion is any object with ``check(ledger) -> Verdict`` (:class:`Assertion`): the built-in
:func:`exactly`, :func:`at_most`, :func:`at_least`, :func:`never`, :func:`compensated` and
:func:`no_unseen_effects`, or your own. :func:`assert_side_effects` raises one AssertionError
listing every failed verdict with the ledger lines behind it. The pytest plugin
(``twice.assertions.pytest_plugin``) is loaded explicitly, never from here.
"""

from ._checks import (
    Assertion,
    Compensated,
    Count,
    NoUnseenEffects,
    assert_side_effects,
    at_least,
    at_most,
    check_all,
    compensated,
    exactly,
    never,
    no_unseen_effects,
    parse_assertion,
    parse_assertions,
)
from ._inspect import EndStateCheck, score_trial, side_effect_assertions, side_effects
from ._metrics import METRICS, EffectFacts, Intent, IntentResult, TrialMetrics, trial_metrics
from ._verdict import Verdict, describe_attempt

__all__ = [
    "METRICS",
    "Assertion",
    "Compensated",
    "Count",
    "EffectFacts",
    "EndStateCheck",
    "Intent",
    "IntentResult",
    "NoUnseenEffects",
    "TrialMetrics",
    "Verdict",
    "assert_side_effects",
    "at_least",
    "at_most",
    "check_all",
    "compensated",
    "describe_attempt",
    "exactly",
    "never",
    "no_unseen_effects",
    "parse_assertion",
    "parse_assertions",
    "score_trial",
    "side_effect_assertions",
    "side_effects",
    "trial_metrics",
]
