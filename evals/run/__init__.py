"""One run in one process: the suite's cells as inspect tasks, one ``eval_set`` (or rounds of
them until a gate is decided), and the summary of what the logs hold."""

from ._decisions import CellState
from ._files import (
    RunOutputError,
    prepare_log_dir,
    refuse_runs_inside,
    write_atomic,
    write_run_file,
)
from ._memory import memory_limit
from ._resume import finished_in
from ._run import RunResult, default_log_dir, run_suite
from ._secrets import (
    check_model_args,
)
from ._sequential import (
    load_decision_gate,
    run_sequential_cli,
    run_until_decided,
    sequential_record,
)
from ._settings import DEFAULT_MAX_RETRIES, DEFAULT_TIMEOUT
from ._signals import EXIT_INTERRUPTED, LAST_INTERRUPT
from ._speedups import (
    GC_THRESHOLDS,
    batch_gc,
    eval_options,
    gc_for_trials,
    no_results_table,
)
from ._summary import (
    ERRORED_IN,
    cell_dict,
    cut_short_cells,
    errored_trials,
    format_table,
    incomplete_fields,
    left_fields,
    prompt_names,
    run_failures,
    run_metadata,
    without_cut_short,
    write_running,
)
from ._tasks import build_tasks, check_models

__all__ = [
    "DEFAULT_MAX_RETRIES",
    "DEFAULT_TIMEOUT",
    "ERRORED_IN",
    "EXIT_INTERRUPTED",
    "GC_THRESHOLDS",
    "LAST_INTERRUPT",
    "CellState",
    "RunOutputError",
    "RunResult",
    "batch_gc",
    "build_tasks",
    "cell_dict",
    "check_model_args",
    "check_models",
    "cut_short_cells",
    "default_log_dir",
    "errored_trials",
    "eval_options",
    "finished_in",
    "format_table",
    "gc_for_trials",
    "incomplete_fields",
    "left_fields",
    "load_decision_gate",
    "memory_limit",
    "no_results_table",
    "prepare_log_dir",
    "prompt_names",
    "refuse_runs_inside",
    "run_failures",
    "run_metadata",
    "run_sequential_cli",
    "run_suite",
    "run_until_decided",
    "sequential_record",
    "without_cut_short",
    "write_atomic",
    "write_run_file",
    "write_running",
]
