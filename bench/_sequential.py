"""The sequential gate's validity study: simulated Bernoulli gates, plus one stub run.

Simulates the shipped gate's first rule (duplication ≤ 5%, one-sided α = 0.05) looked at
after every round of 24 trials, as ``twice run --until-decided`` does:

* the false-pass rate with the true rate exactly at the threshold (must be ≤ α), next to the
  same gate recomputing the fixed gate's Wilson bound after every round (it is not);
* for true rates 0, 0.01, 0.05, 0.2, 0.5 and 1.0: the mean trials used and how often it
  passes, next to the fixed-n gate (96 trials, the run ``evals/gate.toml`` suggests for a
  24-sample task × 4 epochs; a Wilson upper bound ≤ 5% there needs 0 duplicates).

The stub run is ``run_until_decided`` on the refund task under ``lost_reply`` with
``stub/retry`` (always duplicates: fails in round 1) and ``stub/verify`` (never does: passes
once the bound is proved and the rule's ``min_trials`` are in).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import numpy as np

RATES = (0.0, 0.01, 0.05, 0.2, 0.5, 1.0)
THRESHOLD = 0.05
ALPHA = 0.05
BATCH = 24
MAX_TRIALS = 480
FIXED_TRIALS = 96


def _fixed_pass_rate(rate: float, n: int, gates: int, seed: int) -> float:
    from statsmodels.stats.proportion import proportion_confint

    k = np.random.default_rng(seed).binomial(n, rate, size=gates)
    _, hi = proportion_confint(k, n, alpha=ALPHA, method="wilson")
    return float((np.asarray(hi) <= THRESHOLD).mean())


def study(gates: int, seed: int = 2026) -> dict[str, Any]:
    """The simulated part: false-pass rate at the threshold and trials per true rate."""
    from twice.reports.stats import peeking_wilson_false_pass, simulate_max_rule

    mean_trials: dict[str, float] = {}
    pass_rate: dict[str, float] = {}
    fixed_pass: dict[str, float] = {}
    false_pass = None
    for i, rate in enumerate(RATES):
        # In chunks: a 20,000 × 480 float matrix per array is fine, several at once are not.
        trials: list[np.ndarray] = []
        verdicts: list[np.ndarray] = []
        for j, size in enumerate(_chunks(gates, 2500)):
            sim = simulate_max_rule(
                rate,
                THRESHOLD,
                alpha=ALPHA,
                batch=BATCH,
                max_trials=MAX_TRIALS,
                gates=size,
                seed=seed + 1000 * i + j,
            )
            trials.append(sim.trials)
            verdicts.append(sim.verdict)
        t, v = np.concatenate(trials), np.concatenate(verdicts)
        mean_trials[str(rate)] = float(t.mean())
        pass_rate[str(rate)] = float((v == "pass").mean())
        fixed_pass[str(rate)] = _fixed_pass_rate(rate, FIXED_TRIALS, gates, seed + i)
        if rate == THRESHOLD:
            false_pass = float((v == "pass").mean())
    assert false_pass is not None
    peek = peeking_wilson_false_pass(
        THRESHOLD,
        THRESHOLD,
        alpha=ALPHA,
        batch=BATCH,
        max_trials=MAX_TRIALS,
        gates=min(gates, 5000),
        seed=seed,
    )
    return {
        "false_pass_rate": false_pass,
        "alpha": ALPHA,
        "mean_trials": mean_trials,
        "fixed_trials": FIXED_TRIALS,
        "pass_rate": pass_rate,
        "fixed_pass_rate": fixed_pass,
        "wilson_peeking_false_pass_rate": peek,
        "gates": gates,
        "threshold": THRESHOLD,
        "batch": BATCH,
        "max_trials": MAX_TRIALS,
    }


def _chunks(total: int, size: int) -> list[int]:
    out = [size] * (total // size)
    if total % size:
        out.append(total % size)
    return out


def stub_run(work: Path, limit: int | None) -> dict[str, Any]:
    """``run_until_decided`` with stub/retry and stub/verify on refund under lost_reply."""
    from twice.evals import parse_gate, suite_from_flags
    from twice.evals.run import run_until_decided

    gate = parse_gate(
        {
            "rule": [
                {
                    "name": "no duplicates after a lost reply",
                    "metric": "duplication_rate",
                    "max": THRESHOLD,
                    "min_trials": 73,
                }
            ]
        }
    )
    suite = suite_from_flags(
        config=None,
        models=("stub/retry", "stub/verify"),
        prompts=(),
        tasks=("refund",),
        faults=("lost_reply",),
        protections=("bare",),
        epochs=None,
        limit=limit,
    )
    work.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="sequential-", dir=work) as logs:
        _, states = run_until_decided(
            suite, Path(logs), gate, gate_path="(bench)", max_trials=MAX_TRIALS, report=False
        )
    return {
        st.cell.model: {"verdict": st.status, "trials": st.trials, "round": st.stopped_round}
        for st in states
    }
