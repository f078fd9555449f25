"""Where ``overhead_ratio``'s extra CPU goes: twice's trial vs the bare trial, part by part.

    python bench/overhead_parts.py [--epochs 4] [--reps 3]

The same two evals as ``overhead_ratio`` (bench/_trials.py), run one sample at a time so
that the CPU time between a coroutine's start and end is that coroutine's own, with a few of
inspect's functions wrapped in CPU timers. Prints, per trial, each part's CPU for both evals
and the difference. A profiler attributes time badly here (it inflates pydantic and deepcopy
several times over); these are unprofiled process-CPU figures.

The wrapped functions are inspect internals (0.3.285); a name inspect no longer has is
skipped with a note, so the script degrades rather than breaks.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import importlib
import time
from pathlib import Path
from typing import Any

import _trials  # bench/ is the script's directory, so on sys.path
from twice.evals.run import gc_for_trials, no_results_table

PARTS = (
    ("inspect_ai._eval.task.run", "log_sample", "condense and write the sample"),
    ("inspect_ai.model._call_tools", "call_tool", "run the tool call"),
    ("inspect_ai.solver._transcript", "state_jsonable", "snapshot the state per solver"),
    ("inspect_ai.log._transcript", "store_jsonable", "snapshot the store per span"),
    ("inspect_ai.log._transcript", "store_changes", "diff the store per span"),
    ("inspect_ai._eval.task.run", "eval_results", "eval metrics"),
)

_spent: dict[str, float] = {}


def _wrap(module_name: str, name: str) -> bool:
    module = importlib.import_module(module_name)
    fn = getattr(module, name, None)
    if fn is None:
        return False
    if asyncio.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def timed_async(*args: Any, **kwargs: Any) -> Any:
            t = time.process_time()
            try:
                return await fn(*args, **kwargs)
            finally:
                _spent[name] = _spent.get(name, 0.0) + time.process_time() - t

        setattr(module, name, timed_async)
    else:

        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            t = time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                _spent[name] = _spent.get(name, 0.0) + time.process_time() - t

        setattr(module, name, timed)
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--work", type=Path, default=Path("bench/out/work"))
    args = parser.parse_args()
    wrapped = []
    for module, name, what in PARTS:
        if _wrap(module, name):
            wrapped.append((name, what))
        else:
            print(f"note: {module}.{name} not found in this inspect; skipped")
    with (
        no_results_table("none"),
        _trials.scratch_dir(args.work, "parts") as logs,
        gc_for_trials(),
    ):
        bare, twice = _trials.overhead_runners(args.epochs, logs, max_connections=1)
        runs = {"twice": twice, "bare": bare}
        for run in runs.values():
            run()  # warm-up
        per_trial: dict[str, dict[str, float]] = {k: {} for k in runs}
        for _ in range(args.reps):
            for side, run in runs.items():
                _spent.clear()
                t = time.process_time()
                log = run()
                total = time.process_time() - t
                n = (log.results.completed_samples if log.results else 0) * args.reps
                into = per_trial[side]
                into["total"] = into.get("total", 0.0) + total * 1e3 / n
                for name, seconds in _spent.items():
                    into[name] = into.get(name, 0.0) + seconds * 1e3 / n
    twice, bare = per_trial["twice"], per_trial["bare"]
    print(f"{'part':48s} {'twice':>7s} {'bare':>7s} {'extra':>7s}  (ms CPU per trial)")
    shown = 0.0
    for name, what in [("total", "the whole eval, per trial"), *wrapped]:
        a, b = twice.get(name, 0.0), bare.get(name, 0.0)
        if name != "total":
            shown += a - b
        print(f"{what + ' (' + name + ')':48s} {a:7.2f} {b:7.2f} {a - b:7.2f}")
    rest = twice["total"] - bare["total"] - shown
    print(f"{'everything else':48s} {'':7s} {'':7s} {rest:7.2f}")
    print(f"ratio {twice['total'] / bare['total']:.3f} (one sample at a time)")


if __name__ == "__main__":
    main()
