"""Shards and workers: a deterministic split of the cells, merged back into the same numbers."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import pandas as pd
import pytest
from twice.evals import Cell, SuiteError, suite_from_flags
from twice.evals.run import GC_THRESHOLDS
from twice.evals.scale import (
    FORK_ENV,
    MIN_CELLS_PER_WORKER,
    WorkerPlan,
    default_workers,
    load_records,
    merge,
    save_records,
)
from twice.evals.scale._hand_off import remove_orphaned_hand_offs
from twice.evals.scale._processes import _FIRST_EXIT_POLL, run_workers
from twice.evals.scale._processes import _wait_for_first as wait_for_first
from twice.evals.suite import Suite, cell_digest, parse_shard, shard_cells
from twice.reports import Shard, frame_of, log_records, trials_frame

Twice = Callable[..., Any]

SUITE = [
    "--model", "stub/retry", "--model", "stub/verify", "--model", "stub/noisy",
    "--task", "refund", "--fault", "lost_reply", "--fault", "none", "--limit", "3",
    "--display", "none", "--no-report",
]  # fmt: skip
"""Six cells, three trials each; stub/noisy makes the rates strictly between 0 and 1."""

GATE = '[[rule]]\nmetric = "completion_rate"\nmin = 0.0\n'


def _cells(n_models: int = 6) -> list[Cell]:
    suite = suite_from_flags(
        config=None,
        models=[f"stub/{m}" for m in ("retry", "no-retry", "verify", "drift", "parallel", "noisy")][
            :n_models
        ],
        prompts=["baseline", "cautious", "persistent"],
        tasks=["refund", "send_email"],
        faults=["lost_reply", "none"],
        protections=[],
        epochs=None,
        limit=None,
    )
    return list(suite.cells())


def _summary_cells(path: Path) -> dict[tuple[str, ...], dict[str, Any]]:
    doc = json.loads(path.read_text())
    return {
        tuple(c[k] for k in ("model", "prompt", "task", "fault", "protection")): c
        for c in doc["cells"]
    }


# -- the split ---------------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["0/2", "3/2", "1/0", "2", "a/b", "1/2/3", "-1/2"])
def test_parse_shard_rejects(text: str) -> None:
    with pytest.raises(SuiteError, match=r"is not i/n with 1 <= i <= n"):
        parse_shard(text)


def test_parse_shard_caps_the_count() -> None:
    # The failing path: 1/99999999999999999999 ran; `twice report` then hung listing the
    # missing shards (1/1000000 printed a 25 MB message).
    assert parse_shard("1/10000") == Shard(1, 10000)
    with pytest.raises(SuiteError, match=r"at most 10000 shards"):
        parse_shard("1/99999999999999999999")


@pytest.mark.parametrize("command", ["report", "gate"])
def test_report_and_gate_refuse_a_directory_of_too_many_shards_at_once(
    tmp_path: Path, command: str
) -> None:
    # The failing path: a directory made by an older twice or by hand, shard-1-of-10**20,
    # made report and gate list every missing shard of 1..10**20: they never finished.
    from click.testing import CliRunner
    from twice.evals.cli import cli

    (tmp_path / "shard-1-of-99999999999999999999").mkdir()
    args = [command, str(tmp_path)]
    if command == "gate":
        args += ["--config", str(Path(__file__).parents[2] / "evals" / "gate.toml")]
    else:
        args += ["-o", str(tmp_path / "r.html")]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2, result.output
    assert "holds shards of 99999999999999999999" in result.output
    assert "at most 10000" in result.output


def test_parse_shard_accepts() -> None:
    assert parse_shard("2/3") == Shard(2, 3)
    assert parse_shard(" 1 / 1 ") == Shard(1, 1)
    assert Shard(2, 3).name == "shard-2-of-3"


@pytest.mark.parametrize("n", [1, 2, 3, 5, 7])
def test_shards_are_disjoint_cover_the_suite_and_balanced(n: int) -> None:
    cells = _cells()
    parts = [shard_cells(cells, Shard(i, n)) for i in range(1, n + 1)]
    flat = [c for p in parts for c in p]
    assert sorted(flat, key=cell_digest) == sorted(cells, key=cell_digest)
    assert len(set(flat)) == len(flat)
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1, sizes
    for p in parts:  # each share keeps suite order
        assert p == [c for c in cells if c in p]


def test_cell_digest_is_sha256_of_the_axes() -> None:
    # Pinned: the split must be the same on every machine and Python (never ``hash()``).
    cell = Cell(
        model="stub/retry", prompt="baseline", task="refund", fault="lost_reply", protection="bare"
    )
    assert cell_digest(cell) == "867ed860e0b6e9a2e555add9c0188114f73575c68680df1b3a111e7f296e935e"


def test_split_is_the_same_in_another_process_with_another_hash_seed() -> None:
    code = (
        "from twice.evals import suite_from_flags\n"
        "from twice.evals.suite import shard_cells\nfrom twice.reports import Shard\n"
        "s = suite_from_flags(config=None, models=['stub/retry', 'stub/no-retry', 'stub/verify',"
        " 'stub/drift', 'stub/parallel', 'stub/noisy'], prompts=['baseline', 'cautious',"
        " 'persistent'], tasks=['refund', 'send_email'], faults=['lost_reply', 'none'],"
        " protections=[], epochs=None, limit=None)\n"
        "print([[c.model, c.prompt, c.task, c.fault] for c in shard_cells(list(s.cells()),"
        " Shard(2, 3))])\n"
    )
    outs = {
        subprocess.run(
            [sys.executable, "-c", code],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for seed in ("1", "2")
    }
    assert len(outs) == 1
    here = [[c.model, c.prompt, c.task, c.fault] for c in shard_cells(_cells(), Shard(2, 3))]
    assert json.loads(outs.pop().replace("'", '"')) == here


def test_default_workers() -> None:
    assert default_workers(1, cpus=8) == 1
    assert default_workers(2 * MIN_CELLS_PER_WORKER - 1, cpus=8) == 1
    assert default_workers(2 * MIN_CELLS_PER_WORKER, cpus=8) == 2
    assert default_workers(57, cpus=2) == 2  # the default suite on this machine
    assert default_workers(1000, cpus=4) == 4
    assert default_workers(1000, cpus=1) == 1


# -- runs ----------------------------------------------------------------------------------------


def test_bad_shard_is_a_usage_error(twice: Twice, tmp_path: Path) -> None:
    result = twice("run", *SUITE, "--shard", "3/2", "--log-dir", tmp_path / "x")
    assert result.exit_code == 2
    assert "'3/2' is not i/n" in result.output
    # An unset variable in `--shard "$X"` ran the whole suite, unsharded, exit 0.
    result = twice("run", *SUITE, "--shard", "", "--log-dir", tmp_path / "y")
    assert result.exit_code == 2
    assert "--shard '' is not i/n" in result.output
    result = twice("run", *SUITE, "--shard", "1/2", "--workers", "2", "--log-dir", tmp_path)
    assert result.exit_code == 2
    assert "drop --workers" in result.output


@pytest.mark.parametrize(
    ("display", "env", "workers_get"),
    [("plain", "", "none"), ("log", "", "log"), (None, "log", "log"), (None, "plain", "none")],
)
def test_workers_display_only_what_someone_reads(
    twice: Twice,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    display: str | None,
    env: str,
    workers_get: str,
) -> None:
    # A worker's stdout goes to /dev/null: the plain display's end-of-set table (seconds of
    # layout for a big suite) would be drawn for no one. The log display writes to stderr,
    # whose tail the parent shows when a worker fails.
    from twice.evals import scale

    seen: list[str] = []

    def run_parallel(plan: WorkerPlan, *rest: Any, **kw: Any) -> None:
        seen.append(plan.display)
        raise SystemExit(0)

    monkeypatch.setattr(scale, "run_parallel", run_parallel)
    monkeypatch.setenv("INSPECT_DISPLAY", env)  # what the parent shows when no --display
    at = SUITE.index("--display")
    suite = SUITE[:at] + SUITE[at + 2 :]
    flag = ["--display", display] if display else []
    twice("run", *suite, "--workers", "2", *flag, "--log-dir", tmp_path)
    assert seen == [workers_get]


@pytest.fixture(scope="module")
def unsharded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from click.testing import CliRunner
    from twice.evals.cli import cli

    log_dir = tmp_path_factory.mktemp("unsharded") / "logs"
    result = CliRunner().invoke(cli, ["run", *SUITE, "--log-dir", str(log_dir)])
    assert result.exit_code == 0, result.output
    return log_dir


@pytest.mark.slow
@pytest.mark.parametrize("n", [2, 3])
def test_sharded_run_merges_to_the_unsharded_summary(
    twice: Twice, tmp_path: Path, unsharded: Path, n: int
) -> None:
    log_dir = tmp_path / "logs"
    suites: set[str] = set()
    for i in range(1, n + 1):
        result = twice("run", *SUITE, "--shard", f"{i}/{n}", "--log-dir", log_dir)
        assert result.exit_code == 0, result.output
        assert (log_dir / f"shard-{i}-of-{n}" / "eval-set.json").is_file()
        shard_summary = json.loads((log_dir / f"shard-{i}-of-{n}" / "summary.json").read_text())
        record = shard_summary["run"]["shard"]
        assert (record["index"], record["count"]) == (i, n)
        suites.add(record["suite"])
        assert len(shard_summary["cells"]) in (6 // n, 6 // n + 1)
    assert not (log_dir / "summary.json").exists()  # nothing merged yet
    assert len(suites) == 1, "every shard names the same whole suite"

    (tmp_path / "gate.toml").write_text(GATE)
    gate = twice("gate", log_dir, "--config", tmp_path / "gate.toml")
    assert gate.exit_code == 0, gate.output
    assert f"{3 * 6} trial(s)" in gate.stdout

    report = twice("report", log_dir)
    assert report.exit_code == 0, report.output
    assert (log_dir / "report.html").is_file()
    merged = json.loads((log_dir / "summary.json").read_text())
    assert merged["run"]["shards"] == {
        "count": n,
        "dirs": [f"shard-{i}-of-{n}" for i in range(1, n + 1)],
    }
    assert merged["run"]["models"] and set(merged["run"]["models"]) == {
        "stub/retry",
        "stub/verify",
        "stub/noisy",
    }
    want = _summary_cells(unsharded / "summary.json")
    assert _summary_cells(log_dir / "summary.json") == want
    assert any(0 < c["duplication_rate"] < 1 for c in want.values())  # not all trivial
    # Every metric of the catalogue is merged, the newer ones too.
    assert all({"wrong_rate", "wrong_ci", "wrong_effects_mean"} <= set(c) for c in want.values())


@pytest.mark.slow
@pytest.mark.parametrize("fork", ["1", "0"], ids=["forked", "fresh-interpreters"])
def test_workers_merge_to_the_unsharded_summary(tmp_path: Path, unsharded: Path, fork: str) -> None:
    log_dir = tmp_path / "logs"
    proc = subprocess.run(
        [sys.executable, "-m", "twice.evals.cli", "run", *SUITE, "--workers", "2",
         "--log-dir", str(log_dir)],
        capture_output=True, text=True, timeout=600, env={**os.environ, FORK_ENV: fork},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "2 workers" in proc.stderr
    assert sorted(p.name for p in log_dir.iterdir() if p.is_dir()) == [
        "shard-1-of-2",
        "shard-2-of-2",
    ]
    merged = json.loads((log_dir / "summary.json").read_text())
    assert merged["run"]["shards"]["count"] == 2
    assert merged["run"]["faults"] == ["lost_reply", "none"]
    assert _summary_cells(log_dir / "summary.json") == _summary_cells(unsharded / "summary.json")
    assert "stub/noisy" in proc.stdout  # the merged table is printed


@pytest.mark.slow
def test_missing_or_mixed_shards_exit_2(twice: Twice, tmp_path: Path) -> None:
    log_dir = tmp_path / "logs"
    (tmp_path / "gate.toml").write_text(GATE)
    assert twice("run", *SUITE, "--shard", "2/3", "--log-dir", log_dir).exit_code == 0
    for args in (("gate", log_dir, "--config", tmp_path / "gate.toml"), ("report", log_dir)):
        result = twice(*args)
        assert result.exit_code == 2, result.output
        assert "missing 2 of 3 shard(s): shard-1-of-3, shard-3-of-3" in result.output
        assert "--shard 1/3" in result.output
    assert not (log_dir / "summary.json").exists()
    # Many missing shards are counted past the first ten, not all listed.
    many = tmp_path / "many"
    assert twice("run", *SUITE, "--shard", "2/40", "--log-dir", many).exit_code == 0
    result = twice("report", many)
    assert result.exit_code == 2
    assert "missing 39 of 40 shard(s): shard-1-of-40, shard-3-of-40," in result.output
    assert "shard-11-of-40, ... (29 more)" in result.output

    (log_dir / "shard-1-of-2").mkdir()
    result = twice("report", log_dir)
    assert result.exit_code == 2
    assert "mixes shard counts (-of-2, -of-3)" in result.output


ONE_CELL = ["--model", "stub/retry", "--task", "refund", "--limit", "1", "--display", "none",
            "--no-report"]  # fmt: skip
FOUR_FAULTS = ["--fault", "none", "--fault", "lost_reply", "--fault", "error_before_commit",
               "--fault", "timeout_before_commit"]  # fmt: skip


def test_shards_of_different_suites_are_not_merged(twice: Twice, tmp_path: Path) -> None:
    # A cluster shard rerun with other flags: the deal differs, so cells were counted twice
    # (with intervals as if there were twice the trials) or silently lost.
    log_dir = tmp_path / "logs"
    (tmp_path / "gate.toml").write_text(GATE)
    faults = ["--fault", "none", "--fault", "lost_reply"]
    assert twice("run", *ONE_CELL, *faults, "--shard", "1/2", "--log-dir", log_dir).exit_code == 0
    more = [*faults, "--fault", "error_before_commit"]
    assert twice("run", *ONE_CELL, *more, "--shard", "2/2", "--log-dir", log_dir).exit_code == 0
    for args in (("report", log_dir), ("gate", log_dir, "--config", tmp_path / "gate.toml")):
        result = twice(*args)
        assert result.exit_code == 2, result.output
        assert "holds shards of different suites (shard-1-of-2 ran suite" in result.output
        assert "shard-2-of-2 ran suite" in result.output
    assert not (log_dir / "summary.json").exists()
    assert twice("run", *ONE_CELL, *more, "--shard", "1/2", "--log-dir", log_dir).exit_code == 0
    assert twice("report", log_dir).exit_code == 0
    merged = json.loads((log_dir / "summary.json").read_text())
    assert sorted(c["fault"] for c in merged["cells"]) == sorted(more[1::2])
    assert {c["trials"] for c in merged["cells"]} == {1}


@pytest.mark.parametrize(("summary", "said"), [(None, "missing"), ("{trunc", "unreadable")])
def test_a_shard_without_a_readable_summary_is_not_merged(
    twice: Twice, tmp_path: Path, summary: str | None, said: str
) -> None:
    # Its summary names the suite it ran: without one, a shard rerun with other flags (here
    # more epochs) was merged with the rest, cells of 2 trials beside cells of 1, exit 0.
    log_dir = tmp_path / "logs"
    (tmp_path / "gate.toml").write_text(GATE)
    for i, epochs in ((1, "2"), (2, "1")):
        args = [*ONE_CELL, *FOUR_FAULTS, "--epochs", epochs, "--shard", f"{i}/2"]
        assert twice("run", *args, "--log-dir", log_dir).exit_code == 0
    stale = log_dir / "shard-1-of-2" / "summary.json"
    if summary is None:
        stale.unlink()
    else:
        stale.write_text(summary)
    for args in (("report", log_dir), ("gate", log_dir, "--config", tmp_path / "gate.toml")):
        result = twice(*args)
        assert result.exit_code == 2, result.output
        assert f"has logs in shard-1-of-2 (summary.json {said})" in result.output
    assert not (log_dir / "summary.json").exists()


def test_a_shards_lost_log_marks_the_merged_summary_incomplete(
    twice: Twice, tmp_path: Path
) -> None:
    # Both shards finished and said so; then a log of one was lost (deleted, left out of an
    # artifact). The merged summary said complete: true, 3 of the 4 cells, and the report
    # said nothing, while the gate refused the directory.
    log_dir = tmp_path / "logs"
    for i in (1, 2):
        result = twice("run", *ONE_CELL, *FOUR_FAULTS, "--shard", f"{i}/2", "--log-dir", log_dir)
        assert result.exit_code == 0, result.output
    next((log_dir / "shard-1-of-2").glob("*.eval")).unlink()
    report = twice("report", log_dir)
    assert report.exit_code == 0, report.output
    assert "warning: 1 planned log(s) missing" in report.stderr
    merged = json.loads((log_dir / "summary.json").read_text())
    assert merged["complete"] is False and merged["status"] == "incomplete"
    assert len(merged["missing_logs"]) == 1 and len(merged["cells"]) == 3


def test_an_empty_shard_directory_is_a_missing_shard(twice: Twice, tmp_path: Path) -> None:
    # A shard job that failed before it began can leave an empty artifact directory: the
    # gate passed on the other shard's cells alone.
    log_dir = tmp_path / "logs"
    (tmp_path / "gate.toml").write_text(GATE)
    for i in (1, 2):
        result = twice("run", *ONE_CELL, *FOUR_FAULTS, "--shard", f"{i}/2", "--log-dir", log_dir)
        assert result.exit_code == 0, result.output
    for p in (log_dir / "shard-1-of-2").iterdir():
        p.unlink()
    (log_dir / "shard-1-of-2" / ".twice.lock").write_text("")
    for args in (("report", log_dir), ("gate", log_dir, "--config", tmp_path / "gate.toml")):
        result = twice(*args)
        assert result.exit_code == 2, result.output
        assert "missing 1 of 2 shard(s): shard-1-of-2" in result.output


def test_a_merged_summary_says_when_its_shards_are_refused_and_a_runs_own_stays(
    twice: Twice, tmp_path: Path
) -> None:
    # report/gate exited 2 for a shard gone since the last merge, and left the merged
    # summary.json saying "complete": true of the directory they now refuse.
    import shutil

    log_dir = tmp_path / "logs"
    (tmp_path / "gate.toml").write_text(GATE)
    for i in (1, 2):
        result = twice("run", *ONE_CELL, *FOUR_FAULTS, "--shard", f"{i}/2", "--log-dir", log_dir)
        assert result.exit_code == 0, result.output
    assert twice("report", log_dir).exit_code == 0
    merged = json.loads((log_dir / "summary.json").read_text())
    assert merged["complete"] is True and len(merged["cells"]) == 4
    shutil.move(log_dir / "shard-2-of-2", tmp_path / "away")
    for args in (("gate", log_dir, "--config", tmp_path / "gate.toml"), ("report", log_dir)):
        result = twice(*args)
        assert result.exit_code == 2, result.output
        marked = json.loads((log_dir / "summary.json").read_text())
        assert marked["complete"] is False and marked["status"] == "incomplete"
        assert "missing 1 of 2 shard(s): shard-2-of-2" in marked["refused"]
        assert marked["cells"] == merged["cells"]  # what was counted stays readable
    shutil.move(tmp_path / "away", log_dir / "shard-2-of-2")
    assert twice("report", log_dir).exit_code == 0
    again = json.loads((log_dir / "summary.json").read_text())
    assert again["complete"] is True and "refused" not in again

    # A one-process run's own summary is its record: a refused report leaves it as written.
    single = tmp_path / "single"
    assert twice("run", *ONE_CELL, "--log-dir", single, "--no-report").exit_code == 0
    own = (single / "summary.json").read_text()
    next(single.glob("*.eval")).write_bytes(b"not a zip")
    assert twice("report", single).exit_code == 2
    assert (single / "summary.json").read_text() == own


def test_a_cell_in_two_shards_is_not_counted_twice(twice: Twice, tmp_path: Path) -> None:
    # Shards whose summaries name no suite (an older twice) can still be of different suites.
    log_dir = tmp_path / "logs"
    result = twice("run", *ONE_CELL, *FOUR_FAULTS, "--shard", "1/2", "--log-dir", log_dir)
    assert result.exit_code == 0, result.output
    shutil.copytree(log_dir / "shard-1-of-2", log_dir / "shard-2-of-2")
    for i in (1, 2):
        path = log_dir / f"shard-{i}-of-2" / "summary.json"
        summary = json.loads(path.read_text())
        summary["run"]["shard"].pop("suite")
        path.write_text(json.dumps(summary))
    result = twice("report", log_dir)
    assert result.exit_code == 2, result.output
    assert "in two shards (shard-1-of-2, shard-2-of-2)" in result.output


def test_a_shard_dealt_no_cells_forgets_the_cells_it_ran_before(
    twice: Twice, tmp_path: Path
) -> None:
    # An empty shard runs no eval_set, which would have rewritten its eval-set.json: the
    # logs an earlier suite dealt it still counted in the merge.
    log_dir = tmp_path / "logs"
    two = ["--fault", "none", "--fault", "lost_reply"]
    for i in (1, 2):
        assert (
            twice("run", *ONE_CELL, *two, "--shard", f"{i}/2", "--log-dir", log_dir).exit_code == 0
        )
    one = ["--fault", "error_before_commit"]
    for i in (1, 2):
        assert (
            twice("run", *ONE_CELL, *one, "--shard", f"{i}/2", "--log-dir", log_dir).exit_code == 0
        )
    assert twice("report", log_dir).exit_code == 0
    merged = json.loads((log_dir / "summary.json").read_text())
    assert [c["fault"] for c in merged["cells"]] == ["error_before_commit"]


def test_a_rerun_is_split_as_the_run_already_in_its_directory(
    twice: Twice, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The failing path: a one-process run into a directory of shards runs every cell, then
    # finds none of its logs (logs beside shard directories do not count) and exits 1,
    # forever; a different shard count re-runs everything, then cannot merge.
    from twice.evals import scale

    sharded, single = tmp_path / "sharded", tmp_path / "single"
    for i in (1, 2):
        assert twice("run", *ONE_CELL, "--shard", f"{i}/2", "--log-dir", sharded).exit_code == 0
    assert twice("run", *ONE_CELL, "--log-dir", single).exit_code == 0
    before = sorted(p.name for p in sharded.rglob("*"))
    refused = [
        (sharded, ["--workers", "1"], "a run split into 2 shards (shard-i-of-2)", "--workers 2"),
        (sharded, ["--workers", "3"], "a run split into 2 shards", "--workers 2 (or --shard i/2)"),
        (sharded, ["--shard", "1/3"], "this run would be split into 3 shards", "--workers 2"),
        (single, ["--workers", "2"], "holds a one-process run", "--workers 1"),
        (single, ["--shard", "1/2"], "holds a one-process run", "--workers 1"),
    ]
    for log_dir, flags, held, fix in refused:  # four cells: enough for three workers
        result = twice("run", *ONE_CELL, *FOUR_FAULTS, *flags, "--log-dir", log_dir)
        assert result.exit_code == 2, (flags, result.output)
        assert held in result.output and f"resume it with {fix}" in result.output
    assert sorted(p.name for p in sharded.rglob("*")) == before, "a refused run wrote nothing"
    assert not list(single.glob("shard-*"))

    counts: list[tuple[int, int | None]] = []

    def parallel(plan: WorkerPlan, count: int, **kwargs: Any) -> Any:
        counts.append((count, kwargs.get("at_once")))
        raise SystemExit(0)

    monkeypatch.setattr(scale, "run_parallel", parallel)
    monkeypatch.setattr(scale, "usable_cpus", lambda: 1)
    rerun = ["run", *ONE_CELL, "--fault", "none", "--fault", "lost_reply", "--log-dir", sharded]
    result = twice(*rerun)
    # ... no more of them at a time than this machine has CPUs (a cluster's split may be 20)
    assert counts == [(2, 1)], "a rerun without --workers resumes the directory's split"
    assert "2 shards 1 at a time" in result.output
    twice(*rerun, "--workers", "2")  # asked for: as many at once as asked
    assert counts[-1] == (2, None)


def test_report_and_gate_keep_the_shards_status_and_leave_a_baseline_as_it_is(
    twice: Twice, tmp_path: Path
) -> None:
    # `twice report` rewrote a stopped run's merged summary as if it were whole, and a gate
    # rewrote its --baseline directory (which may be read-only) the same way.
    log_dir, base = tmp_path / "logs", tmp_path / "base"
    two = ["--fault", "none", "--fault", "lost_reply"]
    for d in (log_dir, base):
        for i in (1, 2):
            assert twice("run", *ONE_CELL, *two, "--shard", f"{i}/2", "--log-dir", d).exit_code == 0
    stopped = log_dir / "shard-2-of-2" / "summary.json"
    shard = json.loads(stopped.read_text())
    missing = [{**shard["cells"][0], "fault": "timeout_before_commit"}]
    shard.update(complete=False, status="incomplete", interrupted="SIGTERM", missing=missing)
    stopped.write_text(json.dumps(shard))
    assert twice("report", log_dir).exit_code == 0
    merged = json.loads((log_dir / "summary.json").read_text())
    assert merged["complete"] is False and merged["status"] == "incomplete"
    assert merged["interrupted"] == "SIGTERM" and merged["missing"] == missing
    (tmp_path / "gate.toml").write_text(GATE)
    # the stopped shard's unfinished cell is part of the run: no gate passes without it
    gate = twice("gate", log_dir, "--config", tmp_path / "gate.toml", "--baseline", base)
    assert gate.exit_code == 2, gate.output
    unfinished = "timeout_before_commit / bare of shard-2-of-2 (incomplete) has no log"
    assert unfinished in gate.output
    gate = twice("gate", log_dir, "--config", tmp_path / "gate.toml", "--baseline", base,
                 "--allow-errors")  # fmt: skip
    assert gate.exit_code == 0, gate.output
    assert f"excluded: cell stub/retry / baseline / refund / {unfinished}" in gate.output
    assert "--allow-errors: gating without 1 errored or missing" in gate.output
    assert not (base / "summary.json").exists(), "a baseline is read, not written"
    assert twice("report", base).exit_code == 0
    whole = json.loads((base / "summary.json").read_text())
    assert whole["complete"] is True and whole["status"] == "complete"
    assert "missing" not in whole and "interrupted" not in whole


ONE_WORKER_DIES = """
import os, signal, sys
from twice.evals import cli
from twice.evals.run import _run

