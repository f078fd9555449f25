"""The server's lifecycle: check the options, bind, replay the log, run uvicorn in the
foreground (:func:`serve`) or in a thread (:func:`running_server`), and stop cleanly.

A connection may wait at most :data:`IDLE_SECONDS` for a whole request head, from when it is
opened or its last reply ends: one opened and left silent, or fed a header a byte at a time,
is closed then. A request being served (a ``hang`` reply held open) is not idle.
"""

from __future__ import annotations

import asyncio
import re
import socket
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

from twice.tasks import add_openapi_task

from ..suite import DEFAULT_HANG_SECONDS, check_hang_seconds
from ._app import DEFAULT_HOST, TwiceServer
from ._errors import ServeError
from ._guard import is_loopback
from ._log import DamagedLog, RequestLog
from ._registry import own_tasks
from ._upstream import parse_upstreams

DEFAULT_PORT = 8765
DEFAULT_DB = "twice-serve.sqlite"
IDLE_SECONDS = 5.0
"""Seconds a connection may wait for a whole request head, from when it opens or its last
reply ends (uvicorn's own keep-alive bound counts only from a reply)."""
MAX_HEAD_BYTES = 1 << 20
"""The largest request head (request line and headers) the server reads, in bytes.

h11 bounds only a head that arrives in more than one read, at 16 KiB by default: the same long
URL was then served or refused by how the kernel happened to split it. Up to this bound a URL
too long for a service is its 414, whatever the split; past it, uvicorn's 400."""
TOKEN_CHARS = re.compile(r"[\x21-\x7e]+")
"""What a ``--token`` may be: visible ASCII, no spaces (it travels in an HTTP header)."""


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


@dataclass
class Running:
    """A started server: where it listens, its app, and how to stop it."""

    url: str
    app: TwiceServer
    stop: Callable[[], None]


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP, not the default 0: asyncio turns Nagle's algorithm off (TCP_NODELAY) only on
    # sockets that say they are TCP, and an accepted socket inherits the listener's proto. With
    # Nagle on, a reply written as head then body waits for the client's delayed ACK: about
    # 40 ms on every request after the first on a kept-alive connection.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as ex:
        sock.close()
        raise ServeError(f"cannot listen on {host}:{port}: {ex.strerror}") from None
    sock.listen(2048)
    sock.setblocking(False)
    return sock


def check_options(db: str | Path, token: str | None) -> None:
    """Refuse a ``--db`` or ``--token`` that would quietly turn a safeguard off.

    An empty ``--db`` would keep nothing and take no one-server lock; an empty ``--token``
    would mean no authentication at all. ``:memory:`` is the way to ask for a log that is not
    kept.

    Raises:
        ServeError: naming the option, its value (never a token's) and what is accepted.
    """
    if not str(db).strip():
        raise ServeError(
            f"--db {str(db)!r} is not a file: give the request log's path (default "
            f"{DEFAULT_DB}), or ':memory:' for one that is not kept (no restore, no lock)"
        )
    if token is not None and not TOKEN_CHARS.fullmatch(token):
        shown = repr(token) if not token.strip() else "(not shown)"
        raise ServeError(
            f"--token {shown} is not a usable bearer token: give one or more visible ASCII "
            "characters, no spaces (or leave --token out for no authentication, which only a "
            "loopback bind allows)"
        )


OPENAPI_FORM = "NAME=PATH[:DATASET.jsonl][,OVERRIDES]"


def openapi_tasks(specs: Sequence[str]) -> tuple[str, ...]:
    """Make a task of each ``--openapi`` value and return their names: ``NAME=PATH`` serves
    the document at PATH as the service NAME, in trials of the task NAME (one sample,
    ``NAME-1``, with no starting objects); ``NAME=PATH:DATASET.jsonl`` takes the samples
    from a dataset; ``,OVERRIDES`` adds an overrides file.

    Raises:
        ServeError: naming a value not of that form, or a document, dataset or overrides
            file that cannot be used.
    """
    names: list[str] = []
    for spec in specs:
        name, eq, rest = spec.partition("=")
        rest, comma, overrides = rest.partition(",")
        path, colon, dataset = rest.rpartition(":") if rest.endswith(".jsonl") else (rest, "", "")
        if not eq or not name or not path or (colon and not dataset):
            raise ServeError(f"--openapi {spec!r}: expected {OPENAPI_FORM}")
        if name in names:
            raise ServeError(f"--openapi {spec!r}: the name {name!r} is given twice")
        try:
            add_openapi_task(name, path, dataset or None, overrides if comma else None)
        except ValueError as ex:
            raise ServeError(f"--openapi {spec!r}: {ex}") from None
        names.append(name)
    return tuple(names)


