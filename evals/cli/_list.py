"""``twice list``: the tasks, prompts, faults, protections, agents and stub models."""

from __future__ import annotations

import click


@click.command("list")
def list_() -> None:
    """List tasks, prompts, faults, protections and stub models."""
    from twice.mocks import (
        BOTH_CONVERSATIONS,
        CONVERSATION_FAULTS,
        FAULTS,
        STUB_MODELS,
        noisy_retry_rate,
    )
    from twice.tasks import PROTECTIONS, TASKS, builtin_prompts

    click.echo("tasks:")
    for name, fn in TASKS.items():
        doc = (fn.__doc__ or "").strip().splitlines()[0] if fn.__doc__ else ""
        click.echo(f"  {name:<24} {doc}")
    click.echo(f"  {'path.py:function':<24} your own task (an inspect @task built with twice_task)")
    click.echo(f"  {'openapi:PATH[:DATA.jsonl]':<24} a task from an OpenAPI document and a dataset")
    click.echo("prompts:")
    for name in builtin_prompts():
        click.echo(f"  {name:<24} (stub/noisy retries with p={noisy_retry_rate(name):g})")
    click.echo("faults:")
    for name, fault in FAULTS.items():
        doc = (type(fault).__doc__ or "").strip().splitlines()[0]
        click.echo(f"  {name:<24} {doc}")
    for name, doc in CONVERSATION_FAULTS.items():
        click.echo(f"  {name:<24} {doc}")
    click.echo(f"  {BOTH_CONVERSATIONS:<24} both conversation faults, in the order they happen")
    click.echo(f"  {'FAULT+' + '|'.join(CONVERSATION_FAULTS):<24} both: lost_reply+ask_again ...")
    click.echo("protections:")
    for name, p in PROTECTIONS.items():
        click.echo(f"  {name:<24} {p.summary}")
    click.echo("stub models:")
    for name, doc in STUB_MODELS.items():
        click.echo(f"  stub/{name:<19} {doc}")
    from twice.tasks.agents import AGENT_TASKS, BUILTIN_AGENTS, REACT

    click.echo("agents:")
    click.echo(f"  {REACT:<24} twice's own loop and tool layer (default)")
    for name, agent in BUILTIN_AGENTS.items():
        click.echo(f"  {name:<24} {agent.summary}")
    click.echo(
        f"  {'path.py:function':<24} your own agent (tasks: any; built-ins: "
        f"{', '.join(AGENT_TASKS)})"
    )
