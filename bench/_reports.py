"""Building the report from logs vs reading the same logs with inspect's ``samples_df``.

"Building the report" is what ``twice run`` does after the evals: logs → trial frame →
per-cell table → ``summary.json`` and ``report.html``. The floor is inspect reading the same
logs into a frame with its default columns.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import Paired, paired
from inspect_ai.analysis import samples_df
from twice.evals import run_metadata
from twice.evals.suite._load import DEFAULT_SUITE, load_suite
from twice.reports import cells, trials_frame, write_report, write_summary


def build_report(log_dir: Path, out: Path) -> int:
    """Everything ``twice run`` does after its evals; returns the number of trials."""
    frame = trials_frame(log_dir)
    run = run_metadata(load_suite(DEFAULT_SUITE))
    write_summary(cells(frame), out / "summary.json", run=run)
    write_report(frame, out / "report.html", run=run)
    return len(frame)


def read_logs(log_dir: Path) -> int:
    """The floor: inspect's own reader, default columns."""
    return len(samples_df(str(log_dir), quiet=True))


def report_vs_read(log_dir: Path, reps: int) -> tuple[float, Paired]:
    """Report building vs reading, interleaved in this process."""
    with tempfile.TemporaryDirectory() as out:
        result = paired(lambda: read_logs(log_dir), lambda: build_report(log_dir, Path(out)), reps)
    return result.ratio(), result


def child(kind: str, log_dir: Path) -> dict[str, Any]:
    """Run one of the two in a fresh process: seconds and peak resident memory.

    Peak memory is the process's maximum resident set, interpreter and imported libraries
    included; ``base_mb`` is that figure before the work starts.
    """
    out = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("run.py")), "--child", kind, str(log_dir)],
        check=True,
        capture_output=True,
        text=True,
    )
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def peak_mb() -> float:
    """This process's peak resident memory so far, in MiB.

    Linux's ``VmHWM`` starts afresh at exec; ``ru_maxrss`` does not (a child started from a
    big parent inherits the parent's figure), so it is only the fallback.
    """
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child_main(kind: str, log_dir: str) -> None:
    """The body of :func:`child`, run by ``run.py --child``."""
    base = peak_mb()
    w0 = time.perf_counter()
    if kind == "report":
        with tempfile.TemporaryDirectory() as out:
            trials = build_report(Path(log_dir), Path(out))
    elif kind == "read":
        trials = read_logs(Path(log_dir))
    else:
        raise ValueError(f"unknown child benchmark {kind!r}; expected report or read")
    seconds = time.perf_counter() - w0
    peak = peak_mb()
    print(json.dumps({"trials": trials, "seconds": seconds, "peak_mb": peak, "base_mb": base}))
