"""The twice CLI, the suite matrix, the release gate, and ``twice serve``."""

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
from ._run import RunResult, build_tasks, run_metadata, run_suite
from ._secrets import check_model_args
from ._serve import (
    ControlError,
    ServeError,
    TrialConfig,
    TwiceServer,
    parse_trial_config,
    running_server,
    serve,
)
from ._serve_eval import served_task
from ._serve_log import RequestLog
from ._suite import Cell, Matrix, Suite, SuiteError, load_suite, suite_from_flags
from ._until import CellState, run_until_decided

__all__ = [
    "BaselinePolicy",
    "Cell",
    "CellRates",
    "CellState",
    "Check",
    "ControlError",
    "EvalRates",
    "GateConfig",
    "GateError",
    "GateResult",
    "LocalModelError",
    "LocalModelServer",
    "Matrix",
    "RequestLog",
    "Rule",
    "RunResult",
    "ServeError",
    "ServerOptions",
    "Suite",
    "SuiteError",
    "TrialConfig",
    "TwiceServer",
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
    "parse_trial_config",
    "run_metadata",
    "run_suite",
    "run_until_decided",
    "running_server",
    "serve",
    "served_task",
    "suite_from_flags",
    "trials_needed",
    "trials_table",
    "write_junit",
]
