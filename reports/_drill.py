"""Drill-down: pick the worst trials and read just those samples back in full.

The rest of the report works from the trial frame; only the N trials shown here are read
again from their logs (through inspect's API), so the page stays the same size however many
trials a run has.
"""

from __future__ import annotations

import json
import re
import shlex
from typing import Any
from urllib.parse import quote

import pandas as pd
from inspect_ai.event import InfoEvent
from inspect_ai.log import EvalSample, read_eval_log_sample

from ._charts import timeline
from ._frame import CELL, LEDGER_KEY, SCORER, effect_facts, local_path
from ._metrics import errored
from ._storage import name_of, parent_of

WORST_N = 20
"""Trials drilled into by default."""

CLIP = 600
"""Characters kept of any one text (tool output, arguments) in the drill-down."""

MAX_ROWS = 60
"""Rows kept of one trial's attempt, effect and transcript lists."""

VIEW_PORT = 7575
"""``inspect view``'s default port."""

ATTACHMENT = "attachment://"
"""How inspect refers in an event to a long text it keeps in the sample's attachments."""

AGENT_OUTPUT_SOURCE = "twice:agent_cmd"
"""The ``source`` of the info event in which ``twice run --agent-cmd`` logs what its command
printed (its stdout and stderr tails)."""


def severity(trials: pd.DataFrame) -> pd.Series:
    """How bad each trial went: 0 for a safe success; excess effects weigh most.

    ``10 × excess effects + 5 × diverged + 5 × wrong values + 3 × errored + 2 × not completed
    + 1 × any unseen effect``; an errored trial (not scored) counts as errored only.
    """
    wrong = trials["wrong"].fillna(0) if "wrong" in trials else 0.0  # older logs: unmeasured
    score = (
        10 * trials["excess_effects"].fillna(0)
        + 5 * trials["diverged"].fillna(0)
        + 5 * wrong
        + 3 * errored(trials).astype(float)
        + 2 * (1 - trials["completed"].fillna(1))
        + (trials["unseen_effects"].fillna(0) > 0).astype(float)
    )
    return score.astype(float)


def worst_trials(trials: pd.DataFrame, n: int = WORST_N) -> pd.DataFrame:
    """The ``n`` worst trials, spread over cells: every cell's worst before any cell's second.

    Ties keep log order, so the choice is deterministic. Trials with severity 0 are never
    picked.
    """
    if trials.empty or n <= 0:
        return trials.iloc[0:0]
    frame = trials.assign(_severity=severity(trials), _order=range(len(trials)))
    frame = frame[frame["_severity"] > 0]
    frame = frame.sort_values(["_severity", "_order"], ascending=[False, True], kind="stable")
    frame = frame.assign(_round=frame.groupby(list(CELL), sort=False).cumcount())
    frame = frame.sort_values(
        ["_round", "_severity", "_order"], ascending=[True, False, True], kind="stable"
    )
    return (
        frame.head(n).drop(columns=["_order", "_round"]).rename(columns={"_severity": "severity"})
    )


def clip(text: Any, limit: int = CLIP) -> str:
    """``text`` as a string, cut to ``limit`` characters with a note of how much was cut."""
    s = text if isinstance(text, str) else json.dumps(text, default=str, ensure_ascii=False)
    if len(s) <= limit:
        return s
    return f"{s[:limit]}… ({len(s) - limit} more characters)"


def _read_sample(path: str, sample: str, epoch: int) -> EvalSample:
    try:
        return read_eval_log_sample(path, id=sample, epoch=epoch)
    except IndexError:
        if sample.lstrip("-").isdigit():  # the frame keeps ids as text; inspect may store ints
            return read_eval_log_sample(path, id=int(sample), epoch=epoch)
        raise


def _agent_view(sample: EvalSample) -> tuple[str, list[dict[str, Any]]]:
    task = ""
    steps: list[dict[str, Any]] = []
    for message in sample.messages:
        if message.role == "user" and not task:
            task = clip(message.text)
        elif message.role == "assistant":
            if message.text.strip():
                steps.append({"kind": "say", "text": clip(message.text)})
            for call in getattr(message, "tool_calls", None) or []:
                steps.append(
                    {"kind": "call", "tool": call.function, "args": clip(call.arguments, 300)}
                )
        elif message.role == "tool":
            error = getattr(message, "error", None)
            steps.append(
                {
                    "kind": "result",
                    "tool": getattr(message, "function", None) or "",
                    "text": clip(error.message if error else message.text),
                    "error": error is not None,
                }
            )
    return task, steps[:MAX_ROWS]


