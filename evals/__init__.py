"""The twice CLI, the suite matrix, the release gate, and ``twice serve``.

A facade over sub-packages with one job each (``docs/architecture.md`` draws them): ``suite``
(what to run), ``run`` (one process), ``scale`` (``--workers``), ``gate``, ``serve`` and
``local_model``.
"""

import gc as _gc

# The imports below load inspect_ai, pandas and every twice package: about 200,000 objects
# that live as long as the process, and next to no garbage. The collector's passes over them
# while they load (some 500) cost about 0.1 s of every `twice` process's start-up, so it
# pauses until they are loaded, and resumes as the host had it. Resumed plainly, its first
# young collection would walk all 200,000 at once (0.2 s more): they go straight to the
# oldest generation instead (freeze, then thaw into it), unless the host keeps objects
# frozen itself, which a thaw would release.
_collecting = _gc.isenabled()
_gc.disable()
try:
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
finally:
    if _collecting and _gc.get_freeze_count() == 0:
        _gc.freeze()
        _gc.enable()
        _gc.unfreeze()
    elif _collecting:
        _gc.enable()
    del _collecting

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
