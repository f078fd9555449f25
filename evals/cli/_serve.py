"""``twice serve``: each trial's services and tools over HTTP and MCP (the ``[serve]`` extra)."""

from __future__ import annotations

import sys

import click

from ..suite import DEFAULT_HANG_SECONDS


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.option(
    "--port", type=click.IntRange(0, 65535), default=8765, show_default=True, help="TCP port."
)
@click.option(
    "--db",
    default="twice-serve.sqlite",
    show_default=True,
    help="Write-ahead request log (SQLite); restarting on the same file restores every trial "
    "(':memory:' keeps none).",
)
@click.option(
    "--token",
    envvar="TWICE_SERVE_TOKEN",
    help="Bearer token the control API requires: visible ASCII, no spaces (required off "
    "loopback; or $TWICE_SERVE_TOKEN).",
)
@click.option(
    "--task",
    "tasks",
    multiple=True,
    metavar="PATH.py:FUNCTION",
    help="A task of your own trials may be made of, beside the built-in ones (repeatable; "
    "or package.module:function).",
)
@click.option(
    "--hang-seconds",
    type=float,
    default=DEFAULT_HANG_SECONDS,
    show_default=True,
    help="Seconds a trial holds a lost reply (lost_reply, timeout_before_commit) open before "
    "closing the connection, when the trial gives no hang_seconds (at most 600).",
)
@click.option(
    "--upstream",
    "upstreams",
    multiple=True,
    metavar="NAME=URL",
    help="Forward a trial's requests to /t/ID/NAME/... to a real service at URL (your "
    "staging), with the trial's fault around the real call (repeatable). Loopback hosts only, "
    "unless named with --upstream-allow.",
)
@click.option(
    "--upstream-allow",
    "upstream_allow",
    multiple=True,
    metavar="HOST",
    help="A host other than loopback an --upstream may be on (repeatable).",
)
@click.option(
    "--openapi",
    "openapi",
    multiple=True,
    metavar="NAME=PATH",
    help="Serve the OpenAPI document PATH (JSON or YAML) as the service NAME, in trials of the "
    "task NAME (repeatable; NAME=PATH:DATASET.jsonl for samples, ',OVERRIDES.yaml' to fix "
    "inference).",
)
def serve(
    host: str,
    port: int,
    db: str,
    token: str | None,
    tasks: tuple[str, ...],
    hang_seconds: float = DEFAULT_HANG_SECONDS,
    upstreams: tuple[str, ...] = (),
    upstream_allow: tuple[str, ...] = (),
    openapi: tuple[str, ...] = (),
) -> None:
    """Serve the mock services, faults and idempotency store over real HTTP and MCP.

    Control API: POST /_twice/trials {"task", "sample", "fault", "protection",
    "hang_seconds"} -> 201 {"id", "urls"}; GET /_twice/trials/ID/ledger and /verdict;
    DELETE /_twice/trials/ID. Services answer at /t/ID/SERVICE/..., tools over MCP at /t/ID/mcp.
    "task" is a built-in task or one given with --task. A lost reply is held open until the
    client times out (at most hang_seconds); reset_after_commit closes the connection at once.
    With --upstream NAME=URL, /t/ID/NAME/... is forwarded to URL and the ledger records what
    the real service answered.
    """
    from ..serve import serve as run_server

    try:
        stopped_by = run_server(
            host=host,
            port=port,
            db=db,
            token=token,
            tasks=tasks,
            hang_seconds=hang_seconds,
            upstreams=upstreams,
            upstream_allow=upstream_allow,
            openapi=openapi,
        )
    except KeyboardInterrupt:
        sys.exit(130)
    if stopped_by is not None:  # a signal it was started ignoring (a script's `&` job)
        sys.exit(128 + stopped_by)
