"""The release gate: rules on measured rates under fixed-sample (Wilson, Fisher) or
anytime-valid (sequential) bounds, its verdict, JUnit XML, and the trials a rule needs."""

from ._gate import (
    BaselinePolicy,
    Check,
    GateConfig,
    GateError,
    GateResult,
    cell_label,
    evaluate_gate,
    format_gate,
    junit_xml,
    load_gate,
    parse_gate,
    write_junit,
)
from ._power import DEFAULT_RATES, trials_needed, trials_table
from ._rule import STATISTICS, Rule, Statistic
from ._sequential import METHOD, describe
from ._sequential_rules import RuleState, rule_state

__all__ = [
    "DEFAULT_RATES",
    "METHOD",
    "STATISTICS",
    "BaselinePolicy",
    "Check",
    "GateConfig",
    "GateError",
    "GateResult",
    "Rule",
    "RuleState",
    "Statistic",
    "cell_label",
    "describe",
    "evaluate_gate",
    "format_gate",
    "junit_xml",
    "load_gate",
    "parse_gate",
    "rule_state",
    "trials_needed",
    "trials_table",
    "write_junit",
]
