"""What the report says of trials that did not score cleanly (errored trials, agents that
raised, how a local model's replies were parsed) and of a run that did not finish.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from ._drill import clip
from ._frame import CELL, PARSE_COLUMNS, PARSE_SHAPES
from ._html_run import agents_as_models
from ._metrics import errored


def errors(trials: pd.DataFrame) -> list[dict[str, Any]]:
    """Cells with errored trials (not scored), with their commonest messages."""
    out = []
    for cell, group in trials[errored(trials)].groupby(list(CELL), sort=True):
        messages = group["error"].replace("", "(not scored)").value_counts().head(3)
        out.append(
            {
                **dict(zip(CELL, cell, strict=True)),
                "count": len(group),
                "messages": [{"text": clip(m, 400), "count": int(c)} for m, c in messages.items()],
            }
        )
    return out


def agent_crashes(trials: pd.DataFrame) -> list[dict[str, Any]]:
    """Cells where the agent under test raised: scored results, listed with what it raised."""
    if "crashed" not in trials:
        return []
    crashed = trials[trials["crashed"] == 1]
    totals = trials.groupby(list(CELL), sort=False).size()
    out = []
    for cell, group in crashed.groupby(list(CELL), sort=True):
        messages = group["agent_error"].replace("", "(no message)").value_counts().head(3)
        out.append(
            {
                **dict(zip(CELL, cell, strict=True)),
                "count": len(group),
                "trials": int(totals[cell]),
                "messages": [{"text": clip(m, 400), "count": int(c)} for m, c in messages.items()],
            }
        )
    return out


def parsing(trials: pd.DataFrame) -> list[dict[str, Any]]:
    """Per model, how twice's local model server read its replies (tool-call shapes)."""
    if not set(PARSE_COLUMNS) <= set(trials.columns):
        return []
    out = []
    for model, group in trials.groupby("model", sort=False):
        counted = group[list(PARSE_COLUMNS)].dropna(how="all")
        if counted.empty:
            continue
        sums = {s: int(counted[f"parse_{s}"].sum()) for s in PARSE_SHAPES}
        out.append({"model": model, "trials": len(counted), "replies": sum(sums.values()), **sums})
    return out


def partial_note(status: Mapping[str, Any] | None) -> str | None:
    """What the report says first when it covers part of a run, from ``summary.json``'s
    ``status``/``interrupted``/``missing``/``missing_logs``/``errored`` (None: the run is
    complete)."""
    if not status:
        return None
    cells, logs = len(status.get("missing") or []), len(status.get("missing_logs") or [])
    errored = status.get("errored") if isinstance(status.get("errored"), int) else 0
    if status.get("status") == "running":
        why = "The run is still going"
    elif status.get("interrupted"):
        why = f"The run was interrupted ({status['interrupted']})"
    elif cells or logs or errored or status.get("complete") is False:
        why = "The run is incomplete"
    else:
        return None
    if cells:
        left = f": {cells} planned cell(s) have no finished log"
    elif logs:
        left = f": {logs} planned log(s) are missing"
    elif errored:
        left = f": {errored} trial(s) errored and are left out of the rates"
    else:
        left = ""
    note = (
        f"{why}{left}. These rates cover only the trials that finished; rerun the same "
        "twice run command to finish it."
    )
    cut = [c for c in status.get("cut_short") or [] if isinstance(c, Mapping)]
    if cut:
        n = sum(int(c.get("trials") or 0) for c in cut)
        dup = sum(int(c.get("duplicated") or 0) for c in cut)
        note += (
            f" {n} trial(s) were cut short and are not in them; {dup} of those had already "
            "duplicated an action. A trial that retries runs longer, so an interrupt cuts it "
            "short first: these rates understate duplication."
        )
    return note


def cut_short_duplicators(status: Mapping[str, Any] | None) -> dict[str, int]:
    """Per model as the headline names it, the trials an interrupt cut short whose ledger
    already held a duplicate (``summary.json``'s ``cut_short``)."""
    cut = [c for c in (status or {}).get("cut_short") or [] if isinstance(c, Mapping)]
    if not cut:
        return {}
    frame = agents_as_models(pd.DataFrame(cut))
    frame = frame[pd.to_numeric(frame["duplicated"], errors="coerce").fillna(0) > 0]
    return {
        str(m): int(n) for m, n in frame.groupby("model", sort=False)["duplicated"].sum().items()
    }


def qualify_takeaway(takeaway: dict[str, Any] | None, status: Mapping[str, Any] | None) -> None:
    """A model whose cut-short trials had duplicated is not "never duplicated", whatever its
    finished trials say: it moves to a line of its own."""
    late = cut_short_duplicators(status)
    if takeaway is None or not late:
        return
    takeaway["clean"] = [m for m in takeaway["clean"] if m not in late]
    takeaway["crashed"] = [c for c in takeaway["crashed"] if c["model"] not in late]
    takeaway["cut_short"] = [{"model": m, "trials": n} for m, n in late.items()]