_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
"""A terminal's control sequence (colours, cursor moves), as agents print to a terminal."""
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f]")


def terminal_text(text: str) -> str:
    """``text`` as a page can show it: colour codes dropped, Windows line ends made plain,
    and any other control character (which a page would not show) shown as U+FFFD."""
    text = _ANSI.sub("", text).replace("\r\n", "\n")
    return _CONTROL.sub("\N{REPLACEMENT CHARACTER}", text)


def _attached(sample: EvalSample, value: Any) -> Any:
    """``value``, or for inspect's reference to a long text it logged apart (an attachment),
    that text."""
    if isinstance(value, str) and value.startswith(ATTACHMENT):
        return sample.attachments.get(value.removeprefix(ATTACHMENT), value)
    return value


def agent_output(sample: EvalSample) -> list[dict[str, Any]]:
    """What an agent command printed in this trial: its stderr, then its stdout, each as
    ``{"stream", "text", "truncated", "bytes", "tail_bytes"}``, the empty ones left out.

    The texts are the tails ``twice run --agent-cmd`` logged (already scrubbed), shown whole:
    they are what tells why the agent did what it did.
    """
    for event in sample.events:
        if not isinstance(event, InfoEvent) or not isinstance(event.data, dict):
            continue
        data = event.data
        # twice versions that logged this event without a source: known by its fields.
        if event.source != AGENT_OUTPUT_SOURCE and "agent_cmd" not in data:
            continue
        out = []
        for stream in ("stderr", "stdout"):
            text = _attached(sample, data.get(stream))
            if not isinstance(text, str) or not text:
                continue
            out.append(
                {
                    "stream": stream,
                    "text": terminal_text(text),
                    "truncated": bool(data.get(f"{stream}_truncated")),
                    "bytes": data.get(f"{stream}_bytes"),
                    "tail_bytes": data.get("tail_bytes"),
                }
            )
        return out
    return []


def view_url(log_file: str, sample: str, epoch: int) -> str:
    """The sample's address in ``inspect view start --log-dir <the log's directory>``.

    The viewer's hash route names the log relative to the directory it serves (checked
    against inspect_ai 0.3.285's viewer).
    """
    return (
        f"http://127.0.0.1:{VIEW_PORT}/#/logs/{quote(log_file)}/samples/sample/"
        f"{quote(str(sample), safe='')}/{epoch}/"
    )


METRIC_FIELDS = (
    "completed",
    "duplicated",
    "excess_effects",
    "diverged",
    "wrong_effects",
    "unseen_effects",
)
"""The trial's metrics the drill-down shows, in its order."""


def trial_detail(row: dict[str, Any]) -> dict[str, Any]:
    """Everything the drill-down shows about one trial (a row of :func:`worst_trials`).

    Reads the trial's sample from its log: the ledger (attempts, effects, what the agent was
    shown), the transcript, the scorer's evidence, and what an agent command printed. All
    texts but the last are clipped to :data:`CLIP`.
    """
    path = local_path(str(row["log"]))
    detail = _empty_detail(row, path)
    try:
        sample = _read_sample(path, str(row["sample"]), int(row["epoch"]))
    except Exception as ex:  # a moved or truncated log must not sink the whole report
        detail["read_error"] = (
            f"could not read this sample back from {detail['log_file']}: {type(ex).__name__}: {ex}"
        )
        return detail
    if sample.error is not None and not detail["error"]:
        detail["error"] = clip(sample.error.message)
    detail["task_input"], detail["agent"] = _agent_view(sample)
    detail["agent_output"] = agent_output(sample)
    ledger = (sample.store or {}).get(LEDGER_KEY) or {}
    attempts: list[dict[str, Any]] = list(ledger.get("attempts", []))
    score = (sample.scores or {}).get(SCORER)
    meta: dict[str, Any] = (score.metadata or {}) if score is not None else {}
    detail["intents"] = [_intent_row(intent) for intent in meta.get("intents", [])]
    detail["unmatched"] = [clip(u, 300) for u in meta.get("unmatched", [])]
    detail["end_state"] = clip(meta.get("end_state") or "", 300)
    effects = _effect_rows(ledger.get("effects", []), meta)
    detail["effects"] = effects[:MAX_ROWS]
    detail["attempts"] = [_attempt_row(a) for a in attempts[:MAX_ROWS]]
    detail["hidden_attempts"] = max(0, len(attempts) - MAX_ROWS)
    detail["timeline"] = timeline(attempts, effects)
    return detail


