"""The benchmark script keeps running: ``bench/run.py --quick`` writes every figure.

This measures nothing (benchmarks are never timed tests); it only keeps ``make bench`` from
rotting. The figures themselves are in docs/BENCHMARKS.md.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from twice.tasks.agents import BUILTIN_AGENTS, AgentError, check_agent
from twice.tasks.refund.refund import DATASET

ROOT = Path(__file__).resolve().parents[1]
RUN = ROOT / "bench" / "run.py"
FIGURES = {
    "overhead_ratio",
    "fault_ratio",
    "attempt_ratio",
    "concurrent_same_key",
    "report_seconds_10k",
    "report_seconds_100k",
    "report_peak_mb_100k",
    "report_vs_read_ratio",
    "concurrency_efficiency_64",
    "concurrency_vs_bare",
    "concurrency_vs_bare_one_process",
    "workers_speedup",
    "workers_parallel_ceiling",
    "workers_efficiency",
    "demo_seconds",
    "agent_overhead",
    "agent_cmd",
    "sequential",
    "serve_rps",
    "serve_p99_ms",
    "serve_rps_ratio",
    "serve_same_key",
}


def _installed(agent: str) -> bool:
    try:
        check_agent(agent, "refund")
    except AgentError:
        return False
    return True


def _script(name: str, path: Path) -> ModuleType:
    """A bench script loaded by path: bench/ is a directory of scripts, not a package."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _run_module() -> ModuleType:
    return _script("bench_run", RUN)