def _prepare(
    host: str,
    port: int,
    db: str | Path,
    token: str | None,
    tasks: Sequence[str],
    hang_seconds: float = DEFAULT_HANG_SECONDS,
    upstreams: Sequence[str] = (),
    upstream_allow: Sequence[str] = (),
    openapi: Sequence[str] = (),
) -> tuple[socket.socket, TwiceServer]:
    check_options(db, token)
    parsed = parse_upstreams(upstreams, upstream_allow)
    if not is_loopback(host) and not token:
        raise ServeError(
            f"refusing to bind {host!r} without --token: off loopback the control API needs a "
            "bearer token (or bind 127.0.0.1)"
        )
    try:
        check_hang_seconds(hang_seconds, "--hang-seconds")
    except ValueError as ex:
        raise ServeError(str(ex)) from None
    tasks = (*tasks, *openapi_tasks(openapi))
    own_tasks(tasks)  # before the database and the port are touched
    sock = _bind(host, port)  # first: a busy port leaves no database or lock behind
    try:
        log = RequestLog(db)
    except ValueError as ex:
        sock.close()
        raise ServeError(str(ex)) from None
    except BaseException:
        sock.close()
        raise
    bound_port = sock.getsockname()[1]
    shown = host if host not in ("0.0.0.0", "::") else socket.gethostname()
    try:
        app = TwiceServer(
            log,
            f"http://{_url_host(shown)}:{bound_port}",
            token=token,
            host=host,
            tasks=tasks,
            hang_seconds=hang_seconds,
            upstreams=parsed,
        )
    except BaseException as ex:
        sock.close()
        log.close()
        if isinstance(ex, DamagedLog):
            raise ServeError(str(ex)) from None
        raise
    return sock, app


