"""The twice CLI, the suite matrix and the release gate."""

from ._gate import (
    BaselinePolicy,
    Check,
    GateConfig,
    GateError,
    GateResult,
    Rule,
    evaluate_gate,
    format_gate,
    junit_xml,
    load_gate,
    parse_gate,
    write_junit,
)
from ._power import trials_needed, trials_table
from ._rates import CellRates, EvalRates, eval_rates
from ._run import RunResult, build_tasks, check_model_args, run_metadata, run_suite
from ._suite import Cell, Matrix, Suite, SuiteError, load_suite, suite_from_flags

__all__ = [
    "BaselinePolicy",
    "Cell",
    "CellRates",
    "Check",
    "EvalRates",
    "GateConfig",
    "GateError",
    "GateResult",
    "Matrix",
    "Rule",
    "RunResult",
    "Suite",
    "SuiteError",
    "build_tasks",
    "check_model_args",
    "eval_rates",
    "evaluate_gate",
    "format_gate",
    "junit_xml",
    "load_gate",
    "load_suite",
    "parse_gate",
    "run_metadata",
    "run_suite",
    "suite_from_flags",
    "trials_needed",
    "trials_table",
    "write_junit",
]
