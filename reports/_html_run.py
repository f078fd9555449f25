"""What was run, for the report's header: the run's own record completed from the logs, and
the order the report lists models, prompts and axes in.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from typing import Any

import pandas as pd

from ._drill import clip
from ._frame import local_path, with_agent
from ._logs import read_header
from ._storage import parent_of


def ordered(preferred: Iterable[str] | None, present: Iterable[str]) -> list[str]:
    """The values ``present``: those in ``preferred`` first, in its order, then the rest."""
    present = list(dict.fromkeys(str(v) for v in present))
    first = [v for v in (preferred or []) if v in present]
    return first + [v for v in present if v not in first]


def rank(order: list[str], value: str) -> int:
    """Where ``value`` sorts in ``order`` (after all of it when absent)."""
    return order.index(value) if value in order else len(order)


def agents_as_models(trials: pd.DataFrame) -> pd.DataFrame:
    """Name each agent under test with its model (``stub/retry · langgraph``), so every
    per-model view of the report (grids, charts, prompt comparisons) treats an agent like a
    model. Trials of twice's own loop (``react``) keep the plain model name."""
    trials = with_agent(trials)
    if not (trials["agent"] != "react").any():
        return trials
    label = trials["model"].where(
        trials["agent"] == "react", trials["model"] + " · " + trials["agent"]
    )
    return trials.assign(model=label)


def _headers(trials: pd.DataFrame) -> list[Any]:
    # One header per prompt (for its text) plus the first and last log (dates, versions):
    # bounded however many logs the run has.
    picks: dict[str, None] = {}
    logs = trials["log"].astype(str)
    for _, group in trials.assign(_log=logs).groupby("prompt", sort=False):
        picks[group["_log"].iloc[0]] = None
    if len(logs):
        picks[logs.min()] = None
        picks[logs.max()] = None
    out = []
    for log in picks:
        try:
            out.append(read_header(local_path(log)))
        except Exception:  # a missing log only costs the "what was run" details
            continue
    return out


def _span(headers: list[Any]) -> str:
    """``first start – last finish`` of the logs' evals (minutes; UTC offsets as written)."""
    started = min(str(h.eval.created) for h in headers)
    ends = [str(h.stats.completed_at) for h in headers if h.stats and h.stats.completed_at]
    first, last = _minute(started), _minute(max(ends)) if ends else ""
    return first if not last or last == first else f"{first} – {last}"


def _minute(stamp: str) -> str:
    try:
        return dt.datetime.fromisoformat(stamp).strftime("%Y-%m-%d %H:%M %Z").strip()
    except ValueError:
        return stamp


def run_info(trials: pd.DataFrame, run: dict[str, Any] | None) -> dict[str, Any]:
    """What was run: ``run`` (from ``twice run``) completed from the logs themselves."""
    run = dict(run or {})
    headers = _headers(trials) if len(trials) else []
    prompts: dict[str, dict[str, Any]] = {}
    for h in headers:
        meta = ((h.eval.metadata or {}).get("twice") or {}) if h.eval.metadata else {}
        name = meta.get("prompt")
        if name and name not in prompts:
            prompts[name] = {
                "source": meta.get("prompt_source", ""),
                "sha256": meta.get("prompt_sha256", ""),
                "text": meta.get("prompt_text", ""),
            }
    prompts.update(run.get("prompts") or {})
    for name, sha in trials.drop_duplicates("prompt")[["prompt", "prompt_sha256"]].itertuples(
        index=False
    ):
        prompts.setdefault(name, {"source": "", "sha256": sha, "text": ""})
    order = [*(run.get("prompts") or {}), *prompts]  # the run's order, then the logs'
    versions = dict(run.get("versions") or {})
    # When the trials ran, from the logs: a resumed run that reused every cell writes a new
    # run["created"], but its trials are as old as their logs.
    created = run.get("created") or ""
    if headers:
        versions = {**{k: v for k, v in (headers[0].eval.packages or {}).items()}, **versions}
        created = _span(headers)
    info = {
        "models": ordered(run.get("models"), trials["model"]),
        "prompts": {
            name: {
                "source": p.get("source", ""),
                "sha256": p.get("sha256", ""),
                "text": clip(p.get("text", ""), 20_000),
            }
            for name, p in ((n, prompts[n]) for n in ordered(order, trials["prompt"]))
            if name in prompts
        },
        "tasks": ordered(run.get("tasks"), trials["task"]),
        "faults": ordered(run.get("faults"), trials["fault"]),
        "protections": ordered(run.get("protections"), trials["protection"]),
        "epochs": run.get("epochs") or (int(trials["epoch"].max()) if len(trials) else 0),
        "versions": versions,
        "created": created,
        "suite": run.get("suite", ""),
        "sequential": run.get("sequential") if isinstance(run.get("sequential"), dict) else None,
        "log_dirs": sorted({parent_of(local_path(str(p))) for p in trials["log"].unique()}),
    }
    return info
