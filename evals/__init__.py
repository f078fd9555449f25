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
from ._local import (
    LocalModelError,
    LocalModelServer,
    ServerOptions,
    local_model_server,
    model_home,
)
from ._local import install as install_local_model
from ._power import trials_needed, trials_table
from ._rates import CellRates, EvalRates, eval_rates
from ._run import RunResult, build_tasks, check_model_args, run_metadata, run_suite
from ._suite import Cell, Matrix, Suite, SuiteError, load_suite, suite_from_flags
from ._until import CellState, run_until_decided

__all__ = [
    "BaselinePolicy",
    "Cell",
    "CellRates",
    "CellState",
    "Check",
    "EvalRates",
    "GateConfig",
    "GateError",
    "GateResult",
    "LocalModelError",
    "LocalModelServer",
    "Matrix",
    "Rule",
    "RunResult",
    "ServerOptions",
    "Suite",
    "SuiteError",
    "build_tasks",
    "check_model_args",
    "eval_rates",
    "evaluate_gate",
    "format_gate",
    "install_local_model",
    "junit_xml",
    "load_gate",
    "load_suite",
    "local_model_server",
    "model_home",
    "parse_gate",
    "run_metadata",
    "run_suite",
    "run_until_decided",
    "suite_from_flags",
    "trials_needed",
    "trials_table",
    "write_junit",
]
