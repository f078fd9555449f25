"""Archive a record through a records API whose archive action is naturally idempotent.

``archive_record`` is the mutating tool. Its class is ``safe``: archiving an archived record is
a success that changes nothing (HTTP 200, ``already_archived``), so a retry, a parallel
duplicate or a resumed step can never archive twice. The failure this task measures is the
opposite one: an agent that does not take "already archived" for the success it is and keeps
archiving (a loop), or that stops on an unknown outcome and reports failure although the
record was archived. See the task README for what ``completed`` and ``duplicated`` mean here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from inspect_ai import Task, task
from inspect_ai.tool import Tool
from twice.mocks import Attempt, Ledger, RecordsService, Service, services_from_state
from twice.tasks._dataset import load_dataset
from twice.tasks._toolkit import TrialContext, make_tool
from twice.tasks._trial import twice_task

DATASET = Path(__file__).parent / "dataset.jsonl"
ARCHIVE = "records.record.archive"


def _services(state: dict[str, Any]) -> list[Service]:
    return services_from_state(state, RecordsService)


def _describe(record: dict[str, Any]) -> str:
    text = f"record {record['record_id']} ({record['title']}), status: {record['status']}"
    if record.get("archive_id"):
        text += f", archived as {record['archive_id']} (reason: {record['archive_reason']!r})"
    return text


def archive_loops(ledger: Ledger) -> list[str]:
    """Archive requests sent after the service had already answered that the record was
    archived: the agent kept going on a success.

    An archive request that got a delivered 200 without committing anything (the record was
    already archived, or a keyed replay) told the client the record is archived. Any later
    archive request for that record is a loop. One redundant request (a retry after a lost
    reply, a parallel duplicate) is fine; only ignoring the answer is not.
    """
    told: dict[str, Attempt] = {}
    loops = []
    for a in ledger.attempts:
        if a.route != ARCHIVE:
            continue
        record_id = str(a.params.get("record_id"))
        if record_id in told:
            loops.append(
                f"archive of {record_id} sent again at attempt {a.n} ({a.source}) after "
                f"attempt {told[record_id].n} had answered that it was already archived"
            )
        elif a.delivered and a.status == 200 and not a.effect_ids:
            told[record_id] = a
    return loops


def archive_end_state(ledger: Ledger, metadata: dict[str, Any]) -> str | None:
    """The task's end-state check: the agent did not loop on "already archived"."""
    loops = archive_loops(ledger)
    return "; ".join(loops) if loops else None


def archive_record_tools(ctx: TrialContext) -> list[Tool]:
    """The archive_record task's tools, bound to one trial."""
    records = ctx.api("records")

    async def lookup(record_id: str) -> dict[str, Any] | None:
        record = await records.get(f"/v1/records/{record_id}")
        return dict(record) if record["status"] == "archived" else None

    async def archive_record(record_id: str, reason: str) -> str:
        """Archive a record. Archiving an already archived record is harmless: it succeeds and
        changes nothing.

        Args:
            record_id: The record to archive, e.g. "rec_1042".
            reason: Why it is archived, kept with the record.
        """
        result = await records.mutate(
            ARCHIVE,
            f"/v1/records/{record_id}/archive",
            payload={"reason": reason},
            identity={"record_id": record_id},
            noun="archive",
            lookup=lambda: lookup(record_id),
        )
        if result.body.get("already_archived"):
            done = "Success: the record was already archived, nothing changed:"
        else:
            done = "Archived"
        return result.say(done, _describe(result.body))

    async def get_record(record_id: str) -> str:
        """Look up a record and whether it is archived. Read-only and safe to call any time.

        Args:
            record_id: The record, e.g. "rec_1042".
        """
        record = await records.get(f"/v1/records/{record_id}")
        return f"The {_describe(record)}; owner {record.get('owner', 'unknown')}."

    return [
        make_tool(ctx, archive_record, idempotency="safe", parallel=True),
        make_tool(ctx, get_record),
    ]


@task
def archive_record(
    fault: str = "none",
    protection: str = "bare",
    prompt: str = "baseline",
    action_log: bool | None = None,
    agent: str = "react",
    mocks: dict[str, str] | None = None,
) -> Task:
    """Archive one record through an API where "already archived" is success.

    Args:
        fault: What the records API does wrong (``twice list`` shows the faults).
        protection: What the tool layer does about retries.
        prompt: A built-in prompt name or a prompt file path.
        action_log: Keep a durable action log (None: as the protection says).
        agent: The agent under test (``react``: twice's own loop; ``twice list`` shows more).
        mocks: Production URL by service name, served by the trial's services (user agents).
    """
    return twice_task(
        name="archive_record",
        dataset=load_dataset(DATASET, "archive_record"),
        services=_services,
        tools=archive_record_tools,
        fault=fault,
        protection=protection,
        prompt=prompt,
        action_log=action_log,
        end_state=archive_end_state,
        agent=agent,
        mocks=mocks,
    )