evaluate = _run.evaluate

def dies_in_shard_1(run, *args, **kwargs):  # as the OOM killer would, before any log
    if str(run.log_dir).endswith("shard-1-of-2"):
        os.kill(os.getpid(), signal.SIGKILL)
    return evaluate(run, *args, **kwargs)

_run.evaluate = dies_in_shard_1
sys.argv = ["twice", "run", *sys.argv[1:]]
cli.main()
"""


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="workers are forks on Linux only")
def test_a_worker_killed_by_another_signal_fails_the_run_and_the_rest_is_merged(
    tmp_path: Path,
) -> None:
    # A worker killed outright (the OOM killer) made the run exit 2 ("Usage") with no summary
    # at all, although the other shard had finished.
    log_dir = tmp_path / "logs"
    env = {k: v for k, v in os.environ.items() if k != FORK_ENV}
    done = subprocess.run(
        [sys.executable, "-c", ONE_WORKER_DIES, *ONE_CELL, *FOUR_FAULTS, "--workers", "2",
         "--log-dir", str(log_dir)],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert "worker 1/2 was killed by SIGKILL" in done.stderr
    summary = json.loads((log_dir / "summary.json").read_text())
    assert summary["complete"] is False and summary["status"] == "incomplete"
    assert len(summary["missing"]) == 2 and len(summary["cells"]) == 2
    faults = {c["fault"] for c in summary["cells"]} | {m["fault"] for m in summary["missing"]}
    assert faults == set(FOUR_FAULTS[1::2])


def test_a_workers_run_takes_the_directory_lock_and_marks_an_old_summary(
    twice: Twice, tmp_path: Path
) -> None:
    # A workers run took no lock of LOG_DIR, so it ran beside a one-process run into it; and
    # it left an earlier run's `complete` summary in place until its own merge, which a run
    # killed outright never reaches.
    from twice.evals.locks._lock import lock_log_dir

    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    old = '{"cells": [], "complete": true, "status": "complete"}'
    (log_dir / "summary.json").write_text(old)
    with lock_log_dir(log_dir):
        result = twice("run", *ONE_CELL, *FOUR_FAULTS, "--workers", "2", "--log-dir", log_dir)
    assert result.exit_code == 2, result.output
    assert "in use by another twice run" in result.output
    assert (log_dir / "summary.json").read_text() == old

    seen: list[dict[str, Any]] = []

    def refused(*args: Any) -> Any:  # what the workers do with bad arguments
        seen.append(json.loads((log_dir / "summary.json").read_text()))
        raise SuiteError("worker 1/2 exited 2: bad model argument")

    with pytest.MonkeyPatch.context() as m:
        from twice.evals.scale import _workers

        m.setattr(_workers, "run_with_workers", refused)
        result = twice("run", *ONE_CELL, *FOUR_FAULTS, "--workers", "2", "--log-dir", log_dir)
    assert result.exit_code == 2 and "bad model argument" in result.output
    assert seen[0]["status"] == "running" and len(seen[0]["missing"]) == 4
    assert (log_dir / "summary.json").read_text() == old, "put back: nothing ran"


def test_more_shards_than_cells_leaves_an_empty_shard(twice: Twice, tmp_path: Path) -> None:
    log_dir = tmp_path / "logs"
    one = ["--model", "stub/retry", "--task", "refund", "--fault", "none", "--limit", "1"]
    rest = ["--display", "none", "--no-report", "--log-dir", log_dir]
    assert twice("run", *one, "--shard", "1/2", *rest).exit_code == 0
    assert twice("run", *one, "--shard", "2/2", *rest).exit_code == 0
    empty = [d for d in log_dir.iterdir() if not list(d.glob("*.eval"))]
    assert len(empty) == 1
    assert json.loads((empty[0] / "summary.json").read_text())["cells"] == []
    result = twice("report", log_dir)
    assert result.exit_code == 0, result.output
    assert len(json.loads((log_dir / "summary.json").read_text())["cells"]) == 1


FORKED_WORKERS = """
import json, subprocess, sys, threading
from pathlib import Path

