"""Inspect logs → one tidy pandas frame, a row per trial.

Reads only what inspect wrote (each log's header, and per sample twice's score, the ledger
twice keeps in the sample store, usage, time, error and limit), so any log directory from
``twice run`` or ``inspect eval`` of a twice task can be reported on.
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
from inspect_ai.log import read_eval_log

# Who sent a mutating attempt is the ledger's vocabulary (``Attempt.source``): one tuple, so a
# source added there gets its frame columns here, ``attempts_<source>`` (mutating attempts it
# sent) and ``excess_<source>`` (excess effects committed by those attempts).
from twice.mocks import RETRY_SOURCES as RETRY_SOURCES

# Re-exported: the frame's modules name a cell's columns from here.
from ._cell import CELL as CELL
from ._cell import DEFAULT_AGENT as DEFAULT_AGENT
from ._logs import read_header, read_log_dir
from ._metrics import CATALOGUE
from ._storage import Location, LogReadError, as_location, is_remote, name_of, open_binary

METRICS: tuple[str, ...] = tuple(m.column for m in CATALOGUE)
"""Per-trial metric columns: the catalogue's columns, which are the names twice's scorer writes
(``assertions.METRICS``)."""

AGENT_KEY = "twice:agent"
"""Store key under which an agent under test records ``{"agent", "crashed", "error"}``."""

SCORER = "side_effects"

LEDGER_KEY = "twice:ledger"
"""Store key under which twice's tools keep the trial's ledger."""

LEDGER_COLUMNS: tuple[str, ...] = (
    "crashed",
    "attempts",
    "effects",
    *(f"attempts_{s}" for s in RETRY_SOURCES),
    *(f"excess_{s}" for s in RETRY_SOURCES),
)
"""Frame columns computed from each trial's store: ``crashed`` (1.0 when the agent under test
raised; the trial is still scored from the ledger), then the ledger's counts."""

PARSE_SHAPES: tuple[str, ...] = ("tag", "fenced", "bare", "text", "unparseable")
"""How twice's local model server read each reply (its ``twice_parse.shape``, kept by inspect
in every model event's raw response): a tool call in ``<tool_call>`` tags, in a fenced code
block, as the bare JSON reply; plain text; or a call attempt it could not parse."""

PARSE_COLUMNS: tuple[str, ...] = tuple(f"parse_{s}" for s in PARSE_SHAPES)
"""Frame columns counting a trial's replies per parse shape (NaN for other models)."""

RAW_COLUMNS: tuple[str, ...] = (
    "eval_id",
    "model",
    "task_name",
    "eval_metadata",
    "log",
    "sample",
    "epoch",
    "score",
    "total_tokens",
    "total_time",
    "error",
    "limit",
)
"""Columns of the raw per-sample frame that :func:`tidy` shapes (what ``samples_df`` gives;
twice's own reader adds ``agent_error``, read from the sample store)."""


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


def trials_frame(logs: Location | Sequence[Location]) -> pd.DataFrame:
    """Read twice logs into one row per trial.

    Columns: ``model, agent, prompt, task, fault, protection, epoch, sample``, every per-trial
    metric (float; NaN for a trial that errored before it was scored), ``total_tokens, total_time,
    error`` (empty string when none), ``limit``, ``agent_error`` (what a crashed agent under
    test raised; the trial is still scored), ``prompt_sha256``, ``eval_id``, ``log``, and
    the ledger counts of :data:`LEDGER_COLUMNS`: mutating ``attempts`` and committed
    ``effects``, then per retry source the attempts it sent and the excess effects it caused
    (the effects beyond an intent's expected count, and effects matching no intent, are
    charged to the source of the attempt that committed them; NaN when the trial was not
    scored), and :data:`PARSE_COLUMNS`: how many of the trial's replies twice's local model
    server read in each shape (NaN for models it did not serve).

    Args:
        logs: A log directory (a path or an fsspec URI such as ``s3://bucket/run``), whose
            counted logs are read (:func:`read_log_dir`: the newest log of each task of the
            last run, as ``summary.json`` and ``twice gate`` count), or a list of log files,
            all read (paths, ``file://`` URIs as in ``EvalLog.location``, or fsspec URIs).

    Raises:
        LogReadError: when there are no logs or one cannot be read.
    """
    if isinstance(logs, (str, Path)):
        paths = read_log_dir(logs).files
    else:  # EvalLog.location is a file:// URI for logs eval_set found on disk
        paths = [as_location(str(p)) for p in logs]
    return frame_of(paths, log_records(paths))


