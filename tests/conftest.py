"""Shared fixtures: a reference suite run on the stub controls, mock services, pytester."""

from __future__ import annotations

import fcntl
import gc
import itertools
import json
import os
import shutil
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from _pytest.runner import runtestprotocol
from twice.evals import RunResult, run_suite
from twice.evals.run import batch_gc
from twice.evals.suite._suite import Matrix, Suite
from twice.mocks import SOURCE_HEADER, Ledger, PaymentsService, Services, get_fault

pytest_plugins = ["pytester", "passes"]


@pytest.fixture
def plugins_off(request: pytest.FixtureRequest) -> list[str]:
    """The ``-p no:NAME`` arguments of this suite's own ``addopts``: the plugins no test uses,
    which a pytest process the tests start leaves out too (seconds of imports each)."""
    opts = request.config.getini("addopts")
    return [a for flag, n in itertools.pairwise(opts) if flag == "-p" and n[:3] == "no:"
            for a in ("-p", n)]  # fmt: skip


@pytest.fixture
def pytester(
    pytester: pytest.Pytester, plugins_off: list[str], monkeypatch: pytest.MonkeyPatch
) -> pytest.Pytester:
    """pytester, whose pytest runs leave out the plugins this suite's own ``addopts`` leave out.

    pytester restores ``sys.modules`` after each in-process run, so a plugin loaded by the
    run is imported again by the next one: seconds per run for plugins no test uses.
    """
    monkeypatch.setenv("PYTEST_ADDOPTS", " ".join(plugins_off))
    return pytester


# Each test runs above one frame of this many slots, so that CPython opens a 256 KiB chunk of
# its frame stack for it (it doubles 16 KiB until the frame and 1,000 more slots fit), leaving
# some 17,000 slots (hundreds of frames) of room above. CPython 3.11 and 3.12 free a chunk as
# soon as the frame that opened it returns (python/cpython#142183; 3.13 and 3.14 keep one):
# a call repeated over a chunk's edge maps and unmaps 16 KiB each time. In the xdist workers,
# whose stacks are deep, that was some 4.7 million of the 6.9 million unmaps of a `make test`.
ROOM_SLOTS = 15_400


def _with_room() -> Callable[[Callable[[], object]], object]:
    """``with_room(call)`` → ``call()``, called above a frame of :data:`ROOM_SLOTS` slots."""
    names = " = ".join(f"_{i}" for i in range(ROOM_SLOTS))
    source = (
        f"def with_room(call):\n    if call is None:\n        {names} = None\n    return call()\n"
    )
    namespace: dict[str, Any] = {}
    exec(compile(source, "<with_room>", "exec"), namespace)
    return namespace["with_room"]  # type: ignore[no-any-return]


with_room = _with_room()
UNFREEZE_EVERY = 100
_tests_run = itertools.count(1)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> bool:
    """pytest's own protocol for ``item`` (``runner.pytest_runtest_protocol``), run above a
    frame with room; then the garbage collector is left what later tests allocate.

    A worker holds about 900,000 objects once inspect, pandas and the framework SDKs are
    imported, and a full collection walks every one of them (0.3-0.4 s), some dozens of times
    per file. Between tests a collection walks only what is not frozen, what the test just
    made, and freezing its survivors keeps the next collections that small. What was frozen
    alive and became cyclic garbage later (a module fixture's server, once torn down) is
    found by a collection over everything every :data:`UNFREEZE_EVERY` tests.
    """
    item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    with_room(lambda: runtestprotocol(item, nextitem=nextitem))
    item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
    if next(_tests_run) % UNFREEZE_EVERY == 0:
        gc.unfreeze()
    gc.collect()
    gc.freeze()
    return True