def no_interpreter(*args, **kwargs):
    raise AssertionError(f"a worker was started as a new interpreter: {args}")

subprocess.Popen = no_interpreter
import gc, os
from twice.evals import suite_from_flags
from twice.evals.run import _run
from twice.evals.scale import WorkerPlan
from twice.evals.scale._processes import run_workers

evaluate = _run.evaluate

def recording(*args, **kwargs):  # what the worker's collector is set to once trials end
    logs = evaluate(*args, **kwargs)
    Path(sys.argv[1], f"gc-{os.getpid()}").write_text(json.dumps(gc.get_threshold()))
    return logs

_run.evaluate = recording

assert threading.active_count() == 1, threading.enumerate()
suite = suite_from_flags(config=None, models=["stub/verify"], prompts=[], tasks=["refund"],
                         faults=["none", "lost_reply"], protections=[], epochs=None, limit=1)
exits = run_workers(WorkerPlan(suite, Path(sys.argv[1])), 2)
assert gc.get_freeze_count() == 0, "the parent's heap was left frozen"
print(json.dumps([[w.shard.index, w.returncode, w.stderr_tail, sorted(w.records)] for w in exits]))
"""


def _script_result(source: str, tmp_path: Path) -> Any:
    """Run ``source`` as a fresh process (like `twice run`: one thread, so workers are forks)
    with ``tmp_path`` as its argument; the JSON of its last line of output."""
    env = {k: v for k, v in os.environ.items() if k != FORK_ENV}
    done = subprocess.run(
        [sys.executable, "-c", source, str(tmp_path)],
        capture_output=True, text=True, timeout=600, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="workers are forks on Linux only")
def test_workers_are_forks_of_the_run_process_on_linux(tmp_path: Path) -> None:
    # A fresh interpreter spends seconds importing inspect before its first trial; a fork
    # has it already. The parent is a fresh process like `twice run` (this test process has
    # threads of its own by now), and starting any new interpreter there is an error.
    exits = _script_result(FORKED_WORKERS, tmp_path)
    assert [(i, code) for i, code, _, _ in exits] == [(1, 0), (2, 0)], exits
    for i, _, _, records in exits:
        summary = json.loads((tmp_path / f"shard-{i}-of-2" / "summary.json").read_text())
        assert summary["complete"] is True and len(summary["cells"]) == 1
        # each worker handed over what it read of its logs, so the parent need not read them
        shard_logs = sorted(str(p) for p in (tmp_path / f"shard-{i}-of-2").glob("*.eval"))
        assert records == shard_logs
    # a worker ends soon after its trials: it keeps their GC thresholds, and so spares its
    # critical path the full collections that putting Python's defaults back would start
    seen = [json.loads(p.read_text()) for p in tmp_path.glob("gc-*")]
    assert seen == [list(GC_THRESHOLDS)] * 2, seen


EARLY_SIGNAL = """
import json, os, signal, sys
from pathlib import Path
from twice.evals import suite_from_flags
from twice.evals.scale import WorkerPlan
from twice.evals.scale._processes import run_workers

