"""Running an agent command for a trial: its own process group, stopped with everything it
started, and the bounded, scrubbed tails of its output."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import time
from dataclasses import dataclass

from twice.tasks import scrub

OUTPUT_TAIL = 64 * 1024
"""Bytes logged of each of an agent command's output streams: the last ones."""
# Read beyond the tail: a credential that the tail's first byte cuts is then still whole in
# what was read, so it is scrubbed before the cut, never logged in part.
_SECRET_MARGIN = 16 * 1024
_KEPT_OUTPUT = OUTPUT_TAIL + _SECRET_MARGIN  # held of each stream while the command runs
_STOP_GRACE = 5.0  # seconds between SIGTERM and SIGKILL to the command's processes


@dataclass(frozen=True)
class CommandRun:
    """How an agent command ended: its exit code (negative: killed by that signal), the
    tails of its output (unscrubbed: see :func:`output_tail`), whether it ran out of time,
    and how many bytes it wrote to each stream."""

    returncode: int
    stdout: str
    stderr: str
    timed_out: bool = False
    stdout_bytes: int = 0
    stderr_bytes: int = 0


def output_tail(kept: str, written: int, secrets: list[str]) -> tuple[str, bool]:
    """What is logged of an output stream: its last :data:`OUTPUT_TAIL` bytes, scrubbed of
    ``secrets``, and whether that is less than the ``written`` bytes.

    Args:
        kept: What :func:`run_command` kept of the stream (its tail, decoded).
        written: How many bytes the command wrote to the stream.
        secrets: The credentials to scrub (:func:`tasks.secret_values`).
    """
    text = scrub(kept, secrets)
    if written <= OUTPUT_TAIL:
        return text, False
    if written > _KEPT_OUTPUT:
        # What was kept starts mid-stream, perhaps inside a credential it cannot recognise:
        # the margin read for that goes, with whatever it holds.
        text = text[_SECRET_MARGIN:]
    return text.encode()[-OUTPUT_TAIL:].decode("utf-8", "ignore"), True


def code_block(text: str) -> str:
    """``text`` as a Markdown code block, fenced by more backticks than any run of them in
    it, so nothing in it ends the block (or is read as Markdown or HTML)."""
    longest = max((len(run) for run in re.findall("`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}text\n{text}\n{fence}"


async def run_command(command: str, env: dict[str, str], cwd: str, timeout: float) -> CommandRun:
    """Run ``sh -c COMMAND`` with ``env`` added to this process's environment.

    The command gets a process group of its own, and every process in it is stopped (SIGTERM,
    then SIGKILL after a grace) when the command runs out of ``timeout``, when the trial is
    cancelled, and after the command exits: a shell's child or an agent's background job
    would otherwise outlive the trial, and hold its output pipes open so it never ends.
    """
    proc = await asyncio.create_subprocess_exec(
        "sh", "-c", command,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=cwd,
        env={**os.environ, **env},
        start_new_session=True,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stderr is not None
    readers = [asyncio.create_task(_tail(proc.stdout)), asyncio.create_task(_tail(proc.stderr))]
    try:
        timed_out = not await _exited(proc, timeout)
        await _stop_group(proc)
        (out, out_bytes), (err, err_bytes) = await asyncio.gather(*readers)
    except BaseException:  # cancelled: nothing of the command may outlive its trial
        _signal_group(proc, signal.SIGKILL)
        for reader in readers:
            reader.cancel()
        raise
    returncode = proc.returncode if proc.returncode is not None else -signal.SIGKILL
    return CommandRun(returncode, out, err, timed_out, out_bytes, err_bytes)


async def _tail(stream: asyncio.StreamReader) -> tuple[str, int]:
    """The stream's last :data:`_KEPT_OUTPUT` bytes, decoded, and how many it carried: a
    command may write gigabytes, and only the tail is ever held."""
    kept = bytearray()
    written = 0
    while chunk := await stream.read(65536):
        written += len(chunk)
        kept += chunk
        del kept[:-_KEPT_OUTPUT]
    return kept.decode("utf-8", "replace"), written


_EXIT_POLL = 0.02


async def _exited(proc: asyncio.subprocess.Process, timeout: float) -> bool:
    """Whether the command's own process exited within ``timeout`` seconds.

    Its exit status, not ``proc.wait()``: on Python 3.11 that also waits for every holder of
    its output pipes to close them, which a background job it left may never do."""
    deadline = time.monotonic() + timeout
    while proc.returncode is None:
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(_EXIT_POLL)
    return True


async def _stop_group(proc: asyncio.subprocess.Process) -> None:
    """SIGTERM to the command's process group, SIGKILL to what is left after the grace."""
    if not _signal_group(proc, signal.SIGTERM):
        return  # nothing left
    deadline = time.monotonic() + _STOP_GRACE
    while time.monotonic() < deadline:
        if proc.returncode is not None and not _signal_group(proc, 0):
            return
        await asyncio.sleep(_EXIT_POLL)
    _signal_group(proc, signal.SIGKILL)


def _signal_group(proc: asyncio.subprocess.Process, sig: int) -> bool:
    """Send ``sig`` to the command's process group; False when none of it is left."""
    if os.name != "posix":  # no process groups: the command's own process only
        if proc.returncode is not None:
            return False
        if sig:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(sig)
        return True
    try:
        os.killpg(proc.pid, sig)  # its pid is its group's id (start_new_session)
    except (ProcessLookupError, PermissionError):  # gone (or its id reused by another user)
        return False
    return True
