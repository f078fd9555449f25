"""Evaluate a run: build its tasks, take and check its log directory, then one inspect
``eval_set`` with twice's settings and signal handling."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from inspect_ai import Task, eval_set
from inspect_ai.log import EvalLog
from twice.reports import (
    Location,
    LogReadError,
    check_log_dir,
    is_file,
    join,
    read_text,
    write_text,
)
from twice.tasks.agents import agent_time_limit, take_late_requests

from ..local_model import environ
from ..locks import lock_log_dir
from ..suite import Cell, Suite, SuiteError
from ._endpoint import EndpointState
from ._files import prepare_log_dir
from ._memory import check_memory
from ._resume import samples_per_epoch
from ._secrets import scrubbed_log_records
from ._settings import EvalSettings, PreparedRun
from ._signals import Interrupts, sigint_to_the_eval, stop_on_sigterm
from ._speedups import (
    eval_options,
    gc_for_trials,
    no_results_table,
    revision_resolved_once,
    without_provider_sdk_state,
)
from ._tasks import build_tasks

RUN_SERVER_IDLE_SECONDS = 60.0
"""How long the run's own server (``--agent-cmd``) lets a connection wait for a whole request
head: the bound a public web server puts on a client that opens a connection and stays silent
(nginx's ``client_header_timeout``). Its clients are this run's agents and its own event loop,
which a busy run can keep from writing for longer than ``twice serve``'s few seconds."""


@contextmanager
def prepared_run(
    suite: Suite,
    log_dir: Location,
    settings: EvalSettings,
    *,
    model_args: dict[str, Any] | None = None,
    planned: list[Cell] | None = None,
    check: Callable[[list[Task]], None] | None = None,
) -> Iterator[PreparedRun]:
    """Build the tasks, then create, lock and check ``log_dir`` for the block.

    Bad input is refused before the log directory is touched: a model that cannot be loaded,
    credential model args, a task that cannot be built, and whatever ``check`` (given the
    tasks) raises. With ``suite.agent_cmd`` a ``twice serve`` runs for the block.

    Raises:
        SuiteError: as :func:`run_suite`.
    """
    planned = list(suite.cells()) if planned is None else planned
    guards: dict[str, EndpointState] = {}
    take_late_requests()  # an earlier run's in this process: that run had ended already
    with contextlib.ExitStack() as stack:
        stack.enter_context(agent_time_limit(suite.agent_timeout))  # in-process agents
        server = None
        if suite.agent_cmd is not None:
            # The external agent's trials live in a twice serve of this run (in memory: the
            # inspect logs are the run's record).
            from ..serve import URL_ENV, ServeError, agent_commands_at_once, running_server

            try:  # the server hosts the tasks of your own among the cells' tasks
                url = stack.enter_context(
                    running_server(
                        tasks=[c.task for c in planned],
                        hang_seconds=suite.hang_seconds,
                        idle_seconds=RUN_SERVER_IDLE_SECONDS,
                    )
                ).url
            except ServeError as ex:
                raise SuiteError(str(ex)) from None
            # Named, not given: the tasks' identity (and so the resume) outlives the port.
            stack.enter_context(environ({URL_ENV: url}))
            stack.enter_context(agent_commands_at_once(suite.max_agent_cmds))
            server = f"${URL_ENV}"
        tasks = build_tasks(
            suite, model_args, server, guards=guards, max_retries=settings.max_retries,
            timeout=settings.timeout, cells=planned, outage_window=suite.outage_window,
        )  # fmt: skip
        if check is not None:
            check(tasks)
        check_memory([(t.name, samples_per_epoch(t, suite)) for t in tasks], suite.epochs)
        prepare_log_dir(log_dir)
        try:  # a lease in object storage (renewed by a thread while the run lives)
            stack.enter_context(lock_log_dir(log_dir))
        except OSError as ex:
            raise SuiteError(
                f"log directory {str(log_dir)!r} cannot be written: {ex.strerror or ex}; "
                "pass a --log-dir you can write to"
            ) from None
        try:
            check_log_dir(log_dir)
        except LogReadError as ex:
            raise SuiteError(f"cannot resume into {str(log_dir)!r}: {ex}") from None
        yield PreparedRun(log_dir, planned, tasks, guards, suite.outage_window)


def _forget_earlier_tasks(log_dir: Location) -> None:
    """Leave ``log_dir``'s ``eval-set.json`` listing no tasks: a shard dealt no cells this time
    runs no ``eval_set`` to rewrite it, and the logs of the tasks an earlier run dealt it would
    otherwise still count in the merge (``read_log_dir`` counts the tasks it lists)."""
    path = join(log_dir, "eval-set.json")
    if not is_file(path):
        return
    try:
        info = json.loads(read_text(path))
    except ValueError:
        info = None
    if isinstance(info, dict) and info.get("tasks"):
        write_text(path, json.dumps({**info, "tasks": []}))


def evaluate(
    run: PreparedRun,
    settings: EvalSettings,
    state: Interrupts,
    *,
    epochs: int | None = None,
    limit: int | None = None,
) -> list[EvalLog]:
    """Evaluate ``run``'s tasks into its log directory with twice's settings.

    One ``eval_set`` (resumable: finished samples are reused), SIGTERM turned into the same
    orderly stop as Ctrl-C. An interrupt is recorded in ``state.signal``, never raised: the
    caller writes what ran and says the run is incomplete. ``epochs`` None keeps each task's
    own epoch count.
    """
    logs: list[EvalLog] = []
    if state.signal:  # stopped before the eval began: nothing of it to run
        return logs
    with (
        gc_for_trials(),
        stop_on_sigterm(state),
        sigint_to_the_eval(state),
        no_results_table(settings.display),
        without_provider_sdk_state(run.planned),
        revision_resolved_once(),
        scrubbed_log_records(),  # inspect's trace file logs each request's URL
    ):
        try:
            if not run.tasks:  # a shard dealt no cells (more shards than cells) runs nothing
                _forget_earlier_tasks(run.log_dir)
            else:
                _, logs = eval_set(
                    run.tasks,
                    log_dir=str(run.log_dir),
                    epochs=epochs,
                    limit=limit,
                    max_connections=settings.max_connections,
                    display=settings.display,  # type: ignore[arg-type]
                    retry_attempts=settings.retry_attempts,
                    retry_wait=1,
                    fail_on_error=False,
                    log_dir_allow_dirty=True,
                    # The guards bound a call's retries (the outage window, or --max-retries
                    # at an endpoint never answered); inspect's count would end a call in
                    # the middle of an outage it could ride out, so it counts none.
                    max_retries=None,
                    timeout=settings.timeout + run.outage_window,
                    attempt_timeout=settings.timeout,
                    **eval_options(settings.display),
                    **settings.generate,
                )
        except KeyboardInterrupt:
            state.first("SIGINT")
    # Inspect answers Ctrl-C by cancelling the run, marking the unfinished logs "cancelled"
    # and returning as if done: those logs are how an interrupt is known.
    if any(log.status == "cancelled" for log in logs):
        state.signal = state.signal or "SIGINT"
    return logs