real_setpgid = os.setpgid

def setpgid_then_signalled(*args):  # a SIGTERM lands while the new worker is being set up
    real_setpgid(*args)
    os.kill(os.getpid(), signal.SIGTERM)

os.setpgid = setpgid_then_signalled
suite = suite_from_flags(config=None, models=["stub/retry"], prompts=[], tasks=["refund"],
                         faults=["none"], protections=[], epochs=None, limit=1)
exits = run_workers(WorkerPlan(suite, Path(sys.argv[1])), 1)
print(json.dumps([w.returncode for w in exits]))
"""


@pytest.mark.skipif(sys.platform != "linux", reason="workers are forks on Linux only")
def test_a_signal_to_a_worker_before_it_has_its_handlers_stops_it(tmp_path: Path) -> None:
    # The fork copies the parent's handler, which passes signals on to the workers: run in a
    # worker before its own handlers are back, it would swallow the signal (the worker would
    # run its whole shard) or fail on its siblings. So the signal waits for the worker's.
    assert _script_result(EARLY_SIGNAL, tmp_path) == [-signal.SIGTERM]
    assert not list(tmp_path.glob("shard-1-of-1/*.eval")), "the signalled worker ran its shard"


DEAF_WORKER = """
import os, signal, sys, time
from pathlib import Path
from twice.evals import suite_from_flags
from twice.evals.run import _run, write_atomic
from twice.evals.scale import WorkerPlan
from twice.evals.scale._processes import run_workers

