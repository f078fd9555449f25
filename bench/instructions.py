"""Instructions per trial under cachegrind: ``overhead_ratio`` and ``fault_ratio``, noise-free.

On the 2-core reference machine a CPU-time ratio moves by ±10% from one run to the next
(docs/BENCHMARKS.md), more than the changes worth making. Instruction counts do not move:
this script runs the evals of the two figures under ``valgrind --tool=cachegrind`` and
prints instructions per trial and their ratios. Repeats agree within 1-2%. It prices the
code, not the machine: memory stalls, which a contended machine makes dearer, are not in it,
so it complements ``bench/run.py`` and does not replace it.

Each variant runs in two processes, one with ``K`` timed evals after two warm-ups and one
with none; the difference over ``K x`` an eval's trials (the child counts them: 28 per
epoch, the refund dataset) is what one trial costs, imports and
warm-up excluded. ``python bench/instructions.py`` (needs valgrind; about 8 minutes on 2
cores); ``--only bare,twice`` for some variants; ``--epochs 4`` for evals the size
``bench/run.py`` times (four times as long).

``--cache`` also simulates the caches, with the last level the size of one core's L2 (read
from ``/sys``; ``--ll SIZE,ASSOC,LINE`` to choose), and prints its misses per trial: what
the instruction count leaves out. A miss there is a trip to the L3, which a shared machine's
other tenants share; that is where a CPU-time ratio moves from hour to hour.
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
TRIALS_LINE = "trials per eval and epoch:"
VARIANTS = {
    "bare": "bare inspect trial (the overhead_ratio baseline)",
    "twice": "twice refund trial, stub/retry, fault none (overhead_ratio)",
    "none": "twice refund trial, stub/no-retry, fault none (fault_ratio baseline)",
    "lost": "twice refund trial, stub/no-retry, fault lost_reply (fault_ratio)",
}
RATIOS = {"overhead_ratio": ("twice", "bare"), "fault_ratio": ("lost", "none")}


def _child(variant: str, evals: int, work: Path, epochs: int = 1) -> None:
    """Run ``evals`` evals of ``variant`` (``epochs`` epochs each) after two warm-ups (inside
    cachegrind)."""
    sys.path.insert(0, str(HERE))
    import _trials
    from twice.evals.run import gc_for_trials, no_results_table

    with (
        _trials.scratch_dir(work, f"instr-{variant}") as logs,
        gc_for_trials(),
        no_results_table("none"),
    ):
        # The very evals bench/run.py times for the two figures (it runs 4 epochs each).
        bare, twice = _trials.overhead_runners(epochs, logs)
        none, lost = _trials.fault_runners(epochs, logs)
        run = {"bare": bare, "twice": twice, "none": none, "lost": lost}[variant]
        for _ in range(2 + evals):
            log = run()
            gc.collect()
    # How many evals ran is in argv; how many trials each held is counted here (the dataset's
    # size can change), and the parent reads cachegrind's total.
    trials = log.results.completed_samples if log.results else 0
    print(f"{TRIALS_LINE} {trials // epochs}", flush=True)


COUNTS = {"instructions": r"I\s+refs:", "L1 misses": r"LL refs:", "LL misses": r"LL misses:"}
"""cachegrind's summary lines: instructions; with the caches simulated, the first level's
misses (every one is a last-level reference) and the last level's."""


def l2_geometry() -> str | None:
    """``SIZE,ASSOC,LINE`` of this machine's per-core L2 (from ``/sys``), or None."""
    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            if (index / "level").read_text().strip() != "2":
                continue
            size = (index / "size").read_text().strip()
            ways = (index / "ways_of_associativity").read_text().strip()
            line = (index / "coherency_line_size").read_text().strip()
        except OSError:
            return None
        kib = int(size.rstrip("K")) if size.endswith("K") else int(size.rstrip("M")) * 1024
        return f"{kib * 1024},{ways},{line}"
    return None


