"""Instructions per trial under cachegrind: ``overhead_ratio`` and ``fault_ratio``, noise-free.

On the 2-core reference machine a CPU-time ratio moves by ±10% from one run to the next
(docs/BENCHMARKS.md), more than the changes worth making. Instruction counts do not move:
this script runs the evals of the two figures under ``valgrind --tool=cachegrind`` and
prints instructions per trial and their ratios. Repeats agree within 1-2%. It prices the
code, not the machine: memory stalls, which a contended machine makes dearer, are not in it,
so it complements ``bench/run.py`` and does not replace it.

Each variant runs in two processes, one with ``K`` timed evals after two warm-ups and one
with none; the difference over ``K x 24`` trials is what one trial costs, imports and
warm-up excluded. ``python bench/instructions.py`` (needs valgrind; about 8 minutes on 2
cores); ``--only bare,twice`` for some variants.
"""

from __future__ import annotations

import argparse
import gc
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
TRIALS_PER_EVAL = 24
VARIANTS = {
    "bare": "bare inspect trial (the overhead_ratio baseline)",
    "twice": "twice refund trial, stub/retry, fault none (overhead_ratio)",
    "none": "twice refund trial, stub/no-retry, fault none (fault_ratio baseline)",
    "lost": "twice refund trial, stub/no-retry, fault lost_reply (fault_ratio)",
}
RATIOS = {"overhead_ratio": ("twice", "bare"), "fault_ratio": ("lost", "none")}


def _child(variant: str, evals: int, work: Path) -> None:
    """Run ``evals`` evals of ``variant`` after two warm-ups (inside cachegrind)."""
    sys.path.insert(0, str(HERE))
    import _trials
    from twice.evals._run import gc_for_trials, no_results_table

    with (
        _trials.scratch_dir(work, f"instr-{variant}") as logs,
        gc_for_trials(),
        no_results_table("none"),
    ):
        # The very evals bench/run.py times for the two figures, one epoch each.
        bare, twice = _trials.overhead_runners(1, logs)
        none, lost = _trials.fault_runners(1, logs)
        run = {"bare": bare, "twice": twice, "none": none, "lost": lost}[variant]
        for _ in range(2 + evals):
            run()
            gc.collect()
    # How many evals ran is in argv; the parent reads cachegrind's total.


def _instructions(variant: str, evals: int, work: Path) -> int:
    cmd = [
        "valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null",
        sys.executable, __file__, "--child", variant, str(evals), "--work", str(work),
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True)
    m = re.search(r"I\s+refs:\s+([\d,]+)", done.stderr)
    if done.returncode != 0 or not m:
        raise RuntimeError(f"{' '.join(cmd)} exited {done.returncode}:\n{done.stderr[-2000:]}")
    return int(m[1].replace(",", ""))


def per_trial(variant: str, evals: int, work: Path) -> float:
    """Instructions of one trial of ``variant``: (K evals - 0 evals) / (K x 24)."""
    with ThreadPoolExecutor(2) as pool:
        with_k = pool.submit(_instructions, variant, evals, work)
        without = pool.submit(_instructions, variant, 0, work)
        return (with_k.result() - without.result()) / (evals * TRIALS_PER_EVAL)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--evals", type=int, default=4, help="timed evals per variant")
    parser.add_argument("--only", help=f"comma-separated variants of: {', '.join(VARIANTS)}")
    parser.add_argument("--work", type=Path, default=HERE / "out")
    parser.add_argument("--child", nargs=2, metavar=("VARIANT", "EVALS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.child[0], int(args.child[1]), args.work)
        return
    if shutil.which("valgrind") is None:
        sys.exit("error: valgrind is not on PATH (Debian: apt-get install valgrind)")
    wanted = list(VARIANTS) if not args.only else [v.strip() for v in args.only.split(",")]
    unknown = [v for v in wanted if v not in VARIANTS]
    if unknown:
        sys.exit(f"error: unknown variant(s) {', '.join(unknown)}; expected: {', '.join(VARIANTS)}")
    counts: dict[str, float] = {}
    for variant in wanted:
        counts[variant] = per_trial(variant, args.evals, args.work)
        millions = counts[variant] / 1e6
        print(f"{variant:>6}: {millions:6.2f} M instructions/trial  ({VARIANTS[variant]})")
    for name, (subject, base) in RATIOS.items():
        if subject in counts and base in counts:
            print(f"{name}: {counts[subject] / counts[base]:.3f} (instructions)")


if __name__ == "__main__":
    main()