LogRecords = dict[str, list[tuple[str | None, dict[str, Any], dict[str, float]]]]
"""What :func:`trials_frame` reads from each log, by ``str(path)``: per sample its uuid, its
row of summary columns and its ledger and parse counts. A ``--workers`` run hands these from
its workers to the parent, which would otherwise read every log again."""


def log_records(paths: Sequence[Location]) -> LogRecords:
    """Read every log of ``paths`` once (see :func:`trials_frame`).

    Raises:
        LogReadError: naming a log that cannot be read.
    """
    out: LogRecords = {}
    for path in paths:
        try:
            out[str(path)] = _read_log(path)
        except LogReadError:
            raise
        except Exception as ex:  # inspect and zipfile raise several types for unreadable logs
            raise LogReadError(
                f"could not read inspect log {str(path)!r}: {type(ex).__name__}: {ex}"
            ) from None
    return out


def frame_of(paths: Sequence[Location], records: LogRecords) -> pd.DataFrame:
    """The trial frame of ``paths`` from their records (every path must have them)."""
    rows: list[dict[str, Any]] = []
    counts: list[dict[str, float]] = []
    seen: set[str] = set()
    for path in paths:
        for uuid, row, count in records[str(path)]:
            # A sample found twice (a copied log, a directory read twice) is one trial, as in
            # samples_df: keep the first.
            if uuid:
                if uuid in seen:
                    continue
                seen.add(uuid)
            rows.append(row)
            counts.append(count)
    raw = pd.DataFrame(rows, columns=[*RAW_COLUMNS, "agent_error"])
    frame = tidy(raw)
    columns = [*LEDGER_COLUMNS, *PARSE_COLUMNS]
    extra = pd.DataFrame(counts, index=frame.index, columns=columns, dtype="float64")
    return pd.concat([frame, extra], axis=1)


def _read_log(path: Location) -> list[tuple[str | None, dict[str, Any], dict[str, float]]]:
    # One pass per log: the header through inspect, then every sample's JSON once for both
    # the summary columns and the ledger (samples_df plus a ledger pass read everything
    # twice: 10k trials took ~4x longer).
    log = read_header(path)
    header = log.eval
    common = {
        "eval_id": header.eval_id,
        "model": header.model,
        "task_name": header.task,
        # one string per log, so tidy() parses each eval's metadata once
        "eval_metadata": json.dumps(header.metadata or {}, default=str),
        "log": log_uri(path),
    }
    out = []
    for sample in sample_records(path):
        score = (sample.get("scores") or {}).get(SCORER)
        error = sample.get("error")
        limit = sample.get("limit")
        usage = sample.get("model_usage") or {}
        row = {
            **common,
            "sample": sample.get("id"),
            "epoch": sample.get("epoch", 1),
            "score": score.get("value") if isinstance(score, dict) else None,
            "total_tokens": sum(int(u.get("total_tokens") or 0) for u in usage.values()),
            "total_time": sample.get("total_time"),
            "error": error.get("message") if isinstance(error, dict) else error,
            "limit": limit.get("type") if isinstance(limit, dict) else limit,
            "agent_error": _agent_error(sample.get("store")),
        }
        count = {**ledger_counts(sample.get("store"), score), **parse_counts(sample.get("events"))}
        out.append((sample.get("uuid"), row, count))
    claimed = log.results.completed_samples if log.status == "success" and log.results else 0
    if len(out) < claimed:
        # Counting what is there would rate a damaged log's survivors as the cell's trials.
        raise LogReadError(
            f"inspect log {str(path)!r} finished with {claimed} trial(s) but holds "
            f"{len(out)}: it was damaged or cut after it was written; delete it and rerun "
            "the same twice run command to run its trials again"
        )
    return out


def parse_counts(events: list[dict[str, Any]] | None) -> dict[str, float]:
    """The :data:`PARSE_COLUMNS` of one trial from its events (all NaN when no model event
    came from twice's local model server)."""
    found = dict.fromkeys(PARSE_SHAPES, 0.0)
    seen = False
    for event in events or []:
        if event.get("event") != "model":
            continue
        response = (event.get("call") or {}).get("response")
        parse = response.get("twice_parse") if isinstance(response, dict) else None
        shape = parse.get("shape") if isinstance(parse, dict) else None
        if shape in found:
            found[shape] += 1
            seen = True
    return {f"parse_{k}": (v if seen else math.nan) for k, v in found.items()}


def with_agent(trials: pd.DataFrame) -> pd.DataFrame:
    """The frame with an ``agent`` column: a frame built before the agent axis (by hand, or by
    older code) is twice's own loop, ``react``."""
    return trials if "agent" in trials else trials.assign(agent=DEFAULT_AGENT)