def _counts(
    variant: str, evals: int, work: Path, ll: str | None, epochs: int = 1
) -> dict[str, int]:
    sim = ["--cache-sim=yes", f"--LL={ll}"] if ll else ["--cache-sim=no"]
    cmd = [
        "valgrind", "--tool=cachegrind", *sim, "--cachegrind-out-file=/dev/null",
        sys.executable, __file__, "--child", variant, str(evals), "--work", str(work),
        "--epochs", str(epochs),
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True)
    found = {}
    m = re.search(re.escape(TRIALS_LINE) + r" (\d+)", done.stdout)
    if m:
        found["trials"] = int(m[1])
    for name, label in COUNTS.items():
        m = re.search(label + r"\s+([\d,]+)", done.stderr)
        if m:
            found[name] = int(m[1].replace(",", ""))
    if done.returncode != 0 or "instructions" not in found or not found.get("trials"):
        raise RuntimeError(f"{' '.join(cmd)} exited {done.returncode}:\n{done.stderr[-2000:]}")
    return found


def per_trial(
    variant: str, evals: int, work: Path, ll: str | None = None, epochs: int = 1
) -> dict[str, float]:
    """Counts of one trial of ``variant``: (K evals - 0 evals) / (K x trials per eval), for
    instructions and, with ``ll`` (a last level's ``SIZE,ASSOC,LINE``), cache misses."""
    with ThreadPoolExecutor(2) as pool:
        with_k = pool.submit(_counts, variant, evals, work, ll, epochs)
        without = pool.submit(_counts, variant, 0, work, ll, epochs)
        k, zero = with_k.result(), without.result()
    trials = evals * k.pop("trials") * epochs
    zero.pop("trials")
    return {name: (k[name] - zero[name]) / trials for name in k}


def positive(text: str) -> int:
    """An ``argparse`` type: a whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of at least 1")
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--evals", type=positive, default=4, help="timed evals per variant")
    parser.add_argument(
        "--epochs",
        type=positive,
        default=1,
        help="epochs per eval (bench/run.py times 4: more trials in flight at once)",
    )
    parser.add_argument("--only", help=f"comma-separated variants of: {', '.join(VARIANTS)}")
    parser.add_argument("--work", type=Path, default=HERE / "out")
    parser.add_argument(
        "--cache", action="store_true", help="simulate the caches, last level = one core's L2"
    )
    parser.add_argument("--ll", help="the simulated last level: SIZE,ASSOC,LINE (implies --cache)")
    parser.add_argument("--child", nargs=2, metavar=("VARIANT", "EVALS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.child[0], int(args.child[1]), args.work, args.epochs)
        return
    ll = None
    if args.cache or args.ll:
        ll = args.ll or l2_geometry()
        if ll is None:
            sys.exit(
                "error: could not read this machine's L2 size from /sys; pass --ll SIZE,ASSOC,LINE"
            )
    if shutil.which("valgrind") is None:
        sys.exit("error: valgrind is not on PATH (Debian: apt-get install valgrind)")
    wanted = list(VARIANTS) if not args.only else [v.strip() for v in args.only.split(",")]
    unknown = [v for v in wanted if v not in VARIANTS]
    if unknown:
        sys.exit(f"error: unknown variant(s) {', '.join(unknown)}; expected: {', '.join(VARIANTS)}")
    if ll:
        print(f"caches simulated; last level {ll} (size, ways, line bytes)")
    counts: dict[str, dict[str, float]] = {}
    for variant in wanted:
        counts[variant] = c = per_trial(variant, args.evals, args.work, ll, args.epochs)
        misses = "".join(
            f", {c[name] / 1e3:7.1f} k {name}" for name in ("L1 misses", "LL misses") if name in c
        )
        print(
            f"{variant:>6}: {c['instructions'] / 1e6:6.2f} M instructions{misses}/trial"
            f"  ({VARIANTS[variant]})"
        )
    for name, (subject, base) in RATIOS.items():
        if subject in counts and base in counts:
            for count in counts[subject]:
                ratio = counts[subject][count] / counts[base][count]
                print(f"{name}: {ratio:.3f} ({count})")


if __name__ == "__main__":
    main()