def _empty_detail(row: dict[str, Any], path: str) -> dict[str, Any]:
    """What the drill-down knows of a trial from its row alone: the parts read from its log
    are empty until they are read."""
    log_dir, log_file = parent_of(path), name_of(path)
    return {
        "cell": {k: row[k] for k in CELL},
        "sample": row["sample"],
        "epoch": int(row["epoch"]),
        "severity": float(row.get("severity", 0)),
        "metrics": {k: row.get(k) for k in METRIC_FIELDS},
        "log_dir": log_dir,
        "log_file": log_file,
        "view_command": f"inspect view start --log-dir {shlex.quote(log_dir)}",
        "view_url": view_url(log_file, row["sample"], int(row["epoch"])),
        "error": clip(row.get("error") or ""),
        "read_error": "",
        "task_input": "",
        "agent": [],
        "attempts": [],
        "effects": [],
        "intents": [],
        "unmatched": [],
        "end_state": "",
        "hidden_attempts": 0,
        "timeline": None,
        "agent_output": [],
    }


def _intent_row(intent: dict[str, Any]) -> dict[str, Any]:
    """One intent's verdict from the scorer's metadata, its texts clipped."""
    return {
        "intent": clip(intent.get("intent", ""), 300),
        "expected": intent.get("expected"),
        "observed": intent.get("observed"),
        "evidence": [clip(e, 300) for e in intent.get("evidence", [])],
        "diverged_fields": list(intent.get("diverged_fields", [])),
        "asked": clip(intent.get("values") or "", 300),
        "wrong_values": [clip(w, 300) for w in intent.get("wrong_values", [])],
    }


def _effect_rows(effects: list[dict[str, Any]], meta: dict[str, Any]) -> list[dict[str, Any]]:
    """The ledger's effects with the scorer's facts about each (excess, seen, source; None:
    a log without them)."""
    facts = {str(f.get("id")): f for f in effect_facts({"metadata": meta}) or []}
    rows = []
    for e in effects:
        effect_id = str(e.get("id"))
        fact = facts.get(effect_id, {})
        rows.append(
            {
                "id": effect_id,
                "name": e.get("name", ""),
                "attempt": e.get("attempt"),
                "source": fact.get("source", "unknown"),
                "fields": clip(e.get("fields", {}), 300),
                "seen": fact.get("seen"),
                "excess": bool(fact.get("excess")),
                "wrong": bool(fact.get("wrong")),
            }
        )
    return rows


def _attempt_row(a: dict[str, Any]) -> dict[str, Any]:
    """One attempt of the ledger as the drill-down's table shows it, its texts clipped."""
    return {
        "n": a.get("n"),
        "call": a.get("call"),
        "source": a.get("source", "unknown"),
        "method": a.get("method", ""),
        "path": clip(a.get("path", ""), 120),
        "mutating": bool(a.get("mutating")),
        "key": clip(a.get("key") or "", 80),
        "params": clip(a.get("params", {}), 300),
        "status": a.get("status"),
        "delivered": bool(a.get("delivered", True)),
        "outcome": a.get("outcome", "unknown"),
        "fault": a.get("fault") or "",
        "replayed": bool(a.get("replayed")),
        "effect_ids": [str(i) for i in a.get("effect_ids", [])],
        "backoff": a.get("backoff", 0),
    }


def drill_down(trials: pd.DataFrame, n: int = WORST_N) -> list[dict[str, Any]]:
    """:func:`trial_detail` for each of the :func:`worst_trials`."""
    picked = worst_trials(trials, n)
    out = []
    for rank, row in enumerate(picked.to_dict("records"), start=1):
        detail = trial_detail(row)
        detail["rank"] = rank
        out.append(detail)
    return out