def deaf(*args, **kwargs):  # a worker that does not stop when asked (a hung tool, say)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    # Whole or not at all: the test reads the file as soon as it exists.
    write_atomic(Path(sys.argv[1], "worker.pid"), lambda tmp: tmp.write_text(str(os.getpid())))
    time.sleep(120)

_run.evaluate = deaf
suite = suite_from_flags(config=None, models=["stub/retry"], prompts=[], tasks=["refund"],
                         faults=["none"], protections=[], epochs=None, limit=1)
run_workers(WorkerPlan(suite, Path(sys.argv[1])), 1)
"""


@pytest.mark.skipif(sys.platform != "linux", reason="workers are forks on Linux only")
def test_a_third_signal_kills_the_workers_at_once(tmp_path: Path) -> None:
    # After the second signal the run gives its workers 30 s; a third one ends that wait,
    # and must not leave a worker that ignores signals running on its own.
    env = {k: v for k, v in os.environ.items() if k != FORK_ENV}
    proc = subprocess.Popen(
        [sys.executable, "-c", DEAF_WORKER, str(tmp_path)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
    )  # fmt: skip
    pid_file = tmp_path / "worker.pid"
    deadline = time.monotonic() + 120
    while not pid_file.exists():
        assert proc.poll() is None and time.monotonic() < deadline, "the worker never started"
        time.sleep(0.1)
    worker = int(pid_file.read_text())
    for _ in range(3):
        proc.send_signal(signal.SIGINT)
        time.sleep(0.5)
    proc.wait(timeout=15)  # not the 30 s grace
    deadline = time.monotonic() + 10
    while True:
        try:
            state = Path(f"/proc/{worker}/stat").read_text().split(") ", 1)[1][0]
        except OSError:
            break  # gone
        if state == "Z":
            break
        assert time.monotonic() < deadline, "the worker outlived the run"
        time.sleep(0.1)


def test_a_worker_that_fails_reports_its_exit_code_and_reason(tmp_path: Path) -> None:
    suite = suite_from_flags(
        config=None, models=["no-such/model"], prompts=[], tasks=["refund"],
        faults=["none", "lost_reply"], protections=[], epochs=None, limit=1,
    )  # fmt: skip
    exits = run_workers(WorkerPlan(suite, tmp_path), 2)
    assert {w.returncode for w in exits} == {2}
    assert all(w.errors and "no-such/model" in w.errors[0] for w in exits), exits


def test_handed_over_records_are_used_only_while_their_log_is_unchanged(
    tmp_path: Path, unsharded: Path
) -> None:
    files = sorted(unsharded.glob("*.eval"))
    records = log_records(files)
    saved = str(tmp_path / "records.pickle")
    save_records(saved, {**records, "s3://bucket/run/x.eval": []})
    loaded = load_records(saved)
    assert sorted(loaded) == sorted(records)  # a remote log is never taken on trust
    assert frame_of(files, loaded).equals(frame_of(files, records))  # (NaN != NaN in dicts)
    files[0].touch()  # a log written again after the worker read it
    assert sorted(load_records(saved)) == [str(f) for f in files[1:]]
    assert load_records(str(tmp_path / "none.pickle")) == {}
    save_records(str(tmp_path / "gone" / "records.pickle"), records)  # best effort: no raise
    assert not (tmp_path / "gone").exists()
    (tmp_path / "torn.pickle").write_bytes(b"\x80\x05trunc")
    assert load_records(str(tmp_path / "torn.pickle")) == {}


def test_merge_takes_the_workers_records_and_reads_the_rest(
    tmp_path: Path, unsharded: Path
) -> None:
    files = sorted(unsharded.glob("*.eval"))
    records = log_records(files)
    read = merge(unsharded).frame
    assert merge(unsharded, known=records).frame.equals(read)
    # a record handed over is what the merge counts (here one doctored trial shows it)
    first = str(files[0])
    uuid, row, counts = records[first][0]
    doctored = {first: [(uuid, {**row, "total_tokens": 999_999}, counts)]}
    merged = merge(unsharded, known=doctored).frame
    assert (merged["total_tokens"] == 999_999).sum() == 1
    assert len(merged) == len(read) - (len(records[first]) - 1)
    assert len(trials_frame(files)) == len(read)


STOPPABLE = [
    "run", "--model", "stub/retry", "-M", "delay=0.2", "--task", "refund",
    "--fault", "lost_reply", "--prompt", "baseline", "--prompt", "cautious",
    "--limit", "8", "--epochs", "4", "--max-connections", "2", "--workers", "2",
    "--display", "none",
]  # fmt: skip
"""Two cells of 32 trials at 0.2 s a turn and 2 connections: seconds per worker, time to stop
(and the merged report)."""


def _processes_of(log_dir: Path) -> list[int]:
    """Live processes whose command line names a path beside ``log_dir``: a forked worker
    keeps the run's (which names ``log_dir``), a fresh interpreter names its plan's file in
    the run's ``TMPDIR`` (the tests put it beside ``log_dir``)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = (entry / "stat").read_text().split(") ", 1)[1][0]
        except OSError:
            continue
        if str(log_dir.parent) in cmdline and state != "Z":
            pids.append(int(entry.name))
    return pids


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc; workers are forks on Linux")
@pytest.mark.parametrize(
    ("sig", "whole_group", "code"),
    [(signal.SIGTERM, False, 143), (signal.SIGINT, True, 130), (signal.SIGINT, False, 130)],
    ids=["sigterm-to-the-run", "ctrl-c-to-the-group", "sigint-to-the-run"],
)
def test_a_workers_run_stopped_by_a_signal_stops_its_workers_and_marks_its_summary(
    tmp_path: Path, sig: signal.Signals, whole_group: bool, code: int
) -> None:
    # SIGTERM to the parent alone (Kubernetes, `timeout`, a CI runner) must not kill it at once
    # and leave both workers running into the log directory, with no summary; nor may Ctrl-C
    # give each worker two SIGINTs, which would cut its orderly stop short.
    log_dir = tmp_path / "logs"
    cmd = [sys.executable, "-m", "twice.evals.cli", *STOPPABLE, "--log-dir", str(log_dir)]
    env = {k: v for k, v in os.environ.items() if k != FORK_ENV}
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
        start_new_session=True,  # its own group, as a shell's foreground job
    )  # fmt: skip
    deadline = time.monotonic() + 180
    while len(list(log_dir.glob("shard-*-of-2/*.eval"))) < 2:  # both workers under way
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"the workers never both started:\n{proc.communicate()[0]}")
        time.sleep(0.1)
    (os.killpg if whole_group else os.kill)(proc.pid, sig)
    out = proc.communicate(timeout=180)[0]
    assert proc.returncode == code, out
    assert f"interrupted by {sig.name}" in out and "Traceback" not in out
    assert _processes_of(log_dir) == [], "a worker outlived the run"
    summary = json.loads((log_dir / "summary.json").read_text())
    assert summary["complete"] is False and summary["interrupted"] == sig.name
    assert len(summary["missing"]) == 2
    assert all(c["errors"] == 0 for c in summary["cells"]), "cut-short trials are not crashes"
    for i in (1, 2):
        shard = json.loads((log_dir / f"shard-{i}-of-2" / "summary.json").read_text())
        assert shard["complete"] is False and shard["interrupted"] == sig.name
    # The run writes no report when no trial finished; one of what ran says it is partial,
    # counting the planned cells once (it added the summary's to the logs', each twice).
    subprocess.run(
        [sys.executable, "-m", "twice.evals.cli", "report", str(log_dir)],
        check=True, capture_output=True, env=env, timeout=180,
    )  # fmt: skip
    report = (log_dir / "report.html").read_text(encoding="utf-8")
    assert (
        f"Partial results.</b> The run was interrupted ({sig.name}): 2 planned cell(s) have no "
        "finished log"
    ) in report
    if sig is not signal.SIGTERM:
        return
    rerun = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    summary = json.loads((log_dir / "summary.json").read_text())
    assert summary["complete"] is True and summary["status"] == "complete"
    assert "missing" not in summary and "interrupted" not in summary
    assert sorted(c["trials"] for c in summary["cells"]) == [32, 32]
    assert "Partial results" not in (log_dir / "report.html").read_text(encoding="utf-8")


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="the parent-death signal is Linux's")
@pytest.mark.parametrize("fork", ["1", "0"], ids=["forked", "fresh-interpreters"])
def test_workers_of_a_run_killed_outright_stop_as_if_sent_sigterm(
    tmp_path: Path, fork: str
) -> None:
    # SIGKILL (or the OOM killer) gives the run no chance to pass anything on: the kernel
    # sends each worker SIGTERM instead, so none keeps running into the directory, a fresh
    # interpreter's as well as a fork's.
    log_dir = tmp_path / "logs"
    temp = tmp_path / "tmp"  # the run's own temporary directory, to see what it leaves there
    temp.mkdir()
    cmd = [sys.executable, "-m", "twice.evals.cli", *STOPPABLE, "--log-dir", str(log_dir)]
    env = {**os.environ, FORK_ENV: fork, "TMPDIR": str(temp)}
    proc = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
        start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 180
    while len(list(log_dir.glob("shard-*-of-2/*.eval"))) < 2:
        assert proc.poll() is None and time.monotonic() < deadline, "workers never started"
        time.sleep(0.1)
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 120
    while _processes_of(log_dir):
        assert time.monotonic() < deadline, "a worker outlived its killed run"
        time.sleep(0.2)
    assert not (log_dir / "summary.json").exists()  # never merged: the shards say it all
    for i in (1, 2):
        shard = json.loads((log_dir / f"shard-{i}-of-2" / "summary.json").read_text())
        assert shard["complete"] is False and shard["interrupted"] == "SIGTERM"
    # The run's finally never ran: its workers take its private hand-off directory with them.
    assert not list(temp.glob("twice-workers-*"))