def _protocol() -> type[Any]:
    """uvicorn's h11 protocol, with a bound (the config's ``timeout_keep_alive``, by default
    :data:`IDLE_SECONDS`) on the time a connection waits for a whole request head."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class Protocol(H11Protocol):
        # uvicorn arms its keep-alive timer only when a reply ends, and any byte cancels it:
        # by itself it holds a connection opened and left silent, or fed a header slowly,
        # for ever.
        _idle: asyncio.TimerHandle | None = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self._serving():
                self._disarm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            # (A pipelined request may be being served already.)
            if not self._serving() and not self.transport.is_closing():
                self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _serving(self) -> bool:
            return self.cycle is not None and not self.cycle.response_complete

        def _arm(self) -> None:
            self._disarm()
            self._idle = self.loop.call_later(self.timeout_keep_alive, self._expire)

        def _disarm(self) -> None:
            if self._idle is not None:
                self._idle.cancel()
                self._idle = None

        def _expire(self) -> None:
            self._idle = None
            # A request being served (a held reply included) is not idle.
            if not self._serving() and not self.transport.is_closing():
                self.transport.close()

    return Protocol


def _uvicorn_server(config: Any, app: TwiceServer) -> Any:
    """uvicorn's server, which also tells ``app`` when it begins to stop and keeps the signal
    that stopped it (``stopped_by``)."""
    import uvicorn

    class Server(uvicorn.Server):
        stopped_by: int | None = None

        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            if self.stopped_by is None:
                self.stopped_by = sig
            super().handle_exit(sig, frame)

        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            app.stopping.set()  # before uvicorn waits for the open requests
            await super().shutdown(sockets)
            # Here, not after serve() returns: uvicorn then raises the signal that stopped it
            # again, and its default action (SIGTERM's, or SIGINT's KeyboardInterrupt) ends
            # the process before any later line runs, leaving every record in the -wal
            # file beside an empty --db.
            await app.close()

    return Server(config)


async def _serve_async(
    sock: socket.socket,
    app: TwiceServer,
    started: Callable[[], None],
    stop: asyncio.Event | None,
    idle_seconds: float = IDLE_SECONDS,
) -> int | None:
    """Serve until a stop signal (or ``stop``); returns the signal that stopped it, if any."""
    import uvicorn

    config = uvicorn.Config(
        app,
        http=_protocol(),  # uvicorn's h11: drop_connection relies on this protocol's transport
        # Typed int by uvicorn; it is only handed to loop.call_later, which takes a float.
        timeout_keep_alive=idle_seconds,  # type: ignore[arg-type]
        lifespan="off",
        log_level="warning",
        access_log=False,
        ws="none",
        timeout_graceful_shutdown=2,
        h11_max_incomplete_event_size=MAX_HEAD_BYTES,
    )
    server = _uvicorn_server(config, app)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started and not task.done():
        await asyncio.sleep(0.01)
    if server.started:
        started()
    if stop is not None:
        stopper = asyncio.create_task(stop.wait())
        await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
        server.should_exit = True
        stopper.cancel()
    await task
    await app.close()  # when it stopped before it started (and so never shut down)
    stopped_by: int | None = server.stopped_by
    return stopped_by


def serve(
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    db: str | Path = DEFAULT_DB,
    token: str | None = None,
    out: TextIO | None = None,
    tasks: Sequence[str] = (),
    hang_seconds: float = DEFAULT_HANG_SECONDS,
    upstreams: Sequence[str] = (),
    upstream_allow: Sequence[str] = (),
    openapi: Sequence[str] = (),
) -> int | None:
    """Run ``twice serve`` in the foreground until a stop signal.

    Prints ``listening on http://HOST:PORT`` once it accepts connections, as the first line
    on ``out`` (standard output): a client may read it for the port. ``tasks``: tasks of your
    own (``path.py:function``) trials may be made of, beside the built-in ones.
    ``hang_seconds``: how long a trial that gives none holds a lost reply open.
    ``upstreams``: ``NAME=URL`` real services a trial's requests to ``NAME`` are forwarded
    to; each host must be loopback or one of ``upstream_allow``.
    ``openapi``: services made from OpenAPI documents, ``NAME=PATH`` each (see
    :func:`openapi_tasks`).

    Returns:
        The signal that stopped it, when that signal's own action did not end the process
        (one the process was started ignoring); the caller exits with the shell's code for
        it. A SIGINT otherwise raises ``KeyboardInterrupt``.

    Raises:
        ServeError: for a non-loopback host without a token, an empty ``db`` or a token that
            is empty or has spaces, a busy port, a file that is not a twice serve database,
            a task of your own that cannot be loaded, a ``hang_seconds`` out of range, or
            an upstream that is malformed or on a host neither loopback nor allowed.
    """
    stream = out or sys.stdout
    sock, app = _prepare(
        host, port, db, token, tasks, hang_seconds, upstreams, upstream_allow, openapi
    )

    def started() -> None:
        if app.replayed:  # on stderr: the first line of stdout is the address
            print(
                f"replayed {app.replayed} logged records: {len(app.trials)} trial(s) restored",
                file=sys.stderr,
            )
        print(f"listening on {app.base_url}", file=stream, flush=True)

    return asyncio.run(_serve_async(sock, app, started, None))


@contextmanager
def running_server(
    db: str | Path = ":memory:",
    host: str = DEFAULT_HOST,
    port: int = 0,
    token: str | None = None,
    tasks: Sequence[str] = (),
    idle_seconds: float = IDLE_SECONDS,
    hang_seconds: float = DEFAULT_HANG_SECONDS,
    upstreams: Sequence[str] = (),
    upstream_allow: Sequence[str] = (),
    openapi: Sequence[str] = (),
) -> Iterator[Running]:
    """Run a twice server in a background thread (tests, benches, ``--agent-cmd``).

    ``tasks``: tasks of your own (``path.py:function``) it hosts beside the built-in ones.
    ``idle_seconds``: how long a connection may wait for a whole request (see
    :data:`IDLE_SECONDS`).
    ``hang_seconds``: how long a trial that gives none holds a lost reply open.
    ``upstreams``, ``upstream_allow``: as for :func:`serve`.
    ``openapi``: services made from OpenAPI documents, ``NAME=PATH`` each.

    Yields:
        The running server; it stops when the block ends.
    """
    sock, app = _prepare(
        host, port, db, token, tasks, hang_seconds, upstreams, upstream_allow, openapi
    )
    ready = threading.Event()
    loop = asyncio.new_event_loop()
    stop_event: asyncio.Event | None = None
    failure: list[BaseException] = []

    def main() -> None:
        nonlocal stop_event
        asyncio.set_event_loop(loop)
        stop_event = asyncio.Event()
        try:
            loop.run_until_complete(_serve_async(sock, app, ready.set, stop_event, idle_seconds))
        except BaseException as ex:
            failure.append(ex)
            ready.set()
        finally:
            loop.close()

    thread = threading.Thread(target=main, name="twice-serve", daemon=True)
    thread.start()
    ready.wait(30)
    if failure:
        raise failure[0]

    def stop() -> None:
        if stop_event is not None and not loop.is_closed():
            loop.call_soon_threadsafe(stop_event.set)
        thread.join(15)

    try:
        yield Running(app.base_url, app, stop)
    finally:
        stop()