@pytest.mark.slow
def test_bench_quick_writes_every_figure(tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    done = subprocess.run(
        [sys.executable, str(RUN), "--quick", "--out", str(out), "--work", str(tmp_path / "w")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    results = json.loads(out.read_text(encoding="utf-8"))
    assert set(results) == FIGURES | {"machine"}
    assert results["concurrent_same_key"]["effects"] == 1
    assert set(results["concurrent_same_key"]) == {"effects", "attempts_per_second"}
    seq = results["sequential"]
    assert set(seq) >= {"false_pass_rate", "alpha", "mean_trials", "fixed_trials"}
    assert seq["stub_run"]["stub/retry"]["verdict"] == "fail"
    storm = results["machine"]["sizes"]["storm"]
    assert results["serve_same_key"] == {"effects": 1, "posts": storm}
    assert storm > 1
    for key in FIGURES - {
        "concurrent_same_key",
        "sequential",
        "serve_same_key",
        "agent_overhead",
        "agent_cmd",
    }:
        assert isinstance(results[key], float) and results[key] > 0, key
    # Every built-in agent whose framework is installed; the others are named as skipped.
    installed = {name for name in BUILTIN_AGENTS if _installed(name)}
    assert set(results["agent_overhead"]) == installed
    assert {"openai-agents", "langgraph", "langgraph-retry", "pydantic-ai"} <= installed
    for name in set(BUILTIN_AGENTS) - installed:
        assert f"agent {name}: not measured" in done.stdout
    assert all(isinstance(v, float) and v > 0 for v in results["agent_overhead"].values())
    cmd = results["agent_cmd"]
    assert set(cmd) == {
        "extra_seconds_per_trial",
        "extra_cpu_seconds_per_trial",
        "cpu_ratio",
        "trials",
    }
    assert cmd["trials"] == 1 and cmd["cpu_ratio"] > 0
    machine = results["machine"]
    assert machine["mode"] == "quick"
    assert machine["cores"] >= 1 and machine["libraries"]["inspect_ai"]
    if (ROOT / ".git").exists():  # which code the figures describe
        assert re.fullmatch(r"[0-9a-f]{40}", machine["revision"]["commit"]), machine["revision"]
    assert "overhead_ratio" in done.stdout
    if sys.platform == "linux":  # /proc/stat's steal: how contended the hour was
        assert isinstance(machine["steal_seconds"], float) and machine["steal_seconds"] >= 0
        assert "stolen by the hypervisor" in done.stdout
    # every workers pair is printed, not only the medians (one pair here: --quick)
    assert re.search(r"pairs \d+\.\d/\d+\.\d\)", done.stdout), done.stdout[-3000:]
    # ... beside the machine's parallel ceiling measured before it, and the speedup over it
    assert 0 < results["workers_parallel_ceiling"] < 4
    assert re.search(r"ceiling before each pair \d\.\d\d \(median", done.stdout)


def test_bench_table_marks_missed_targets() -> None:
    run = _run_module()
    text = run.table(
        {
            "agent_overhead": {"openai-agents": 1.9, "langgraph": 2.1},
            "agent_cmd": {"extra_seconds_per_trial": 0.4, "cpu_ratio": 3.0, "trials": 8},
            "overhead_ratio": 1.4,
            "fault_ratio": 1.01,
            "concurrency_efficiency_64": 0.5,
            "concurrent_same_key": {"effects": 2, "attempts_per_second": 10.0},
            "serve_same_key": {"effects": 1, "posts": 1000},
        }
    )
    lines = {line.split()[0]: line for line in text.splitlines()}
    assert lines["overhead_ratio"].endswith("MISSED")
    assert lines["agent_overhead"].endswith("each <= 2  MISSED")  # the worst agent decides
    assert lines["agent_cmd"].endswith("extra_seconds_per_trial <= 0.5  ok")
    assert lines["fault_ratio"].endswith("ok")
    assert lines["concurrency_efficiency_64"].endswith("MISSED")
    assert lines["concurrent_same_key"].endswith("MISSED")
    assert lines["serve_same_key"].endswith("ok")


def test_bench_only_keeps_the_other_figures(tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    out.write_text(json.dumps({"serve_rps": 123.0, "machine": {"mode": "full"}}))
    done = subprocess.run(
        [sys.executable, str(RUN), "--quick", "--only", "attempt", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    results = json.loads(out.read_text(encoding="utf-8"))
    assert results["serve_rps"] == 123.0
    assert results["attempt_ratio"] > 0
    # The kept figures keep the machine block of the run that measured them; the subset's
    # own is filed under its --only (before, it replaced the full run's, revision and all).
    assert results["machine"]["mode"] == "full"
    assert results["machine"]["partial_runs"]["attempt"]["mode"] == "quick"


def test_overhead_parts_runs_and_finds_every_part(tmp_path: Path) -> None:
    # It wraps inspect internals: a part inspect renamed would be skipped with a note.
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "overhead_parts.py"), "--epochs", "1",
         "--reps", "1", "--work", str(tmp_path)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "not found" not in done.stdout, done.stdout
    lines = done.stdout.splitlines()
    assert any(line.startswith("condense and write the sample") for line in lines)
    assert lines[-1].startswith("ratio ")


def _bench_common() -> ModuleType:
    return _script("bench_common", ROOT / "bench" / "_common.py")


def test_paired_ratio_is_the_median_pair_and_ignores_one_slow_stretch() -> None:
    common = _bench_common()
    p = common.Paired()
    # Four pairs at 1.05; in the fifth a slow stretch of the machine hit the subject (x3).
    for base, subject in [(1.0, 1.05), (2.0, 2.1), (1.0, 1.05), (1.0, 1.05), (1.0, 3.0)]:
        p.baseline.append(common.Sample(wall=base, cpu=base))
        p.subject.append(common.Sample(wall=subject, cpu=subject))
    assert round(p.ratio(), 6) == 1.05
    assert round(p.ratio("wall"), 6) == 1.05
    assert round(p.total_ratio(), 3) == round(8.25 / 6.0, 3)  # the sum weighs the outlier


def test_the_median_interval_is_the_sign_tests_order_statistics() -> None:
    common = _bench_common()
    p = common.Paired()
    for i in range(41):  # pair ratios 1.00, 1.01, ... 1.40, in shuffled order
        j = (i * 17) % 41
        p.baseline.append(common.Sample(wall=1.0, cpu=1.0))
        p.subject.append(common.Sample(wall=1.0, cpu=1.0 + j / 100))
    # P(Binomial(41, 1/2) <= 13) < 0.025 <= P(<= 14): the 14th and 28th smallest ratios.
    assert [round(x, 6) for x in p.median_interval()] == [1.13, 1.27]
    assert round(p.ratio(), 6) == 1.2
    one = common.Paired([common.Sample(1.0, 1.0)], [common.Sample(1.0, 1.3)])
    assert one.median_interval() == (1.3, 1.3)  # one pair: no interval to give


def test_the_parallel_ceiling_fails_loudly_when_a_forked_child_fails(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    common = _bench_common()
    parent = os.getpid()

    def busy(rounds: int) -> None:
        if os.getpid() != parent:
            raise MemoryError("the child ran out")

    monkeypatch.setattr(common, "_busy", busy)
    # Without the check the children's instant exit read as a ceiling in the hundreds.
    with pytest.raises(RuntimeError, match=r"exited \[1, 1\]"):
        common.parallel_ceiling(1)
    assert "MemoryError: the child ran out" in capfd.readouterr().err
    monkeypatch.setattr(common, "_busy", lambda rounds: None)
    assert common.parallel_ceiling(1)["ceiling"] > 0  # and children that succeed pass


def test_instructions_refuses_a_count_below_one() -> None:
    # Checked before valgrind is looked for: the error names the value and what is accepted.
    for flag in ("--epochs", "--evals"):
        done = subprocess.run(
            [sys.executable, str(ROOT / "bench" / "instructions.py"), flag, "0"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 2
        assert f"argument {flag}: '0' is not a whole number of at least 1" in done.stderr


@pytest.mark.slow
def test_instructions_counts_the_trials_an_eval_ran(tmp_path: Path) -> None:
    # The per-trial figure divides by this count; it was a constant 24 while the refund
    # dataset held 28 samples, so every per-trial count came out 28/24 too high.
    child = ["--child", "none", "1", "--work", str(tmp_path), "--epochs", "2"]
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "instructions.py"), *child],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "INSPECT_DISPLAY": "none"},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    samples = sum(1 for line in DATASET.read_text(encoding="utf-8").splitlines() if line.strip())
    assert f"trials per eval and epoch: {samples}" in done.stdout


def test_bench_records_the_code_revision_or_none_outside_git(tmp_path: Path) -> None:
    common = _script("bench_common", ROOT / "bench" / "_common.py")
    assert common.code_revision(tmp_path) is None  # not a checkout: no revision, no crash
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "f.txt").write_text("a\n")
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "add", "f.txt"], check=True)
    subprocess.run([*git, "commit", "-qm", "one"], check=True)
    head = subprocess.run(
        [*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert common.code_revision(tmp_path) == {"commit": head, "modified": False}
    (tmp_path / "f.txt").write_text("b\n")
    assert common.code_revision(tmp_path) == {"commit": head, "modified": True}