def _agent_error(store: dict[str, Any] | None) -> str:
    """What a crashed agent under test raised (empty when it did not crash)."""
    agent = (store or {}).get(AGENT_KEY)
    return str(agent.get("error") or "") if isinstance(agent, dict) else ""


def tidy(raw: pd.DataFrame) -> pd.DataFrame:
    """Shape a raw frame with twice's columns into the trial frame.

    ``raw`` has one row per sample and the columns :data:`RAW_COLUMNS` (what
    ``samples_df`` gives for the same fields, so a ``samples_df`` frame works too).
    """
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
            "agent": [m.get("agent") or DEFAULT_AGENT for m in meta],
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
    agent_error = raw["agent_error"] if "agent_error" in raw else pd.Series("", index=raw.index)
    frame["agent_error"] = agent_error.fillna("").astype(str)
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


def log_uri(path: Location) -> str:
    """How the ``log`` column names a log: its URI (``file://`` for a local file)."""
    return str(path) if is_remote(path) else Path(path).resolve().as_uri()


def local_path(location: str) -> str:
    """A log's filesystem path from the ``log`` column (inspect writes ``file://`` URIs)."""
    if location.startswith("file://"):
        return os.path.abspath(unquote(urlparse(location).path))
    return os.path.abspath(location) if "://" not in location else location


def sample_records(path: Location) -> Iterator[dict[str, Any]]:
    """Every sample of one log as plain JSON (``id, epoch, store, scores, ...``).

    ``.eval`` logs are zip files holding one JSON member per sample; parsing those members
    directly is about 20x faster than validating them into inspect's ``EvalSample`` (1080 demo
    samples: 0.3 s instead of ~5 s), which matters because the report needs every trial's
    ledger. Any other log goes through inspect's reader. ``path`` may be an fsspec URI.
    """
    if name_of(path).endswith(".eval"):
        with open_binary(path) as f:
            if zipfile.is_zipfile(f):
                f.seek(0)
                with zipfile.ZipFile(f) as z:
                    for name in z.namelist():
                        if name.startswith("samples/") and name.endswith(".json"):
                            yield json.loads(z.read(name))
                return
    log = read_eval_log(str(path))
    for sample in log.samples or []:
        yield sample.model_dump(mode="json", exclude={"messages", "attachments"})


def _source(value: Any) -> str:
    return value if value in RETRY_SOURCES else "unknown"


def effect_facts(score: dict[str, Any] | None) -> list[dict[str, Any]] | None:
    """The scorer's per-effect facts (``id, name, attempt, source, intent, excess, seen``).

    twice's ``side_effects`` scorer writes them into its score metadata: the report reads
    them instead of re-deriving excess and seen from the raw ledger. None when the trial was
    not scored, or was scored by a twice older than these facts.
    """
    meta = (score or {}).get("metadata")
    facts = meta.get("effects") if isinstance(meta, dict) else None
    if not isinstance(facts, list):
        return None
    return [f for f in facts if isinstance(f, dict)]


def ledger_counts(store: dict[str, Any] | None, score: dict[str, Any] | None) -> dict[str, float]:
    """The :data:`LEDGER_COLUMNS` of one trial, from its store and its ``side_effects`` score.

    Attempts are counted from the ledger; which effects are excess, and whose attempt
    committed them, come from the scorer's per-effect facts (:func:`effect_facts`).

    Args:
        store: The sample's store (the ledger is under :data:`LEDGER_KEY`).
        score: The ``side_effects`` score as JSON (``value`` and ``metadata``), or None.
    """
    ledger = (store or {}).get(LEDGER_KEY) or {}
    attempts = [a for a in ledger.get("attempts", []) if isinstance(a, dict)]
    effects = [e for e in ledger.get("effects", []) if isinstance(e, dict)]
    agent = (store or {}).get(AGENT_KEY) or {}
    crashed = float(bool(agent.get("crashed"))) if isinstance(agent, dict) else 0.0
    out: dict[str, float] = {
        "crashed": crashed,
        "attempts": 0.0,
        "effects": float(len(effects)),
    }
    for s in RETRY_SOURCES:
        out[f"attempts_{s}"] = 0.0
        out[f"excess_{s}"] = 0.0
    for a in attempts:
        if a.get("mutating"):
            out["attempts"] += 1
            out[f"attempts_{_source(a.get('source'))}"] += 1
    facts = effect_facts(score)
    if facts is None:
        for s in RETRY_SOURCES:
            out[f"excess_{s}"] = math.nan
        return out
    for fact in facts:
        if fact.get("excess"):
            out[f"excess_{_source(fact.get('source'))}"] += 1
    return out
