"""The default offline ``twice run``, as a user runs it: a fresh process and log directory."""

from __future__ import annotations

import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import parallel_ceiling

ROOT = Path(__file__).resolve().parents[1]


def demo(work: Path, extra: list[str]) -> dict[str, Any]:
    """Wall seconds of ``twice run`` (interpreter start to exit) and the CPU seconds it used.

    Runs ``python -m evals.cli`` (the ``twice`` console script's entry point) with this
    interpreter from the repository root, so the code measured is the code checked out.
    """
    work.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="demo-", dir=work) as logs:
        cmd = [sys.executable, "-m", "twice.evals.cli", "run", "--log-dir", logs, *extra]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        w0 = time.perf_counter()
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        wall = time.perf_counter() - w0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if done.returncode != 0:
            raise RuntimeError(
                f"`{' '.join(cmd)}` exited {done.returncode}:\n{done.stderr[-2000:]}"
            )
        summary = json.loads((Path(logs) / "summary.json").read_text(encoding="utf-8"))
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    trials = sum(cell["trials"] for cell in summary["cells"])
    return {"seconds": wall, "cpu_seconds": cpu, "trials": trials, "command": " ".join(cmd[1:])}


def workers(work: Path, extra: list[str], reps: int, rounds: int) -> dict[str, Any]:
    """``twice run --workers 2`` against ``--workers 1``: wall seconds, interleaved pairs.

    Each run is a fresh process, start to exit (imports, the workers' own start-up, the merge
    and the report included): what a user waits for. The speedup is the ratio of the medians.
    Before each pair, :func:`_common.parallel_ceiling` (``rounds``) measures what the machine
    gave perfectly parallel work at that minute; ``efficiency`` is the median over pairs of
    the pair's speedup over its ceiling.
    """
    one: list[dict[str, Any]] = []
    two: list[dict[str, Any]] = []
    ceilings: list[float] = []
    for rep in range(reps):
        ceilings.append(parallel_ceiling(rounds)["ceiling"])
        order = [(one, "1"), (two, "2")] if rep % 2 == 0 else [(two, "2"), (one, "1")]
        for runs, n in order:
            runs.append(demo(work, [*extra, "--workers", n]))
    t1 = statistics.median(r["seconds"] for r in one)
    t2 = statistics.median(r["seconds"] for r in two)
    pairs = [(a["seconds"], b["seconds"]) for a, b in zip(one, two, strict=True)]
    return {
        "one": t1,
        "two": t2,
        "speedup": t1 / t2,
        "cpu_one": statistics.median(r["cpu_seconds"] for r in one),
        "cpu_two": statistics.median(r["cpu_seconds"] for r in two),
        # Each pair's two walls: single pairs' ratios moved 1.38-1.90 in one hour.
        "pairs": pairs,
        "ceilings": ceilings,
        "ceiling": statistics.median(ceilings),
        "efficiency": statistics.median(
            (a / b) / c for (a, b), c in zip(pairs, ceilings, strict=True)
        ),
    }


def agent_cmd(work: Path, limit: int, reps: int) -> dict[str, Any]:
    """What ``--agent-cmd`` costs per trial over twice's own loop: wall and CPU seconds.

    Interleaved pairs of ``twice run`` (a fresh process each, one worker, no report) on
    ``limit`` refund samples under fault ``none`` with ``stub/retry`` (two model calls a
    trial): once with twice's own loop, once with ``docs/examples/http_agent.py`` as the
    agent command. CPU includes every process a run starts (the agent, inspect's bridge
    proxy and the sandbox commands it runs), read from this process's children's usage.
    The figures are medians over pairs of (command run - own-loop run) / trials.
    """
    base = ["--task", "refund", "--fault", "none", "--model", "stub/retry"]
    base += ["--limit", str(limit), "--workers", "1", "--no-report"]
    command = [*base, "--agent-cmd", f"{sys.executable} docs/examples/http_agent.py"]
    pairs = []
    for rep in range(reps):
        order = [base, command] if rep % 2 == 0 else [command, base]
        runs = {id(args): demo(work, args) for args in order}
        own, cmd = runs[id(base)], runs[id(command)]
        trials = cmd["trials"]
        pairs.append(
            {
                "wall": (cmd["seconds"] - own["seconds"]) / trials,
                "cpu": (cmd["cpu_seconds"] - own["cpu_seconds"]) / trials,
                "cpu_ratio": cmd["cpu_seconds"] / own["cpu_seconds"],
                "runs": [own["seconds"], own["cpu_seconds"], cmd["seconds"], cmd["cpu_seconds"]],
            }
        )
    return {
        "extra_seconds_per_trial": statistics.median(p["wall"] for p in pairs),
        "extra_cpu_seconds_per_trial": statistics.median(p["cpu"] for p in pairs),
        "cpu_ratio": statistics.median(p["cpu_ratio"] for p in pairs),
        "trials": limit,
        "pairs": [p["runs"] for p in pairs],
    }