def test_a_new_workers_run_removes_the_hand_offs_dead_runs_left(tmp_path: Path) -> None:
    # A run killed outright after its workers had ended leaves its hand-off directory with
    # nobody to remove it; the next --workers run does.
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    dead = tmp_path / f"twice-workers-{ended.pid}-abc123"
    live = tmp_path / f"twice-workers-{os.getpid()}-def456"
    other = tmp_path / "twice-workers-ghi789"  # not named after a process: not twice's
    for d in (dead, live, other):
        d.mkdir()
        (d / "records-1.pickle").write_bytes(b"x")
    assert remove_orphaned_hand_offs(str(tmp_path)) == [str(dead)]
    assert not dead.exists() and live.exists() and other.exists()


_ORPHAN = """
import os, signal, sys, time
from pathlib import Path
from twice.evals.run import write_atomic
from twice.evals.scale import _hand_off as _shards

def no_prctl(*args, **kwargs):
    raise OSError("no prctl here")

_shards.ctypes.CDLL = no_prctl  # what a POSIX system without Linux's prctl (macOS) has
if os.fork():
    time.sleep(0.5)
    os._exit(0)  # the run dies without passing anything on
def told(*args):
    # Whole or not at all: the test reads the file as soon as it exists.
    write_atomic(Path(sys.argv[1]), lambda tmp: tmp.write_text("SIGTERM"))
    os._exit(0)

signal.signal(signal.SIGTERM, told)
os.environ[_shards.PARENT_ENV] = str(os.getppid())
_shards.stop_with_parent()
assert _shards.PARENT_ENV not in os.environ
time.sleep(30)
os._exit(1)
"""


