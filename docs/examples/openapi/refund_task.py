"""Refunds through Stripe's OpenAPI document, as a task of your own:
`twice run --task docs/examples/openapi/refund_task.py:stripe_refunds`."""

from pathlib import Path

from inspect_ai import Task, task
from twice.tasks import openapi_task

HERE = Path(__file__).parent
STRIPE = HERE.parents[2] / "tests" / "mocks" / "openapi_docs" / "stripe.json"


@task
def stripe_refunds(
    fault: str = "none",
    protection: str = "bare",
    prompt: str = "baseline",
    agent: str = "react",
    mocks: dict[str, str] | None = None,
) -> Task:
    return openapi_task(
        STRIPE,
        HERE / "stripe_refunds.jsonl",
        fault=fault,
        protection=protection,
        prompt=prompt,
        agent=agent,
        mocks=mocks,
    )
