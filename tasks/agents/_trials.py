"""The agent trials running in this process, and how a request twice will not serve is refused.

:mod:`._hosts` serves each running trial's HTTP traffic from its services; this module keeps
the trials themselves (which hosts each one mocks, what was refused on its behalf) and the
refusals that outlive a trial: a request sent after its trial ended, or from a process forked
from the eval's, reported back over a pipe.
"""

from __future__ import annotations

import contextlib
import os
import select
import threading
from contextvars import ContextVar
from dataclasses import dataclass, field

import httpx
from twice.mocks import Services, through_own_transport

from ._context import AgentLimitError


@dataclass(eq=False)
class _Trial:
    services: Services
    hosts: tuple[tuple[str, str], ...]
    """``(production URL prefix, mock base URL)`` pairs from ``--mock SERVICE=URL``."""
    refused: list[str] = field(default_factory=list)
    """Requests twice refused that this trial's agent may have sent: whatever the agent made
    of the exception, the trial errors."""
    ended: bool = False
    """Its agent has returned: a request in its context now comes from a thread that
    outlived it."""

    def serve(self, request: httpx.Request) -> httpx.Response | None:
        """The trial's services' answer to ``request``, or None for a host they do not mock.

        A client whose own transport wraps httpx's (a retrying transport) sends through it,
        so every attempt it makes is served (:func:`twice.mocks.through_own_transport`)."""
        if not self.owns(request):
            return None
        return through_own_transport(request, self._dispatch)  # type: ignore[return-value]

    def owns(self, request: httpx.Request) -> bool:
        """Whether ``request`` is for a host this trial's services serve."""
        return self._target(str(request.url)) is not None

    def _dispatch(self, request: httpx.Request) -> httpx.Response:
        url = str(request.url)
        target = self._target(url)
        assert target is not None  # checked by serve() for the same URL
        if target != url:  # a --mock production URL, moved onto the service's base URL
            request = httpx.Request(
                request.method, target, headers=request.headers, content=request.content
            )
        return self.services.dispatch(request)

    def _target(self, url: str) -> str | None:
        """The URL the services take ``url`` as (a ``--mock`` production URL moved onto the
        service's base URL), or None for a host no service mocks."""
        for service in self.services.services.values():
            if _under(url, service.base_url):
                return url
        for prefix, base in self.hosts:
            if _under(url, prefix):
                return base + url[len(prefix) :]
        return None


_TRIAL: ContextVar[_Trial | None] = ContextVar("twice_agent_trial", default=None)
_live: dict[int, _Trial] = {}
"""The trials running now, by id: whose hosts a request with no trial context may be for."""


def _under(url: str, prefix: str) -> bool:
    p = prefix.rstrip("/")
    return url == p or url.startswith((p + "/", p + "?"))


def _owners(url: str, trial: _Trial | None) -> list[_Trial]:
    """The trials a request for ``url`` may belong to: its own trial if it carries one, else
    any running trial (which sent it is unknown); only those whose services mock ``url``."""
    candidates = [trial] if trial is not None else list(_live.values())
    return [t for t in candidates if t._target(url) is not None]


def _refuse(trials: list[_Trial], message: str) -> None:
    """Refuse a request: mark ``trials`` (each errors, whatever the agent makes of the
    exception) and raise."""
    for t in trials:
        t.refused.append(message)
    raise AgentLimitError(message)


_late: list[str] = []
"""Requests refused because their trial had ended (:func:`take_late_requests`)."""
_late_lock = threading.Lock()


def _refuse_late(what: str) -> None:
    message = (
        f"{what} was sent after its trial ended, from a task or thread the agent started and "
        "did not wait for; it was not served (nor sent on), and the trial was scored without "
        "it: await the task, join the thread (or await the executor's future) before the "
        "agent returns"
    )
    with _late_lock:
        _late.append(message)
    raise AgentLimitError(message)


def take_late_requests() -> list[str]:
    """The requests refused since the last call because they came after their trial ended
    (each trial was scored without its request), or from a child process of a trial that
    has ended: a run reports them and exits 1."""
    with _late_lock:
        out = list(_late) + _take_child_refusals()
        _late.clear()
    return out