@pytest.mark.skipif(os.name != "posix", reason="POSIX re-parents an orphan; Windows does not")
def test_a_worker_without_a_parent_death_signal_notices_its_run_died(tmp_path: Path) -> None:
    # macOS has no PR_SET_PDEATHSIG: a worker watches for being re-parented instead.
    told = tmp_path / "told"
    script = tmp_path / "orphan.py"
    script.write_text(_ORPHAN)
    subprocess.run([sys.executable, str(script), str(told)], check=True, timeout=30)
    deadline = time.monotonic() + 10
    while not told.exists():
        assert time.monotonic() < deadline, "the orphaned worker never got SIGTERM"
        time.sleep(0.1)
    assert told.read_text() == "SIGTERM"


_TOLD_TWICE = """
import ctypes, os, signal, time
from twice.evals.scale import _hand_off as _shards

os.environ[_shards.PARENT_ENV] = str(os.getppid())
_shards.stop_with_parent()
terms = []
signal.signal(signal.SIGTERM, lambda *_: terms.append(1))  # as a running worker's handler
sent = ctypes.c_int()
ctypes.CDLL(None).prctl(2, ctypes.byref(sent))  # PR_GET_PDEATHSIG: what the kernel will send
for _ in range(3):  # the run's threads die one by one: the kernel reports each
    os.kill(os.getpid(), sent.value)
    time.sleep(0.2)
print(len(terms))
"""


@pytest.mark.skipif(sys.platform != "linux", reason="the parent-death signal is Linux's")
def test_a_worker_told_its_run_died_more_than_once_is_stopped_once(tmp_path: Path) -> None:
    # A run killed outright dies thread by thread, and the kernel sends a worker the
    # parent-death signal for each thread it is handed to (seen: twice in 3 kills of a
    # 5-thread parent). When that was SIGTERM, the second one raised KeyboardInterrupt in the
    # middle of the worker's orderly stop (once, a worker hung there past 120 s) or, after
    # the stop, killed it before it wrote its shard's summary.
    script = tmp_path / "told_twice.py"
    script.write_text(_TOLD_TWICE)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "1"


def test_a_workers_run_stopped_before_any_shard_began_marks_its_summary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Fresh-interpreter workers spend seconds importing: a signal then finds no log to merge.
    from twice.evals.scale import _workers

    monkeypatch.setattr(_workers, "run_with_workers", lambda *a: ([], {}, "SIGTERM"))
    suite = suite_from_flags(
        config=None, models=["stub/retry", "stub/verify"], prompts=["baseline"],
        tasks=["refund"], faults=["none"], protections=[], epochs=None, limit=1,
    )  # fmt: skip
    result = _workers.run_parallel(WorkerPlan(suite, tmp_path), 2, report=False)
    assert result.interrupted == "SIGTERM" and result.exit_code == 143
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["complete"] is False and summary["status"] == "incomplete"
    assert summary["interrupted"] == "SIGTERM" and len(summary["missing"]) == 2


class _Proc:
    """A worker that has ended once it has been polled ``runs_for`` times."""

    def __init__(self, runs_for: int) -> None:
        self.left = runs_for

    def poll(self) -> int | None:
        self.left -= 1
        return 0 if self.left < 0 else None


def _seen_by_idle(procs: list[_Proc]) -> tuple[list[list[bool]], Callable[[], None]]:
    seen: list[list[bool]] = []

    def idle() -> None:  # which workers still ran when it was called
        seen.append([p.left >= 0 for p in procs])

    return seen, idle


def test_idle_runs_once_when_the_first_worker_ends_and_another_still_runs() -> None:
    procs = [_Proc(50), _Proc(3)]
    seen, idle = _seen_by_idle(procs)
    wait_for_first([("1/2", procs[0]), ("2/2", procs[1])], idle)
    assert seen == [[True, False]]  # called once, with worker 1 still running


def test_idle_is_not_called_when_no_worker_runs_on_after_the_first() -> None:
    for procs in ([_Proc(3), _Proc(3)], [_Proc(3)]):
        seen, idle = _seen_by_idle(procs)
        wait_for_first([(str(i), p) for i, p in enumerate(procs)], idle)
        assert seen == []


def test_an_idle_that_fails_does_not_stop_the_run() -> None:
    def broken() -> None:
        raise RuntimeError("the head start failed")

    procs = [_Proc(10), _Proc(1)]
    t0 = time.perf_counter()
    wait_for_first([("1/2", procs[0]), ("2/2", procs[1])], broken)
    assert procs[0].left > 0  # returned without waiting for the last worker
    assert time.perf_counter() - t0 < 10 * _FIRST_EXIT_POLL


