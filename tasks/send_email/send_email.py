"""Send an email through an email API that has no idempotency keys but a searchable sent folder.

``send_email`` is the mutating tool. Its class is ``unsafe``: the email API ignores
Idempotency-Key entirely, so no key can make a blind retry safe, and a sent email cannot be
unsent. What can make a retry safe is looking first: every message carries a client reference
the tool layer derives from the run and the intent (never the model), and the sent folder can
be searched by it (the ``lookup`` protection) or by recipient and subject (``find_sent_emails``,
which ``stub/verify`` uses).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from inspect_ai import Task, task
from inspect_ai.tool import Tool
from twice.mocks import EmailService, Service, services_from_state
from twice.tasks import _interfaces as api
from twice.tasks._dataset import load_dataset
from twice.tasks._interfaces import describe_email, implements
from twice.tasks._toolkit import TrialContext, make_tool
from twice.tasks._trial import twice_task

DATASET = Path(__file__).parent / "dataset.jsonl"


def _services(state: dict[str, Any]) -> list[Service]:
    return services_from_state(state, EmailService)


def client_reference(ctx: TrialContext, to: str, subject: str) -> str:
    """The reference the tool layer puts on a message: one per run and intent (recipient and
    subject), so a model retry of the same email carries the same reference."""
    digest = hashlib.sha256(f"{to.lower()}\n{subject}".encode()).hexdigest()[:16]
    return f"{ctx.run_id}:{digest}"


def send_email_tools(ctx: TrialContext) -> list[Tool]:
    """The send_email task's tools, bound to one trial."""
    email = ctx.api("email")

    async def lookup(reference: str) -> dict[str, Any] | None:
        found = await email.get("/v1/messages", params={"client_reference": reference})
        return dict(found["data"][0]) if found["data"] else None

    @implements(api.send_email)
    async def send_email(to: str, subject: str, body: str) -> str:
        reference = client_reference(ctx, to, subject)
        result = await email.mutate(
            "email.message.send",
            "/v1/messages",
            payload={"to": to, "subject": subject, "body": body, "client_reference": reference},
            identity={"to": to, "subject": subject},
            noun="email",
            lookup=lambda: lookup(reference),
        )
        return result.say("Sent", describe_email(result.body))

    @implements(api.find_sent_emails)
    async def find_sent_emails(to: str, subject: str = "") -> str:
        params = {"to": to, "subject": subject} if subject else {"to": to}
        found = await email.get("/v1/messages", params=params)
        messages = found["data"]
        if not messages:
            what = f" with subject containing {subject!r}" if subject else ""
            return f"No sent emails to {to}{what}."
        return f"{len(messages)} sent email(s) to {to}: " + "; ".join(
            describe_email(m) for m in messages
        )

    return [
        make_tool(ctx, send_email, idempotency="unsafe", parallel=True),
        make_tool(ctx, find_sent_emails),
    ]


@task
def send_email(
    fault: str = "none",
    protection: str = "bare",
    prompt: str = "baseline",
    action_log: bool | None = None,
    agent: str = "react",
    mocks: dict[str, str] | None = None,
) -> Task:
    """Send one email through an email API with no idempotency keys (sent folder searchable).

    Args:
        fault: What the email API does wrong (``twice list`` shows the faults).
        protection: What the tool layer does about retries.
        prompt: A built-in prompt name or a prompt file path.
        action_log: Keep a durable action log (None: as the protection says).
        agent: The agent under test (``react``: twice's own loop; ``twice list`` shows more).
        mocks: Production URL by service name, served by the trial's services (user agents).
    """
    return twice_task(
        name="send_email",
        dataset=load_dataset(DATASET, "send_email"),
        services=_services,
        tools=send_email_tools,
        fault=fault,
        protection=protection,
        prompt=prompt,
        action_log=action_log,
        agent=agent,
        mocks=mocks,
    )
