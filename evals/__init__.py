"""The twice CLI, the suite matrix, the release gate, and ``twice serve``.

A facade over sub-packages with one job each (``docs/architecture.md`` draws them): ``suite``
(what to run), ``run`` (one process), ``scale`` (``--workers``), ``gate``, ``serve`` and
``local_model``.
"""

from twice.mocks import RunError, TwiceError, UsageError

from ._rates import CellRates, EvalRates, eval_rates
from .gate import (
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
    trials_needed,
    trials_table,
    write_junit,
)
from .local_model import (
    LocalModelError,
    LocalModelServer,
    ServerOptions,
    local_model_server,
    model_home,
)
from .local_model import install as install_local_model
from .run import (
    CellState,
    RunResult,
    build_tasks,
    check_model_args,
    run_metadata,
    run_suite,
    run_until_decided,
)
from .serve import (
    ControlError,
    RequestLog,
    ServeError,
    TrialConfig,
    TwiceServer,
    parse_trial_config,
    running_server,
    serve,
    served_task,
)
from .suite import Cell, Matrix, Suite, SuiteError, load_suite, suite_from_flags

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
    "RunError",
    "RunResult",
    "ServeError",
    "ServerOptions",
    "Suite",
    "SuiteError",
    "TrialConfig",
    "TwiceError",
    "TwiceServer",
    "UsageError",
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