def pytest_configure(config: pytest.Config) -> None:
    """Collect garbage at twice's own thresholds (a test session is a batch job too), and let
    the interrupt tests' child processes receive SIGINT however pytest was started.

    A shell starts a background job (``make test &``, ``nohup ...``) with SIGINT ignored, and
    an ignored signal stays ignored across exec: every ``twice run`` the tests start would
    ignore the Ctrl-C they send, as a background job should. A handled signal is reset to
    the default across exec, so handling it here gives the children Python's usual Ctrl-C.
    """
    batch_gc()
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session", autouse=True)
def private_inspect_data(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Inspect's data directory (its trace files) for this test session alone.

    Each inspect process writes ``traces/trace-PID.log`` there and, when it starts, deletes
    all but the ten newest files: in the one shared ``~/.local/share/inspect_ai`` another
    xdist worker's or another session's processes delete this process's open trace file,
    which the secret-scrubbing tests read. Subprocesses inherit the variable.
    """
    data = tmp_path_factory.mktemp("xdg-data")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_DATA_HOME", str(data))
        yield data


MakeOnce = Callable[[str, Callable[[Path], None]], Path]


@pytest.fixture(scope="session")
def made_once(tmp_path_factory: pytest.TempPathFactory) -> MakeOnce:
    """``made_once(name, make)`` → a folder that ``make(folder)`` fills once per test run.

    Under xdist every worker has a session of its own, so a session or module fixture's work
    is done again in each worker that runs one of its tests. Here the first worker to ask
    makes the folder, under the run's shared temporary root and behind a file lock; the
    others wait for it and use it. What ``make`` writes must not depend on the worker, and
    the tests that share it only read it.
    """
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # popen-gwN's parent: the run's, shared by its workers

    def made(name: str, make: Callable[[Path], None]) -> Path:
        folder = root / f"made-once-{name}"
        done = root / f"made-once-{name}.made"
        with open(root / f"made-once-{name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            if not done.exists():
                shutil.rmtree(folder, ignore_errors=True)  # a worker that failed making it
                folder.mkdir()
                make(folder)
                done.touch()
        return folder

    return made


ORDERS = [
    {"order_id": "order_1042", "customer": "Dana Ortiz", "amount": 3997},
    {"order_id": "order_1054", "customer": "Sam Lee", "amount": 9850},
]


@pytest.fixture
def payments() -> Callable[[str], Services]:
    """Build a payments trial under a fault: ``payments("lost_reply")``."""

    def make(fault: str = "none") -> Services:
        return Services([PaymentsService(orders=ORDERS)], fault=get_fault(fault))

    return make


@pytest.fixture
def naive_refund() -> Callable[..., None]:
    """A client that retries a timed-out refund without a key (the seed's bug)."""

    def refund(services: Services, order_id: str = "order_1042", tries: int = 2) -> None:
        with services.sync_client(base_url="https://payments.twice.test") as client:
            for n in range(tries):
                source = "initial" if n == 0 else "model"
                try:
                    client.post(
                        "/v1/refunds",
                        json={"order_id": order_id, "amount": 499},
                        headers={SOURCE_HEADER: source},
                    )
                    return
                except httpx.TimeoutException:
                    continue

    return refund


@pytest.fixture
def duplicated(payments: Callable[[str], Services], naive_refund: Callable[..., None]) -> Ledger:
    """The seed's ledger: reply lost on re_1, a retry made re_2."""
    services = payments("lost_reply")
    naive_refund(services)
    return services.ledger


RETRYING_TRANSPORTS = """

class Retrying(httpx.BaseTransport):
    # The httpx-retries pattern: the retry lives in a transport wrapping httpx's own,
    # retrying a timeout with whatever headers the request has.
    def __init__(self, inner):
        self.inner = inner

    def handle_request(self, request):
        for attempt in range(3):
            try:
                return self.inner.handle_request(request)
            except httpx.TimeoutException:
                if attempt == 2:
                    raise


class AsyncRetrying(httpx.AsyncBaseTransport):
    def __init__(self, inner):
        self.inner = inner

    async def handle_async_request(self, request):
        for attempt in range(3):
            try:
                return await self.inner.handle_async_request(request)
            except httpx.TimeoutException:
                if attempt == 2:
                    raise


class DualRetrying(Retrying, AsyncRetrying):
    # Both a sync and an async transport, as httpx-retries' RetryTransport is.
    pass


class SlottedRetrying(httpx.BaseTransport):
    # Its attributes in __slots__ (attrs' @define makes such classes): no __dict__ to find
    # httpx's transport in.
    __slots__ = ("inner",)

    def __init__(self, inner):
        self.inner = inner

    handle_request = Retrying.handle_request


class SubclassRetrying(httpx.HTTPTransport):
    # httpx's transport itself, retrying around its own sending.
    def handle_request(self, request):
        for attempt in range(3):
            try:
                return super().handle_request(request)
            except httpx.TimeoutException:
                if attempt == 2:
                    raise
"""


@pytest.fixture(scope="session")
def retrying_transports() -> str:
    """Source of ``Retrying``/``AsyncRetrying``: transports that retry a timeout around
    httpx's own (appended to a test's or an agent's file, which imports httpx)."""
    return RETRYING_TRANSPORTS


@pytest.fixture(scope="session")
def readme_blocks() -> dict[str, str]:
    """The fenced blocks of README.md and the site's pages (docs/) that follow an
    ``<!-- example: PATH -->`` or ``<!-- output: NAME -->`` anchor, by anchor
    (``"output: docs/examples/x.py"``)."""
    import re
    from pathlib import Path

    root = Path(__file__).parents[1]
    pages = [root / "README.md", *sorted((root / "docs").rglob("*.md"))]
    text = "\n".join(page.read_text(encoding="utf-8") for page in pages)
    pattern = re.compile(r"<!-- ((?:example|output): [^>]+?) -->\n```[a-z]*\n(.*?)```", re.S)
    return {anchor: body for anchor, body in pattern.findall(text)}


REFERENCE_SUITE = Suite(
    (
        Matrix(
            models=("stub/retry", "stub/no-retry", "stub/verify"),
            tasks=("refund",),
            faults=("none", "lost_reply", "reset_after_commit", "timeout_before_commit"),
            protections=("bare",),
        ),
        Matrix(
            models=("stub/no-retry",),
            tasks=("refund",),
            faults=("lost_reply", "reset_after_commit"),
            protections=(
                "retry-nokey",
                "retry-randomkey",
                "retry-stepkey",
                "intent-key",
                "lookup",
            ),
        ),
        Matrix(
            models=("stub/drift", "stub/parallel"),
            tasks=("refund",),
            faults=("lost_reply", "none"),
            protections=("bare", "intent-key"),
        ),
    ),
    limit=4,
    source="tests/conftest.py",
)
"""The README's reference cells, four samples each."""


def run_once(
    made_once: MakeOnce, tmp_path_factory: pytest.TempPathFactory, name: str, suite: Suite
) -> RunResult:
    """An in-process run of ``suite`` whose trials run once per test run.

    The worker that runs it first returns its result; another resumes a copy of the finished
    folder (a second or so, where the trials take several): the same logs, trials and summary
    but for the summary's time of creation.
    """
    made: list[RunResult] = []
    folder = made_once(name, lambda out: made.append(run_suite(suite, out, report=True)))
    if made:
        return made[0]
    own = tmp_path_factory.mktemp(name)
    shutil.copytree(folder, own, dirs_exist_ok=True)
    return run_suite(suite, own, report=True)


@pytest.fixture(scope="session")
def reference_run(made_once: MakeOnce, tmp_path_factory: pytest.TempPathFactory) -> RunResult:
    """One in-process run of the reference suite (shared by the reference-result tests)."""
    return run_once(made_once, tmp_path_factory, "reference", REFERENCE_SUITE)


@pytest.fixture(scope="session")
def reference_summary(reference_run: RunResult) -> dict[str, Any]:
    """The run's summary.json, parsed."""
    data: dict[str, Any] = json.loads(Path(reference_run.summary_path).read_text())
    return data


@pytest.fixture(scope="session")
def trial_ledgers(reference_run: RunResult) -> Any:
    """``trial_ledgers(model, fault, protection)`` → the ledgers of that cell's trials."""
    return _ledgers_of(reference_run)


CONVERSATION_SUITE = Suite(
    (
        Matrix(
            models=("stub/retry", "stub/no-retry", "stub/verify"),
            tasks=("refund",),
            faults=(
                "ask_again",
                "compaction",
                "lost_reply+ask_again",
                "timeout_before_commit+ask_again",
                "compaction+ask_again",
            ),
            protections=("bare",),
        ),
        Matrix(
            models=("stub/retry", "stub/no-retry"),
            tasks=("refund",),
            faults=("ask_again", "compaction"),
            protections=("intent-key", "declared", "retry-stepkey", "lookup"),
        ),
        Matrix(
            models=("stub/retry",),
            tasks=("refund",),
            faults=("lost_reply+ask_again",),
            protections=("intent-key", "declared"),
        ),
    ),
    limit=2,
    source="tests/conftest.py",
)
"""The conversation faults' reference cells (docs/concepts/reference-results.md), two samples
each."""


def _ledgers_of(run: RunResult) -> Any:
    from inspect_ai.log import read_eval_log
    from twice.mocks import ledgers

    def find(model: str, fault: str, protection: str) -> list[Ledger]:
        for log in run.logs:
            meta = (log.eval.metadata or {}).get("twice", {})
            if (
                log.eval.model == model
                and meta.get("fault") == fault
                and meta.get("protection") == protection
            ):
                return ledgers(read_eval_log(log.location))
        raise LookupError(f"no log for {model} / {fault} / {protection}")

    return find


@pytest.fixture(scope="session")
def conversation_run(made_once: MakeOnce, tmp_path_factory: pytest.TempPathFactory) -> RunResult:
    """One in-process run of the conversation faults' reference suite."""
    return run_once(made_once, tmp_path_factory, "conversation", CONVERSATION_SUITE)


@pytest.fixture(scope="session")
def conversation_summary(conversation_run: RunResult) -> dict[str, Any]:
    """That run's summary.json, parsed."""
    data: dict[str, Any] = json.loads(Path(conversation_run.summary_path).read_text())
    return data


@pytest.fixture(scope="session")
def conversation_ledgers(conversation_run: RunResult) -> Any:
    """``conversation_ledgers(model, fault, protection)`` → the ledgers of that cell's trials."""
    return _ledgers_of(conversation_run)


# The browser tests (report, docs site): headless Debian Chromium driven by Playwright.
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@contextmanager
def _launch() -> Iterator[Any]:
    # Playwright's sync API keeps an event loop running in this thread while it is open, and
    # inspect's log readers call asyncio.run(): so a browser is opened only around page
    # checks, after the report is written, never for a whole session.
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def browser() -> Any:
    """Opens headless Debian Chromium through Playwright: ``with browser() as b: ...``.

    Skips when ``/usr/bin/chromium`` is missing, unless the ``CI`` environment variable is set:
    in CI a missing browser fails the test instead of hiding it.
    """
    if not CHROMIUM.exists():
        message = f"{CHROMIUM} is missing (apt-get install chromium)"
        if os.environ.get("CI"):
            pytest.fail(f"CI is set but {message}")
        pytest.skip(message)
    return _launch
