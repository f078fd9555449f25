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
        "BaselinePolicy", "Cell", "CellRates", "CellState", "Check", "EvalRates", "GateConfig",
        "GateError", "GateResult", "LocalModelError", "LocalModelServer", "Matrix", "Rule",
        "RunResult", "ServerOptions", "Suite", "SuiteError", "build_tasks", "check_model_args",
        "eval_rates", "evaluate_gate", "format_gate", "install_local_model", "junit_xml",
        "load_gate", "load_suite", "local_model_server", "model_home", "parse_gate",
        "run_metadata", "run_suite", "run_until_decided", "suite_from_flags", "trials_needed",
        "trials_table", "write_junit",
    ]  # fmt: skip
