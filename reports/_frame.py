"""Inspect logs → one tidy pandas frame, a row per trial.

Reads only what inspect wrote (``samples_df`` plus twice's score and task metadata, and the
ledger twice keeps in each sample's store), so any log directory from ``twice run`` or
``inspect eval`` of a twice task can be reported on.
"""

from __future__ import annotations

import json
import math
import os
import zipfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import pandas as pd
from inspect_ai.analysis import EvalColumn, SampleColumn, samples_df
from inspect_ai.log import read_eval_log

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

LEDGER_KEY = "twice:ledger"
"""Store key under which twice's tools keep the trial's ledger."""

RETRY_SOURCES: tuple[str, ...] = ("initial", "transport", "model", "resume", "unknown")
"""Who sent a mutating attempt: the first try, the tool layer's retry loop, the model calling
the tool again, a resumed run, or a client that did not say. Each gets two frame columns:
``attempts_<source>`` (mutating attempts it sent) and ``excess_<source>`` (excess effects
committed by those attempts)."""

LEDGER_COLUMNS: tuple[str, ...] = (
    "attempts",
    "effects",
    *(f"attempts_{s}" for s in RETRY_SOURCES),
    *(f"excess_{s}" for s in RETRY_SOURCES),
)
"""Frame columns computed from each trial's ledger."""

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
        if p.suffix in (".eval", ".json")
        and p.is_file()
        and not p.name.startswith(("logs", "summary", "eval-set"))
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
    error`` (empty string when none), ``limit``, ``prompt_sha256``, ``eval_id``, ``log``, and
    the ledger counts of :data:`LEDGER_COLUMNS`: mutating ``attempts`` and committed
    ``effects``, then per retry source the attempts it sent and the excess effects it caused
    (the effects beyond an intent's expected count, and effects matching no intent, are
    charged to the source of the attempt that committed them; NaN when the trial was not
    scored).

    Args:
        logs: A log directory, or a list of log files.

    Raises:
        LogReadError: when there are no logs or one cannot be read.
    """
    paths = log_files(logs) if isinstance(logs, (str, Path)) else [Path(p) for p in logs]
    try:
        raw = samples_df([str(p) for p in paths], columns=_COLUMNS, quiet=True, strict=True)
    except Exception as ex:  # inspect raises several types for unreadable logs
        raise LogReadError(f"could not read inspect logs: {type(ex).__name__}: {ex}") from None
    frame = tidy(raw)
    return with_ledger_counts(frame, paths)


def tidy(raw: pd.DataFrame) -> pd.DataFrame:
    """Shape a raw ``samples_df`` frame (with twice's columns) into the trial frame."""
    # Every trial of an eval carries the same metadata: parse each distinct value once.
    parsed: dict[Any, dict[str, Any]] = {}

    def meta_of(value: Any) -> dict[str, Any]:
        key = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
        if key not in parsed:
            parsed[key] = _twice_meta(value)
        return parsed[key]

    meta = [meta_of(v) for v in raw["eval_metadata"]] if len(raw) else []
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
    frame["total_tokens"] = (
        pd.to_numeric(raw["total_tokens"], errors="coerce").fillna(0).astype(int)
    )
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


def local_path(location: str) -> str:
    """A log's filesystem path from the ``log`` column (inspect writes ``file://`` URIs)."""
    if location.startswith("file://"):
        return os.path.abspath(unquote(urlparse(location).path))
    return os.path.abspath(location) if "://" not in location else location


def sample_records(path: str | Path) -> Iterator[dict[str, Any]]:
    """Every sample of one log as plain JSON (``id, epoch, store, scores, ...``).

    ``.eval`` logs are zip files holding one JSON member per sample; parsing those members
    directly is about 20x faster than validating them into inspect's ``EvalSample`` (1080 demo
    samples: 0.3 s instead of ~5 s), which matters because the report needs every trial's
    ledger. Any other log goes through inspect's reader.
    """
    p = Path(path)
    if p.suffix == ".eval" and zipfile.is_zipfile(p):
        with zipfile.ZipFile(p) as z:
            for name in z.namelist():
                if name.startswith("samples/") and name.endswith(".json"):
                    yield json.loads(z.read(name))
        return
    log = read_eval_log(str(p))
    for sample in log.samples or []:
        yield sample.model_dump(mode="json", include={"id", "epoch", "store", "scores", "error"})


def _source(attempt: dict[str, Any]) -> str:
    source = attempt.get("source")
    return source if source in RETRY_SOURCES else "unknown"


def ledger_counts(store: dict[str, Any] | None, score: dict[str, Any] | None) -> dict[str, float]:
    """The :data:`LEDGER_COLUMNS` of one trial, from its store and its ``side_effects`` score.

    Args:
        store: The sample's store (the ledger is under :data:`LEDGER_KEY`).
        score: The ``side_effects`` score as JSON (``value`` and ``metadata``), or None.
    """
    ledger = (store or {}).get(LEDGER_KEY) or {}
    attempts = [a for a in ledger.get("attempts", []) if isinstance(a, dict)]
    effects = [e for e in ledger.get("effects", []) if isinstance(e, dict)]
    out: dict[str, float] = {"attempts": 0.0, "effects": float(len(effects))}
    for s in RETRY_SOURCES:
        out[f"attempts_{s}"] = 0.0
        out[f"excess_{s}"] = 0.0
    for a in attempts:
        if a.get("mutating"):
            out["attempts"] += 1
            out[f"attempts_{_source(a)}"] += 1
    meta = (score or {}).get("metadata")
    if not isinstance(meta, dict):
        for s in RETRY_SOURCES:
            out[f"excess_{s}"] = math.nan
        return out
    by_n = {a.get("n"): a for a in attempts}
    source_of = {e.get("id"): _source(by_n.get(e.get("attempt"), {})) for e in effects}
    claimed: set[Any] = set()
    excess: list[Any] = []
    for intent in meta.get("intents", []):
        ids = list(intent.get("effects", []))
        claimed.update(ids)
        excess += ids[max(0, int(intent.get("expected", 1))) :]  # the later ones are the repeats
    excess += [e.get("id") for e in effects if e.get("id") not in claimed]
    for effect_id in excess:
        out[f"excess_{source_of.get(effect_id, 'unknown')}"] += 1
    return out


def with_ledger_counts(frame: pd.DataFrame, paths: Sequence[str | Path]) -> pd.DataFrame:
    """Add :data:`LEDGER_COLUMNS` to a trial frame by reading each trial's ledger from ``paths``.

    Raises:
        LogReadError: when a log cannot be read.
    """
    counts: dict[tuple[str, str, int], dict[str, float]] = {}
    for p in paths:
        key_path = local_path(str(p))
        try:
            for sample in sample_records(p):
                score = (sample.get("scores") or {}).get(SCORER)
                counts[(key_path, str(sample.get("id")), int(sample.get("epoch", 1)))] = (
                    ledger_counts(sample.get("store"), score)
                )
        except (OSError, ValueError, zipfile.BadZipFile) as ex:
            raise LogReadError(f"could not read the ledgers in {str(p)!r}: {ex}") from None
    blank = dict.fromkeys(LEDGER_COLUMNS, math.nan)
    keys = zip(frame["log"].map(local_path), frame["sample"], frame["epoch"], strict=True)
    rows = [counts.get((log, sample, int(epoch)), blank) for log, sample, epoch in keys]
    extra = pd.DataFrame(rows, index=frame.index, columns=list(LEDGER_COLUMNS), dtype="float64")
    return pd.concat([frame, extra], axis=1)