def _refuse_in_child(request: httpx.Request, trial: _Trial | None) -> None:
    """Refuse a trial's request from a process forked from the eval's (a ``multiprocessing``
    or ``ProcessPoolExecutor`` worker): its effect would be recorded in the child's copy of
    the ledger and lost with it, while the agent saw it succeed."""
    # A child forked from a thread without the trial's context has the trials that ran at
    # the fork (its copy of them): a request for one of their hosts is refused all the same.
    owners = _owners(str(request.url), trial)
    if not owners:
        return
    message = (
        f"{request.method} {request.url} came from a child process (multiprocessing, a "
        "ProcessPoolExecutor): the trial's ledger lives in the eval's process, so its effect "
        "could not be counted; it was not served (nor sent on): make the call from the "
        "agent's process (a thread, or asyncio.to_thread)"
    )
    for t in owners:  # the eval's process errors the trial, whatever the agent makes of it
        _tell_parent(id(t), message)
    raise AgentLimitError(message)


_PIPE_BUF: int = getattr(select, "PIPE_BUF", 512)
"""Bytes one pipe write is atomic up to (a child's line is cut to fit)."""
_from_children: tuple[int, int] | None = None
"""A pipe (read end, write end) on which forked children report their refusals."""
_child_refusals: dict[int, list[str]] = {}
"""Refusals children reported, by trial id, not yet taken by their trial."""


def _open_child_pipe() -> None:
    global _from_children
    if _from_children is None:
        read, write = os.pipe()
        os.set_blocking(read, False)
        os.set_blocking(write, False)  # a child never waits on a full pipe: it drops the line
        _from_children = (read, write)


def _tell_parent(trial_id: int, message: str) -> None:
    if _from_children is None:
        return
    line = f"{trial_id}\t{' '.join(message.split())}"[: _PIPE_BUF - 1] + "\n"
    with contextlib.suppress(OSError):  # one write under PIPE_BUF is atomic
        os.write(_from_children[1], line.encode("utf-8", "replace"))


def _take_child_refusals(trial_id: int | None = None) -> list[str]:
    """Read what children reported; return (and forget) ``trial_id``'s refusals, or, with
    None, those of every trial no longer running (their requests came late)."""
    if _from_children is not None:
        chunks = []
        with contextlib.suppress(BlockingIOError, OSError):
            while chunk := os.read(_from_children[0], 65536):
                chunks.append(chunk)
        for line in b"".join(chunks).decode("utf-8", "replace").splitlines():
            tid, _, message = line.partition("\t")
            if tid.isdigit() and message:
                _child_refusals.setdefault(int(tid), []).append(message)
    if trial_id is not None:
        return _child_refusals.pop(trial_id, [])
    gone = [tid for tid in _child_refusals if tid not in _live]
    return [m for tid in gone for m in _child_refusals.pop(tid)]


def _refuse_without_context(request: httpx.Request) -> None:
    """Refuse a request for a running trial's host that carries no trial context.

    A thread the agent starts carries its trial's context (:func:`_carry_trial_context`);
    one started outside any trial (a pool an agent module made when imported) does not, so
    which trial sent the request is unknown. Passed through, it went to the production URL
    behind ``--mock`` (or a ``*.twice.test`` name) while the trial counted no effect. Every
    running trial the host belongs to is marked (any of them may have sent it), so each
    errors even when the agent catches this exception.
    """
    mine = _owners(str(request.url), None)
    if mine:
        _refuse_without_trial(mine, f"{request.method} {request.url}")


def _refuse_without_trial(trials: list[_Trial], what: str) -> None:
    _refuse(
        trials,
        f"{what} came from a thread that carries no trial's context (one started outside "
        f"any trial, such as a pool made when the agent's module was imported), so twice "
        f"cannot tell which of the {len(trials)} running trial(s) it belongs to; it was not "
        "served (nor sent on): start threads and executors from within the agent, or use "
        "asyncio.to_thread",
    )
