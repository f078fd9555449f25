"""The ``twice`` command group and the console script's entry point."""

from __future__ import annotations

import atexit
import contextlib
import errno
import gc
import os
import sys
import threading
from typing import Any

import click
from twice.mocks import TwiceError

from .._inspect_compat import init_dotenv
from ..run import batch_gc
from . import _common
from ._frameworks import frameworks
from ._gate import gate
from ._list import list_
from ._local_model import local_model
from ._report import report
from ._run import run
from ._serve import serve
from ._trials import trials


class TwiceGroup(click.Group):
    """The ``twice`` command group: where a twice exception becomes an exit code.

    Every command raises what went wrong as a :class:`~twice.mocks.TwiceError` and none
    exits on its own for one: its ``exit_code`` (2 for a ``UsageError``, 1 for a
    ``RunError``) is the exit status, after one line ``error: MESSAGE`` on stderr with any
    credential of the environment redacted. click's own usage errors (a bad flag value) stay
    click's. Here rather than in ``main`` so that a test's ``CliRunner`` sees the same.
    """

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except TwiceError as ex:
            from twice.tasks import scrub

            click.echo(f"error: {scrub(str(ex))}", err=True)
            ctx.exit(ex.exit_code)


@click.group(cls=TwiceGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="twice")
def cli() -> None:
    """twice: catch AI agents doing a mutating action twice."""
    # As `inspect` does: a .env file from the working directory up supplies keys and base
    # URLs, before models are built, keys checked or scrubbing values read.
    init_dotenv()


class ReaderGone:
    """Standard output that goes quietly to /dev/null once its reader has left.

    ``twice gate ... | head -1`` or ``twice run | head``: the reader closes the pipe after
    the lines it wanted, and the next write fails with ``BrokenPipeError`` (Python ignores
    SIGPIPE), wherever it is: in click's last echo (exit 1 for a gate that passed) or in
    inspect's progress display mid-run (the run ended there, its summary still "running").
    What the command does does not depend on who reads its output, so it goes on and exits
    with its own code; the output nobody reads is dropped, as the Python docs' "Note on
    SIGPIPE" advises (stdout pointed at devnull). Every other error is raised as before.
    """

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return int(self._stream.write(text))
        except BrokenPipeError:
            _discard_stdout()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            _discard_stdout()
            with contextlib.suppress(OSError, ValueError):
                self._stream.flush()  # what it held, into /dev/null: nothing left at exit

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def main() -> None:
    """Console-script entry point."""
    _common.OWN_PROCESS = True
    atexit.register(_common.signals_cannot_end_the_exit)
    batch_gc()
    if sys.stdout is not None:
        sys.stdout = ReaderGone(sys.stdout)  # type: ignore[assignment]
    try:
        cli()
    except OSError as ex:
        if not _stdout_fails(ex):
            raise
        # A full disk or /dev/full behind `>`: one line, as any other write that fails.
        _discard_stdout()
        click.echo(f"error: cannot write to standard output: {ex.strerror or ex}", err=True)
        sys.exit(2)
    finally:
        # Everything is written by now: spare the interpreter its last walk over every live
        # object (inspect, pandas and the SDKs inspect imports) as it shuts down, 0.8 s at
        # every exit on the 2-core reference machine. Exit handlers still run.
        gc.freeze()
        release_worker_threads()


def _stdout_fails(error: OSError) -> bool:
    """Whether standard output is what failed, not a file of the run's (which has its own
    message).

    The failing frame cannot tell: click's ``echo`` and a plain ``print`` (inspect's
    progress display during ``twice run``) both write from C, and a failed flush drops
    the buffer, so flushing again succeeds. So stdout is asked directly, with one byte,
    and only for the errors a write to a file, a full disk or a closed descriptor gives:
    when stdout is fine, a traceback follows that newline anyway.
    """
    if error.errno not in _WRITE_ERRORS:
        return False
    try:
        descriptor = sys.stdout.fileno()
    except (AttributeError, ValueError, OSError):  # no stdout, or one with no descriptor
        return False
    try:
        os.write(descriptor, b"\n")
    except OSError:
        return True
    return False


_WRITE_ERRORS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO, errno.EBADF}


def _discard_stdout() -> None:
    """Point standard output at /dev/null, so the interpreter's last flush of what could not
    be written does not end in "Exception ignored" on the way out."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def release_worker_threads() -> None:
    """Stop the idle AnyIO worker threads an interrupted event loop left behind.

    AnyIO stops a worker thread when the task that started it finishes. A run stopped by a
    signal while its trials ran can close inspect's event loop with that task unfinished; the
    thread, which is not a daemon, then waits on its queue forever, and so did the interpreter
    at exit: a ``--workers`` worker sent SIGTERM had written its summary and never ended.
    Each is told to stop the way AnyIO tells it (``None`` on its queue); one still busy
    finishes its call first.
    """
    try:
        from anyio._backends._asyncio import WorkerThread
    except ImportError:  # another AnyIO layout: nothing of ours to release
        return
    for thread in threading.enumerate():
        if isinstance(thread, WorkerThread) and thread.is_alive():
            with contextlib.suppress(Exception):  # a full queue: the thread is mid-call
                thread.queue.put_nowait(None)


cli.add_command(frameworks)
cli.add_command(gate)
cli.add_command(list_)
cli.add_command(local_model)
cli.add_command(report)
cli.add_command(run)
cli.add_command(serve)
cli.add_command(trials)
