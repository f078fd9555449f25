"""Log headers are read once per process while their file is unchanged, and a ``--workers``
parent merges with the headers its workers read instead of reading every log again."""

from __future__ import annotations

import shutil
from collections import OrderedDict
from pathlib import Path
from typing import Any

import pytest
from synthetic_logs import SyntheticRun, write_synthetic_logs
from twice.evals.scale._hand_off import load_records, save_records
from twice.reports import _logs, log_records, read_header, read_log_dir


def _logs_of(root: Path, model: str, trials: int = 2) -> SyntheticRun:
    return write_synthetic_logs(
        root, trials=trials, models=(model,), prompts=("p",), faults=("none", "lost_reply"),
        protections=("bare",),
    )  # fmt: skip


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The header reads that reach inspect, with this process's cache empty."""
    seen: list[str] = []
    real = _logs.read_eval_log

    def counting(path: str, *args: Any, **kwargs: Any) -> Any:
        seen.append(path)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(_logs, "_HEADERS", OrderedDict())
    monkeypatch.setattr(_logs, "read_eval_log", counting)
    return seen


def test_a_header_is_read_once_while_its_log_is_unchanged(tmp_path: Path, reads: list[str]) -> None:
    path = _logs_of(tmp_path, "m/a").paths[0]
    first = read_header(path)
    assert read_header(path) is first
    assert reads == [str(path)]


def test_a_rewritten_log_is_read_again(tmp_path: Path, reads: list[str]) -> None:
    path = _logs_of(tmp_path / "a", "m/a").paths[0]
    other = _logs_of(tmp_path / "b", "m/b", trials=6).paths[0]
    assert read_header(path).eval.model == "m/a"
    shutil.copyfile(other, path)  # another size and modification time
    assert read_header(path).eval.model == "m/b"
    assert len(reads) == 2


def test_the_cache_keeps_a_bounded_number_of_headers(
    tmp_path: Path, reads: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_logs, "_HEADERS_KEPT", 1)
    first, second = _logs_of(tmp_path, "m/a").paths
    read_header(first)
    read_header(second)
    read_header(first)  # evicted by the second: read again
    assert reads == [str(first), str(second), str(first)]
    assert list(_logs._HEADERS) == [str(first)]


def test_a_worker_hands_its_headers_to_the_parent(tmp_path: Path, reads: list[str]) -> None:
    run = _logs_of(tmp_path / "logs", "m/a")
    # The worker: reads its logs (headers and trials) and hands what it read to the parent.
    records = log_records(run.paths)
    hand_off = str(tmp_path / "records.pickle")
    save_records(hand_off, records)
    assert len(reads) == len(run.paths)
    # The parent, another process: an empty cache until it loads the hand-off.
    _logs._HEADERS.clear()
    assert set(load_records(hand_off)) == {str(p) for p in run.paths}
    logs = read_log_dir(tmp_path / "logs")
    assert sorted(map(str, logs.files)) == sorted(map(str, run.paths))
    assert len(reads) == len(run.paths)  # the merge read no header again


def test_a_log_rewritten_after_the_hand_off_is_read_again(tmp_path: Path, reads: list[str]) -> None:
    run = _logs_of(tmp_path / "logs", "m/a")
    hand_off = str(tmp_path / "records.pickle")
    save_records(hand_off, log_records(run.paths))
    _logs._HEADERS.clear()
    shutil.copyfile(_logs_of(tmp_path / "b", "m/b", trials=6).paths[0], run.paths[0])
    records = load_records(hand_off)
    assert str(run.paths[0]) not in records and str(run.paths[1]) in records
    assert read_header(run.paths[0]).eval.model == "m/b"
