"""Shared helpers of the benchmarks: paired timing with garbage accounting, and the machine.

Ratios are measured side by side in one process: each repetition runs the baseline and the
subject back to back (alternating which goes first), on this process's CPU time, and the
figure is the median of the per-repetition ratios (:meth:`Paired.ratio`).

The garbage collector makes single runs lumpy: a full collection walks every live object
(~0.5 s with inspect loaded) and lands in whichever run happens to cross the threshold. So,
after the warm-up, everything alive is frozen out of the collector's reach (``gc.freeze``),
and every timed run ends with a collection that is timed with it: each run pays for
collecting its own garbage, and nothing else's.
"""

from __future__ import annotations

import gc
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

LIBRARIES = (
    "twice",
    "inspect_ai",
    "httpx",
    "respx",
    "pandas",
    "pyarrow",
    "numpy",
    "pydantic",
    "statsmodels",
    "jinja2",
)


@dataclass
class Sample:
    """One timed run: wall and CPU seconds of this process."""

    wall: float
    cpu: float


def timed(fn: Callable[[], Any], collect: bool = False) -> tuple[Sample, Any]:
    """Run ``fn`` once; its wall time and this process's CPU time (all threads).

    With ``collect``, a garbage collection after ``fn`` is part of the time.
    """
    w0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    if collect:
        gc.collect()
    return Sample(time.perf_counter() - w0, time.process_time() - c0), out


@dataclass
class Paired:
    """Interleaved runs of a baseline and a subject."""

    baseline: list[Sample] = field(default_factory=list)
    subject: list[Sample] = field(default_factory=list)

    def ratio(self, clock: str = "cpu") -> float:
        """Subject / baseline on ``clock`` (``cpu`` or ``wall``): the median per-pair ratio.

        A pair's two runs are back to back and take turns going first, so a slow stretch of
        a shared machine is as likely to fall on either side and the per-pair ratios scatter
        around the true one; such a stretch makes one pair an outlier (1.68 against a median
        near 1.08 in one run on the reference machine), which the median ignores and a sum
        weighs in full. Each run pays for collecting its own garbage, so no cost of the code
        itself is left to a few runs. :meth:`total_ratio` is the sum-based figure.
        """
        return statistics.median(self.pair_ratios(clock))

    def median_interval(self, clock: str = "cpu", level: float = 0.95) -> tuple[float, float]:
        """A distribution-free ``level`` interval for the median per-pair ratio: the order
        statistics between which a Binomial(n, 1/2) count of pairs below the true median
        puts it (the sign test's interval). How far the figure can move between runs of the
        same code: 21 pairs' medians moved 1.055-1.155 within one session."""
        from scipy.stats import binom

        ratios = sorted(self.pair_ratios(clock))
        k = int(binom.ppf((1 - level) / 2, len(ratios), 0.5))  # 1-based rank of the bound
        if k < 1:  # too few pairs for the level
            return ratios[0], ratios[-1]
        return ratios[k - 1], ratios[len(ratios) - k]

    def total_ratio(self, clock: str = "cpu") -> float:
        """Total subject seconds over total baseline seconds on ``clock`` (a sum, which one slow
        round can dominate; printed beside the median)."""
        base = sum(float(getattr(b, clock)) for b in self.baseline)
        subject = sum(float(getattr(s, clock)) for s in self.subject)
        return subject / base

    def pair_ratios(self, clock: str = "cpu") -> list[float]:
        """Subject / baseline per repetition (their spread shows the noise)."""
        return [
            float(getattr(s, clock)) / float(getattr(b, clock))
            for b, s in zip(self.baseline, self.subject, strict=True)
        ]

    def median(self, which: str, clock: str = "cpu") -> float:
        """Median seconds of ``which`` (``baseline`` or ``subject``) on ``clock``."""
        return statistics.median(float(getattr(s, clock)) for s in getattr(self, which))