def test_prepare_report_loads_the_comparison_libraries_and_the_template() -> None:
    code = (
        "import sys, json; import twice.evals.cli; from twice.reports import _html; "
        "before = 'statsmodels' in sys.modules or 'scipy.stats' in sys.modules; "
        "_html.prepare_report(); "
        "print(json.dumps([before, 'statsmodels.stats.proportion' in sys.modules, "
        "'scipy.stats' in sys.modules, len(_html._ENV.cache or {})]))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [False, True, True, 1]


def test_a_refused_workers_rerun_gives_the_workers_reason_once(
    twice: Twice, tmp_path: Path
) -> None:
    # The failing path: the parent wrapped the worker's whole stderr, usage text and all, in
    # its own ("worker 1/2 exited 2: twice: running ... Usage: twice run [OPTIONS] ...").
    log_dir = tmp_path / "logs"
    four = [a if a != "1" else "2" for a in ONE_CELL]  # --limit 2
    assert twice("run", *four, *FOUR_FAULTS, "--workers", "2", "--log-dir", log_dir).exit_code == 0
    result = twice("run", *ONE_CELL, *FOUR_FAULTS, "--workers", "2", "--log-dir", log_dir)
    assert result.exit_code == 2, result.output
    assert result.stderr.count("error: ") == 1 and "Usage:" not in result.stderr, result.stderr
    # ... said as one process says it: the run's arguments, not a worker's.
    assert "\nerror: log directory " in result.stderr, result.stderr
    assert "refused the run" not in result.stderr, result.stderr
    assert "run with 2 sample(s) × 1 epoch(s); this run asks for 1 × 1" in result.stderr


def test_a_missing_api_key_under_workers_reads_as_it_does_in_one_process(
    twice: Twice, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The failing path: the default suite runs as 2 workers nobody asked for, and a new
    # user's first run without a key said "worker 1/2 refused the run: could not load ...".
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.chdir(tmp_path)  # no .env on the way up
    args = ["run", "--model", "openai/gpt-5-mini", "--task", "refund", *FOUR_FAULTS]
    one = twice(*args, "--workers", "1", "--log-dir", tmp_path / "one")
    two = twice(*args, "--workers", "2", "--log-dir", tmp_path / "two")
    assert one.exit_code == two.exit_code == 2, (one.output, two.output)
    said = [r.stderr[r.stderr.index("error: ") :] for r in (one, two)]
    assert said[0].startswith("error: could not load model 'openai/gpt-5-mini'"), said[0]
    assert said[1] == said[0], said


class _CountedWorker:
    """A worker that ends after some polls; the class tracks how many run at once."""

    live: ClassVar[list[_CountedWorker]] = []
    most: ClassVar[int] = 0

    def __init__(self, plan: WorkerPlan, shard: Shard, *args: Any) -> None:
        self.shard = str(shard)
        self.left = 10  # polls: more than starting the other four takes
        self.signals: list[int] = []
        _CountedWorker.live.append(self)
        _CountedWorker.most = max(_CountedWorker.most, len(_CountedWorker.live))

    def poll(self) -> int | None:
        if self.left > 0:
            self.left -= 1
            return None
        if self in _CountedWorker.live:
            _CountedWorker.live.remove(self)
        return 0

    def wait(self) -> int:
        while self.poll() is None:
            pass
        return 0

    def send_signal(self, signum: int) -> None:
        self.signals.append(signum)


@pytest.fixture
def counted_workers(monkeypatch: pytest.MonkeyPatch) -> type[_CountedWorker]:
    from twice.evals.scale import _processes as _shards

    _CountedWorker.live, _CountedWorker.most = [], 0
    monkeypatch.setattr(_shards, "_can_fork", lambda: True)
    monkeypatch.setattr(_shards, "_fork_worker", _CountedWorker)
    monkeypatch.setattr(_shards, "_FIRST_EXIT_POLL", 0.001)
    return _CountedWorker


@pytest.mark.parametrize(("at_once", "most"), [(None, 5), (2, 2), (1, 1), (9, 5)])
def test_workers_run_at_most_at_once_at_a_time(
    counted_workers: type[_CountedWorker], tmp_path: Path, at_once: int | None, most: int
) -> None:
    # A rerun of a directory a cluster split 20 ways started 20 processes at once here.
    exits = run_workers(WorkerPlan(Suite(()), tmp_path), 5, at_once=at_once)
    assert [str(w.shard) for w in exits] == [f"{i}/5" for i in range(1, 6)]
    assert {w.returncode for w in exits} == {0}
    assert counted_workers.most == most


def test_a_signal_while_shards_wait_their_turn_starts_no_more(
    counted_workers: type[_CountedWorker], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    poll, sent = _CountedWorker.poll, []

    def signalled_once(self: _CountedWorker) -> int | None:
        if self.shard == "1/3" and self.left == 1 and not sent:
            sent.append(True)
            os.kill(os.getpid(), signal.SIGTERM)  # the run's handler passes it on
        return poll(self)

    monkeypatch.setattr(_CountedWorker, "poll", signalled_once)
    exits = run_workers(WorkerPlan(Suite(()), tmp_path), 3, at_once=1)
    assert [(str(w.shard), w.interrupted) for w in exits] == [("1/3", "SIGTERM")]
    assert counted_workers.most == 1


def test_a_log_lost_before_the_workers_merge_exits_1_as_in_one_process(
    twice: Twice, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # It was wrapped as a usage error: exit 2 and "Usage:" text, where one process says the
    # log vanished and exits 1 (the logs stay; the same command resumes).
    from twice.evals.scale import _workers
    from twice.reports import LogReadError

    def lost(*args: Any, **kwargs: Any) -> Any:
        raise LogReadError("logs/shard-1-of-2/x.eval vanished while it was read")

    monkeypatch.setattr(_workers, "run_with_workers", lambda *a: ([], {}, None))
    monkeypatch.setattr(_workers, "merge", lost)
    result = twice("run", *SUITE, "--workers", "2", "--log-dir", tmp_path / "logs")
    assert result.exit_code == 1, result.output
    assert "could not merge the workers' logs: logs/shard-1-of-2/x.eval vanished" in result.output
    assert "Usage:" not in result.output and "to resume" in result.output


# -- the plan a worker is given ------------------------------------------------------------------

EVERY_SETTING = [
    "--agent-cmd", "python3 agent.py", "--hang-seconds", "30", "--agent-timeout", "7.5",
    "--outage-window", "99", "--timeout", "11", "--max-retries", "5",
    "--max-connections", "3", "--epochs", "2", "-M", "temperature=0.5",
]  # fmt: skip


def test_workers_are_given_every_run_setting_in_their_plan(
    twice: Twice, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The failing path: each worker rebuilt the suite from a command line the parent wrote
    # back out of it, and --agent-timeout was not written: workers ran with the default.
    from twice.evals import scale

    plans: list[WorkerPlan] = []

    def run_parallel(plan: WorkerPlan, count: int, **kwargs: Any) -> None:
        plans.append(plan)
        raise SystemExit(0)

    monkeypatch.setattr(scale, "run_parallel", run_parallel)
    result = twice("run", *SUITE, *EVERY_SETTING, "--workers", "2", "--log-dir", tmp_path)
    assert plans, result.output
    (plan,) = plans
    assert plan.suite.agent_timeout == 7.5 and plan.suite.outage_window == 99
    assert plan.suite.agent_cmd == "python3 agent.py" and plan.suite.hang_seconds == 30
    assert plan.suite.epochs == 2 and plan.suite.limit == 3
    assert (plan.timeout, plan.max_retries, plan.max_connections) == (11, 5, 3)
    assert plan.model_args == {"temperature": 0.5}
    assert plan.log_dir == str(tmp_path)


@pytest.mark.parametrize("fresh", [False, True], ids=["forked", "fresh-interpreter"])
def test_a_worker_runs_its_shard_with_the_plans_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh: bool
) -> None:
    # A forked worker is handed the plan object; a fresh interpreter unpickles it. Either way
    # run_suite gets the suite and every setting, and the worker's outcome is a file.
    import pickle

    from twice.evals.run import RunResult
    from twice.evals.scale import _worker

    suite = suite_from_flags(
        config=None, models=["stub/retry"], prompts=[], tasks=["refund"], faults=["none"],
        protections=[], epochs=None, limit=1, agent_cmd="python3 agent.py", agent_timeout=7.5,
        outage_window=99,
    )  # fmt: skip
    plan = WorkerPlan(
        suite, tmp_path, model_args={"temperature": 0.5}, max_connections=3, display="log",
        timeout=11, max_retries=5,
    )  # fmt: skip
    calls: list[tuple[Any, Any, dict[str, Any]]] = []

    def run_suite(suite: Any, log_dir: Any, **kwargs: Any) -> RunResult:
        calls.append((suite, log_dir, kwargs))
        return RunResult(tmp_path, [], pd.DataFrame(), tmp_path / "summary.json", None,
                         ["1 trial(s) errored in x"])  # fmt: skip

    monkeypatch.setattr(_worker, "run_suite", run_suite)
    outcome, records = str(tmp_path / "outcome.json"), str(tmp_path / "records.pickle")
    if fresh:
        (tmp_path / "plan.pickle").write_bytes(pickle.dumps(plan))
        code = _worker.main([str(tmp_path / "plan.pickle"), "2/3", outcome, records])
    else:
        code = _worker.work(plan, Shard(2, 3), outcome, records)
    ((got, log_dir, kwargs),) = calls
    assert got == suite and got.agent_timeout == 7.5 and log_dir == tmp_path
    assert kwargs["shard"] == Shard(2, 3) and kwargs["report"] is False
    assert {k: kwargs[k] for k in ("model_args", "max_connections", "display")} == {
        "model_args": {"temperature": 0.5}, "max_connections": 3, "display": "log",
    }  # fmt: skip
    assert (kwargs["timeout"], kwargs["max_retries"]) == (11, 5)
    assert code == 1
    assert json.loads(Path(outcome).read_text()) == {
        "code": 1, "errors": ["1 trial(s) errored in x"],
    }  # fmt: skip


def test_a_worker_refusing_its_plan_says_why_in_its_outcome_not_on_stderr(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from twice.evals.scale import _worker

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise SuiteError("could not load model 'x/y'")

    monkeypatch.setattr(_worker, "run_suite", refuse)
    outcome = str(tmp_path / "outcome.json")
    plan = WorkerPlan(Suite(()), tmp_path)
    assert _worker.work(plan, Shard(1, 2), outcome, str(tmp_path / "r")) == 2
    assert json.loads(Path(outcome).read_text()) == {
        "code": 2, "errors": ["could not load model 'x/y'"],
    }  # fmt: skip
