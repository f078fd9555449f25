"""Inspect logs → one tidy pandas frame, a row per trial.

Reads only what inspect wrote (``samples_df`` plus twice's score and task metadata), so any
log directory from ``twice run`` or ``inspect eval`` of a twice task can be reported on.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
from inspect_ai.analysis import EvalColumn, SampleColumn, samples_df

METRICS: tuple[str, ...] = (
    "completed",
    "duplicated",
    "excess_effects",
    "diverged",
    "exactly_once",
    "safe_success",
    "unseen_effects",
)
"""Per-trial metric columns (the names of DESIGN.md and of twice's scorer)."""

CELL: tuple[str, ...] = ("model", "prompt", "task", "fault", "protection")
"""The columns that identify a cell."""

SCORER = "side_effects"

_COLUMNS = [
    EvalColumn("eval_id", path="eval.eval_id", required=True),
    EvalColumn("model", path="eval.model", required=True),
    EvalColumn("task_name", path="eval.task", required=True),
    EvalColumn("eval_metadata", path="eval.metadata"),
    EvalColumn("log", path=lambda log: log.location),
    SampleColumn("sample", path="id", required=True),
    SampleColumn("epoch", path="epoch", required=True),
    SampleColumn("score", path=lambda s: _score_value(s)),
    SampleColumn("total_tokens", path=lambda s: _tokens(s)),
    SampleColumn("total_time", path="total_time"),
    SampleColumn("error", path="error"),
    SampleColumn("limit", path="limit"),
]


def _score_value(sample: Any) -> str | None:
    score = (sample.scores or {}).get(SCORER)
    return None if score is None else json.dumps(score.value)


def _tokens(sample: Any) -> int:
    return sum(u.total_tokens for u in (sample.model_usage or {}).values())


CHUNK_LOGS = 16
"""Logs read per ``samples_df`` call. inspect holds every sample summary of one call in
memory at once (1.7 GB for 100k trials); reading a few logs at a time keeps the peak to one
chunk plus the compact trial frame."""


class LogReadError(Exception):
    """A log directory that is missing, empty, or holds a log that cannot be read."""


def log_files(log_dir: str | Path) -> list[Path]:
    """The ``.eval``/``.json`` inspect logs under ``log_dir``.

    Raises:
        LogReadError: when the directory is missing or holds no logs.
    """
    root = Path(log_dir)
    if not root.is_dir():
        raise LogReadError(f"log directory {str(root)!r} does not exist")
    files = sorted(
        p
        for p in root.rglob("*")
        if p.suffix in (".eval", ".json") and p.is_file() and not p.name.startswith(("logs", "summary", "eval-set"))
        and p.name != "summary.json"
    )
    if not files:
        raise LogReadError(
            f"log directory {str(root)!r} holds no inspect logs (*.eval or *.json); "
            "run `twice run --log-dir DIR` first"
        )
    return files


def _twice_meta(value: Any) -> dict[str, Any]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return {}
    if isinstance(value, dict):
        meta = value.get("twice", {})
        return meta if isinstance(meta, dict) else {}
    return {}


def trials_frame(logs: str | Path | Sequence[str | Path]) -> pd.DataFrame:
    """Read twice logs into one row per trial.

    Columns: ``model, prompt, task, fault, protection, epoch, sample``, every per-trial metric
    (float; NaN for a trial that errored before it was scored), ``total_tokens, total_time,
    error`` (empty string when none), ``limit``, ``prompt_sha256``, ``eval_id``, ``log``.

    Args:
        logs: A log directory, or a list of log files.

    Raises:
        LogReadError: when there are no logs or one cannot be read.
    """
    paths = log_files(logs) if isinstance(logs, (str, Path)) else [Path(p) for p in logs]
    frames: list[pd.DataFrame] = []
    ids: list[pd.Series] = []
    raw = pd.DataFrame()
    for start in range(0, max(len(paths), 1), CHUNK_LOGS):
        chunk = paths[start : start + CHUNK_LOGS]
        try:
            raw = samples_df([str(p) for p in chunk], columns=_COLUMNS, quiet=True, strict=True)
        except Exception as ex:  # inspect raises several types for unreadable logs
            raise LogReadError(f"could not read inspect logs: {type(ex).__name__}: {ex}") from None
        if len(raw):
            frames.append(tidy(raw))
            ids.append(raw["sample_id"])
    if not frames:
        return tidy(raw)
    if len(frames) == 1:
        return frames[0]
    # samples_df drops repeated samples (same uuid) within one call; do the same across calls.
    keep = ~pd.concat(ids, ignore_index=True).duplicated(keep="first").to_numpy()
    return pd.concat(frames, ignore_index=True)[keep].reset_index(drop=True)


def tidy(raw: pd.DataFrame) -> pd.DataFrame:
    """Shape a raw ``samples_df`` frame (with twice's columns) into the trial frame."""
    meta: list[dict[str, Any]] = []
    if len(raw):
        # Every row of an eval carries the same metadata (a JSON string): parse it once per eval.
        by_eval: dict[Any, dict[str, Any]] = {}
        for eval_id, value in zip(raw["eval_id"], raw["eval_metadata"], strict=True):
            if eval_id not in by_eval:
                by_eval[eval_id] = _twice_meta(value)
            meta.append(by_eval[eval_id])
    frame = pd.DataFrame(
        {
            "model": raw["model"].astype(str),
            "prompt": [m.get("prompt", "?") for m in meta],
            "task": [m.get("task") or t for m, t in zip(meta, raw["task_name"], strict=True)],
            "fault": [m.get("fault", "?") for m in meta],
            "protection": [m.get("protection", "?") for m in meta],
            "epoch": raw["epoch"].astype(int),
            "sample": raw["sample"].astype(str),
        }
    )
    scores = [_score_dict(v) for v in raw["score"]] if len(raw) else []
    for name in METRICS:
        frame[name] = pd.Series([s.get(name) for s in scores], index=frame.index, dtype="float64")
    frame["total_tokens"] = pd.to_numeric(raw["total_tokens"], errors="coerce").fillna(0).astype(int)
    frame["total_time"] = pd.to_numeric(raw["total_time"], errors="coerce").astype(float)
    frame["error"] = raw["error"].fillna("").astype(str)
    frame["limit"] = raw["limit"].fillna("").astype(str)
    frame["prompt_sha256"] = [m.get("prompt_sha256", "") for m in meta]
    frame["eval_id"] = raw["eval_id"].astype(str)
    frame["log"] = raw["log"].astype(str)
    return frame


def _score_dict(value: Any) -> dict[str, float]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return {}
    return value if isinstance(value, dict) else {}