def paired(
    baseline: Callable[[], Any],
    subject: Callable[[], Any],
    reps: int,
    warmup: int = 1,
    self_timed: bool = False,
) -> Paired:
    """Run both ``warmup`` times untimed, then ``reps`` timed pairs in alternating order.

    Each timed run includes collecting its garbage, with everything alive before the timed
    runs frozen out of the collector (see the module docstring). With ``self_timed`` the
    callables time themselves and return a :class:`Sample` (for work whose setup must stay
    outside the clock); their garbage is still collected before the next run.
    """
    for _ in range(warmup):
        baseline()
        subject()
    gc.collect()
    gc.freeze()
    out = Paired()
    try:
        for i in range(reps):
            order = ((baseline, out.baseline), (subject, out.subject))
            for fn, sink in order if i % 2 == 0 else reversed(order):
                if self_timed:
                    sink.append(fn())
                    gc.collect()
                else:
                    sink.append(timed(fn, collect=True)[0])
    finally:
        gc.unfreeze()
    return out


def steal_seconds() -> float | None:
    """CPU seconds the hypervisor gave other guests while this machine's CPUs wanted to run
    (``steal`` in ``/proc/stat``, all CPUs), since boot; None where that is not readable.

    On a shared virtual machine this is where a slow hour goes: a rise of a few seconds over
    a run marks its figures as measured in a contended hour (docs/BENCHMARKS.md)."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            fields = f.readline().split()
        return int(fields[8]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):  # not Linux, or a kernel without the field
        return None


def _busy(rounds: int) -> None:
    """Fixed interpreter work, no I/O: small dicts, strings and lists, like a trial's."""
    for _ in range(rounds):
        rows = [{"id": i, "key": str(i), "args": [i, i + 1, i + 2]} for i in range(20_000)]
        "".join(row["key"] for row in rows[::10])


def parallel_ceiling(rounds: int) -> dict[str, float]:
    """What this machine gives two processes of perfectly parallel work: the wall of
    :func:`_busy` run twice in this process over its wall run once in each of two forked ones.

    2.0 on two idle cores. On a shared virtual machine it is whatever the host lets the
    second core do at that minute: in the hour it was first measured here the guest saw no
    steal and each process its full CPU time, yet a CPU-second did less work while the other
    core was busy (1.27 to 2.4 over that hour for this loop). Single samples are noisy (above
    2.0 at times), so the one-process runs come one before and one after the two-process run,
    which cancels a steady drift. ``twice run --workers 2`` cannot beat it; the workers
    benchmark samples it before every pair so its speedup reads against the hour it ran in.

    Raises:
        RuntimeError: when a forked child failed (its traceback is on stderr).
    """
    t0 = time.perf_counter()
    _busy(rounds)
    sequential = time.perf_counter() - t0
    t0 = time.perf_counter()
    children: list[int] = []
    try:
        for _ in range(2):
            pid = os.fork()
            if pid == 0:  # the child: the work, then out without the parent's atexit or flush
                code = 1
                try:
                    _busy(rounds)
                    code = 0
                except BaseException:
                    import traceback

                    traceback.print_exc()
                finally:
                    os._exit(code)
            children.append(pid)
    finally:  # a failed second fork still reaps the first child
        codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in children]
    parallel = time.perf_counter() - t0
    if any(codes):
        raise RuntimeError(f"parallel_ceiling: a forked child exited {codes}")
    t0 = time.perf_counter()
    _busy(rounds)
    sequential += time.perf_counter() - t0
    return {"sequential": sequential, "parallel": parallel, "ceiling": sequential / parallel}


REPO = Path(__file__).resolve().parent.parent


def code_revision(root: Path = REPO) -> dict[str, Any] | None:
    """The commit the figures describe, and whether tracked files differed from it
    (``modified``); None outside a git checkout. results.json is read long after the run,
    and the figures mean little without the code they measured."""
    try:
        commit, status = (
            subprocess.run(
                ["git", *args], cwd=root, capture_output=True, text=True, check=True, timeout=30
            ).stdout
            for args in (["rev-parse", "HEAD"], ["status", "--porcelain", "--untracked-files=no"])
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": commit.strip(), "modified": bool(status.strip())}


def machine_info(mode: str) -> dict[str, Any]:
    """Cores, Python, library versions, load and the code's revision: what the figures
    depend on."""
    libs: dict[str, str | None] = {}
    for name in LIBRARIES:
        try:
            libs[name] = version(name)
        except PackageNotFoundError:
            libs[name] = None
    return {
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "libraries": libs,
        "load_average_at_start": list(os.getloadavg()),
        "mode": mode,
        "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
        "revision": code_revision(),
    }
