"""Side-effect assertions over a ledger, and the inspect scorer that applies them."""

from ._inspect import EndStateCheck, side_effects
from ._metrics import METRICS, Intent, IntentResult, TrialMetrics, trial_metrics

__all__ = [
    "METRICS",
    "EndStateCheck",
    "Intent",
    "IntentResult",
    "TrialMetrics",
    "side_effects",
    "trial_metrics",
]
