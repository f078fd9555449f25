"""``evals``'s public surface is pinned: sorted, and every name importable."""

from __future__ import annotations

from types import ModuleType

from twice import evals


def test_evals_api_all_is_sorted_and_complete() -> None:
    assert evals.__all__ == sorted(evals.__all__)
    public = {
        n for n, v in vars(evals).items() if not n.startswith("_") and not isinstance(v, ModuleType)
    }
    assert set(evals.__all__) == public
    assert evals.__all__ == [
        "BaselinePolicy", "Cell", "CellRates", "CellState", "Check", "ControlError", "EvalRates",
        "GateConfig", "GateError", "GateResult", "LocalModelError", "LocalModelServer", "Matrix",
        "RequestLog", "Rule", "RunError", "RunResult", "ServeError", "ServerOptions", "Suite",
        "SuiteError", "TrialConfig", "TwiceError", "TwiceServer", "UsageError", "build_tasks",
        "check_model_args",
        "eval_rates", "evaluate_gate", "format_gate", "install_local_model", "junit_xml",
        "load_gate", "load_suite", "local_model_server", "model_home", "parse_gate",
        "parse_trial_config", "run_metadata", "run_suite", "run_until_decided",
        "running_server", "serve", "served_task", "suite_from_flags", "trials_needed",
        "trials_table", "write_junit",
    ]  # fmt: skip
