"""What a suite run sets or patches in inspect and Python to run faster, with nothing visible
changed: inspect's per-eval options, the garbage collector's thresholds, and three of
inspect's per-sample or per-eval costs a batch run does not need. Each is measured in
``bench/`` (``docs/BENCHMARKS.md``), and each does nothing where inspect has moved the thing
it patches (``tests/test_inspect_compat.py`` says which).
"""

from __future__ import annotations

import functools
import gc
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from twice.tasks import TASKS
from twice.tasks.agents import REACT

from .._inspect_compat import assistant_internal, rich_display
from .._inspect_compat import task_log as inspect_task_log
from ..suite import Cell

CTL_SERVER_ENV = "INSPECT_EVAL_CTL_SERVER"
"""Inspect's switch for its control server; set (``true``, ``keep``) it turns it back on."""


def eval_options(display: str | None) -> dict[str, Any]:
    """Inspect settings every suite eval runs with (the benchmarks use the same).

    ``log_realtime`` off: inspect's live sample buffer (an SQLite database written on every
    event, for watching unfinished samples in ``inspect view``) costs about a fifth of a
    stub trial; finished samples still reach the log and the viewer. ``score_display`` only
    when something displays it: inspect recomputes every metric as samples finish.
    ``ctl_server`` off unless ``INSPECT_EVAL_CTL_SERVER`` asks for it: inspect's control
    server (for ``inspect ctl``) builds a FastAPI app and binds a socket in every process that
    starts an eval (0.4 s of a worker's start), and a suite run is a batch job nobody steers.
    """
    return {
        "log_realtime": False,
        "score_display": display not in (None, "none"),
        # None lets inspect read the variable (the same spellings as `inspect eval`).
        "ctl_server": None if os.environ.get(CTL_SERVER_ENV) else False,
    }


GC_THRESHOLDS = (50_000, 20, 20)
"""Garbage-collector thresholds for a suite run (Python's defaults are 700, 10, 10)."""


def batch_gc() -> None:
    """Keep the trials' garbage-collector thresholds for the whole life of this process.

    A twice command is one batch job that ends when its work is written. ``run_suite`` and the
    report collect less often while they work (``gc_for_trials``) and put Python's defaults
    back when they finish, as a library must; the first allocation after that starts a full
    collection over everything the trials left alive: 0.5-0.6 s on the reference machine,
    twice per run (after the eval set and after the summary), on the critical path of every
    ``twice run`` and of each ``--workers`` worker. The process is about to exit; it need not
    pay for a tidy heap. The console script and each worker call this; code that calls
    twice as a library keeps its own thresholds. ``twice serve``, the one long-lived command,
    runs under them too: its trials allocate the same short-lived objects, and the oldest
    generation is still collected, only less often.
    """
    gc.set_threshold(*GC_THRESHOLDS)


@contextmanager
def gc_for_trials() -> Iterator[None]:
    """Collect garbage less often while trials run, then restore the thresholds.

    A trial allocates thousands of short-lived objects. At Python's default thresholds the
    youngest generation is collected every 700 allocations, so a trial's objects survive into
    the oldest generation and trigger full collections (each a walk over every live object:
    ~0.3 s with inspect loaded). Fewer young collections let them die young: the default
    suite's CPU time drops by a fifth. Memory grows by at most the uncollected young cycles.
    The same holds for reading the logs back after the trials, while their survivors are live.
    """
    old = gc.get_threshold()
    gc.set_threshold(*GC_THRESHOLDS)
    try:
        yield
    finally:
        gc.set_threshold(*old)


@contextmanager
def no_results_table(display: str | None) -> Iterator[None]:
    """Under ``display="none"``, skip the results table inspect renders as an eval set ends.

    Inspect's rich display lays out a table of every task when the set ends, even when the
    console is quiet (display ``none``) and the text goes nowhere: about 6.5 s of the
    default suite's 77 (57 tasks; measured with and without this), all on the critical path.
    The table is what a quiet console would discard anyway, so nothing visible changes. If a
    later inspect moves the function, this does nothing.
    """
    module = rich_display()
    original = getattr(module, "tasks_results", None)
    if display != "none" or module is None or original is None:
        yield
        return
    from rich.text import Text

    module.tasks_results = lambda tasks: Text("")  # type: ignore[attr-defined]
    try:
        yield
    finally:
        module.tasks_results = original  # type: ignore[attr-defined]


SDK_FREE_PROVIDERS = frozenset({"stub", "mockllm"})
"""Model providers that call no provider SDK: twice's stubs and inspect's ``mockllm``."""


def needs_provider_sdk_state(cells: list[Cell]) -> bool:
    """Whether a run of ``cells`` may use the per-sample state of the OpenAI and Anthropic
    providers: yes unless every model is a stub, every agent twice's own react loop and every
    task a built-in (a framework agent talks to inspect through the OpenAI API bridge; an agent
    or task of your own may call any provider)."""
    return not all(
        cell.model.split("/", 1)[0] in SDK_FREE_PROVIDERS
        and cell.agent == REACT
        and cell.task in TASKS
        for cell in cells
    )


@contextmanager
def without_provider_sdk_state(cells: list[Cell]) -> Iterator[None]:
    """For the block, keep inspect from importing the OpenAI and Anthropic SDKs in a run that
    uses neither (see :func:`needs_provider_sdk_state`).

    Inspect sets up each installed provider SDK's per-sample "assistant internal" state at
    every sample's start, importing the SDK and inspect's provider module at the first (1.2-1.6
    s of CPU per process, measured with ``python -X importtime``: as long as the stub trials
    of a small run, and paid again by every ``--workers`` worker). The state is read only by
    those providers' own calls. Inspect caches whether each SDK is installed in two private
    module flags; they are cleared for the block and restored after. An inspect without them
    is left as it is.
    """
    internal = assistant_internal()
    flags = ("_HAS_OPENAI", "_HAS_ANTHROPIC")
    if needs_provider_sdk_state(cells) or not all(
        isinstance(getattr(internal, f, None), bool) for f in flags
    ):
        yield
        return
    saved = {f: getattr(internal, f) for f in flags}
    for f in flags:
        setattr(internal, f, False)
    try:
        yield
    finally:
        for f, value in saved.items():
            setattr(internal, f, value)


@contextmanager
def revision_resolved_once() -> Iterator[None]:
    """For the block, find the git revision inspect records in every eval log once.

    Inspect's task logger asks git for it at the start of every eval: three subprocesses
    (``rev-parse``, ``remote get-url``, ``status --porcelain``) for each of the default
    suite's 57 evals: 171 ``git`` processes counted with ``strace`` in one ``twice run``,
    8.5 ms of wall for the three from a process with inspect loaded, and ``status`` walks
    the working tree (logs included, when they are written inside it). The revision
    describes the code this process loaded, which does not change while it runs, so the
    first answer is recorded in every log of the block (which is also more faithful: a log
    directory inside the repository no longer turns "dirty" halfway through a run). An
    inspect without the hook is left as it is.
    """
    task_log = inspect_task_log()
    original = getattr(task_log, "resolve_revision", None)
    if not callable(original):
        yield
        return
    setattr(task_log, "resolve_revision", functools.cache(original))  # noqa: B010
    try:
        yield
    finally:
        setattr(task_log, "resolve_revision", original)  # noqa: B010
