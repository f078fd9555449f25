"""Evals whose trials live in a ``twice serve`` server: an agent reaches them over MCP.

:func:`served_task` is a twice task whose tools are not in-process: each sample × epoch makes
a trial on the server (``POST /_twice/trials``), the agent drives the trial's tools through
inspect's ``mcp_server_http`` inside ``mcp_connection``, and the scorer reads the trial's
verdict (the server computes it with the scorer's own code) and copies its ledger into the
sample store, so the log reads like any other twice log.
"""

from __future__ import annotations

from typing import Any

import httpx
from inspect_ai import Task
from inspect_ai.model import ChatMessageSystem
from inspect_ai.scorer import Score, Scorer, Target, mean, scorer
from inspect_ai.solver import Generate, Solver, TaskState, solver
from inspect_ai.tool import mcp_connection, mcp_server_http
from inspect_ai.util import store
from twice.mocks import LEDGER_STORE_KEY, STUB_STORE_KEY, get_fault
from twice.tasks import get_protection, load_prompt, task_parts

SERVED_STORE_KEY = "twice:served"
"""Store key of the served trial: ``{"server", "id", "urls"}``."""


def _headers(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


async def create_trial(
    server: str, body: dict[str, Any], token: str | None = None
) -> dict[str, Any]:
    """``POST /_twice/trials``; returns the trial's id and URLs.

    Raises:
        RuntimeError: with the server's error message when it refuses.
    """
    async with httpx.AsyncClient(timeout=30) as client:
        r = await client.post(f"{server}/_twice/trials", json=body, headers=_headers(token))
    if r.status_code != 201:
        raise RuntimeError(f"twice serve refused the trial ({r.status_code}): {r.text}")
    return dict(r.json())


async def trial_get(server: str, trial_id: str, what: str, token: str | None = None) -> Any:
    """``GET /_twice/trials/<id>/<what>`` (``ledger`` or ``verdict``)."""
    async with httpx.AsyncClient(timeout=30) as client:
        r = await client.get(f"{server}/_twice/trials/{trial_id}/{what}", headers=_headers(token))
    r.raise_for_status()
    return r.json()


@solver
def served_trial_setup(
    server: str,
    task: str,
    fault: str,
    protection: str,
    prompt_name: str,
    prompt_text: str,
    lost_reply: str = "drop",
    token: str | None = None,
) -> Solver:
    """Make this sample × epoch's trial on the server; set the prompt and the stubs' plan."""

    async def solve(state: TaskState, generate: Generate) -> TaskState:
        trial = await create_trial(
            server,
            {
                "task": task,
                "sample": str(state.sample_id),
                "fault": fault,
                "protection": protection,
                "lost_reply": lost_reply,
            },
            token,
        )
        store().set(SERVED_STORE_KEY, {"server": server, "id": trial["id"], "urls": trial["urls"]})
        state.messages.insert(0, ChatMessageSystem(content=prompt_text))
        store().set(
            STUB_STORE_KEY,
            {
                "plan": state.metadata.get("plan", []),
                "prompt": prompt_name,
                "seed": f"{state.sample_id}:{state.epoch}:{prompt_name}",
            },
        )
        return state

    return solve


@solver
def mcp_agent() -> Solver:
    """The model drives the trial's tools over MCP streamable HTTP (inspect's MCP client)."""

    async def solve(state: TaskState, generate: Generate) -> TaskState:
        urls = store().get(SERVED_STORE_KEY)["urls"]
        server = mcp_server_http(name="twice", url=urls["mcp"], timeout=30)
        async with mcp_connection([server]):
            state.tools = list(await server.tools())
            return await generate(state)

    return solve


@scorer(metrics={"*": [mean()]})
def served_verdict(token: str | None = None) -> Scorer:
    """Score a served trial from the server's verdict; keep its ledger in the sample store."""

    async def score(state: TaskState, target: Target) -> Score:
        served = store().get(SERVED_STORE_KEY)
        ledger = await trial_get(served["server"], served["id"], "ledger", token)
        store().set(LEDGER_STORE_KEY, ledger)
        verdict = await trial_get(served["server"], served["id"], "verdict", token)
        return Score(
            value=verdict["metrics"],
            answer=state.output.completion[:500] if state.output else None,
            explanation=verdict["explanation"],
            metadata=verdict["evidence"],
        )

    return score


def served_task(
    task: str,
    server: str,
    *,
    fault: str = "none",
    protection: str = "bare",
    prompt: str = "baseline",
    solver: Solver | None = None,
    lost_reply: str = "drop",
    token: str | None = None,
    message_limit: int = 30,
) -> Task:
    """A twice task whose trials live in a ``twice serve`` server.

    Args:
        task: A built-in task name.
        server: The server's base URL (``http://127.0.0.1:8765``).
        fault: A fault name.
        protection: A protection name (the server's tool layer applies it to MCP tools).
        prompt: A built-in prompt name or a prompt file path.
        solver: The agent; default: the model drives the trial's tools over MCP.
        lost_reply: ``drop`` or ``hang`` for lost replies over HTTP.
        token: The server's control-API token, if it has one.
        message_limit: Hard stop for agents that loop.

    Raises:
        ValueError: for an unknown task, fault, protection or prompt.
    """
    parts = task_parts(task)
    get_fault(fault)
    get_protection(protection)
    p = load_prompt(prompt)
    return Task(
        name=task,
        dataset=parts.dataset,
        setup=served_trial_setup(
            server, task, fault, protection, p.name, p.text, lost_reply, token
        ),
        solver=solver or mcp_agent(),
        scorer=served_verdict(token),
        message_limit=message_limit,
        metadata={
            "twice": {
                "task": task,
                "fault": fault,
                "protection": protection,
                "prompt": p.name,
                "prompt_source": p.source,
                "prompt_sha256": p.sha256,
                "prompt_text": p.text,
                "served": True,
            }
        },
    )
