"""What a served trial is made from: the body of ``POST /_twice/trials``, validated once into
a :class:`TrialConfig`."""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from twice.assertions import Intent
from twice.mocks import CONVERSATION_FAULTS, FAULTS
from twice.tasks import AGENT_FAULTS_REFUSED, PROTECTIONS, TASKS, task_parts

from ..suite import DEFAULT_HANG_SECONDS, check_hang_seconds
from ._errors import ControlError
from ._upstream import UPSTREAMS_ONLY

LOST_REPLY_MODES = ("hang",)
"""Accepted values of the deprecated ``lost_reply`` trial field (every timeout fault hangs;
the old ``drop`` is the fault ``reset_after_commit``)."""
TRIAL_FIELDS = ("task", "sample", "fault", "protection", "lost_reply", "hang_seconds", "intents")
SERVE_FAULTS = tuple(f for f in FAULTS if f not in AGENT_FAULTS_REFUSED)
"""The faults a served trial takes: all but those only twice's own agent loop can run."""


@dataclass(frozen=True)
class TrialConfig:
    """What a trial is made from (the body of ``POST /_twice/trials``, validated)."""

    task: str
    sample: str
    fault: str = "none"
    protection: str = "bare"
    hang_seconds: float = DEFAULT_HANG_SECONDS
    """Seconds a lost reply (a timeout fault) is held open before its connection is closed."""
    intents: list[dict[str, Any]] | None = None
    """What should happen, judged by the verdict in place of the sample's own intents
    (``{"effect", "identity", "expected", "values"}`` each): how a trial in front of an
    ``--upstream`` of your own says which effects count. None: the sample's."""


def _json(value: Any) -> str:
    """A request's value as the client wrote it (``null``, ``true``, ``"x"``), not Python's."""
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)


def parse_trial_config(
    body: Any,
    tasks: Sequence[str] = (),
    hang_seconds: float = DEFAULT_HANG_SECONDS,
    upstreams: Sequence[str] = (),
) -> TrialConfig:
    """Validate a ``POST /_twice/trials`` body.

    ``task`` is a built-in task or one of ``tasks``: the tasks of your own the server was
    started with (``twice serve --task path.py:function``). A request never names a file for
    the server to load: that would run code a client chose. ``hang_seconds`` is the server's
    default for a body that gives none. On a server with ``upstreams`` (``--upstream``),
    ``task`` may be left out: the trial then has the upstreams alone (its ``task`` is
    :data:`UPSTREAMS_ONLY`) and its ``intents`` say what should happen.

    The ``lost_reply`` field is deprecated: a timeout fault always holds the reply open, so
    ``"hang"`` is accepted and changes nothing, and ``"drop"`` (a connection closed at once)
    is refused with a pointer to the fault that does it, ``reset_after_commit``.

    Raises:
        ControlError: 400, naming the bad field and what is accepted.
    """
    body = _trial_fields(body)
    if upstreams and _given(body, "task", None) is None:
        if _given(body, "sample", None) is not None:
            raise ControlError(
                400,
                "sample names a sample of a task; this trial has no task, only upstreams "
                f"({', '.join(upstreams)}): give a task, or leave sample out",
                "sample",
            )
        task = sample = UPSTREAMS_ONLY
    else:
        task = _task(body, tasks)
        sample = _sample(body, task)
    hang = _hang_seconds(body, hang_seconds)
    _check_lost_reply(body)
    _check_fault_served(body)
    return TrialConfig(
        task=task,
        sample=sample,
        fault=_choice(body, "fault", SERVE_FAULTS, "none"),
        protection=_choice(body, "protection", PROTECTIONS, "bare"),
        hang_seconds=hang,
        intents=_intents(body),
    )


def _intents(body: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The trial's own intents, each checked as the verdict will read it."""
    given = body.get("intents")
    if given is None:
        return None
    shape = 'a list of {"effect", "identity", "expected", "values"} objects'
    if not isinstance(given, list):
        raise ControlError(400, f"intents {_json(given)[:100]} is not {shape}", "intents")
    for n, item in enumerate(given):
        try:
            if not isinstance(item, dict) or not isinstance(item.get("effect"), str):
                raise ValueError("it needs an 'effect' name")
            if not isinstance(item.get("identity", {}), dict):
                raise ValueError("its 'identity' must be an object")
            if not isinstance(item.get("values") or {}, dict):
                raise ValueError("its 'values' must be an object")
            Intent.from_dict(item)
        except (TypeError, ValueError) as ex:
            raise ControlError(
                400,
                f"intents[{n}] {_json(item)[:100]} is not valid ({ex}); give {shape}",
                "intents",
            ) from None
    return [dict(item) for item in given]


def _trial_fields(body: Any) -> dict[str, Any]:
    """``body`` as a JSON object of known fields only."""
    if not isinstance(body, dict):
        raise ControlError(400, "the body must be a JSON object with at least 'task'")
    unknown = sorted(set(body) - set(TRIAL_FIELDS))
    if unknown:
        raise ControlError(
            400,
            f"unknown field(s) {', '.join(map(repr, unknown))}; "
            f"accepted: {', '.join(TRIAL_FIELDS)}",
            unknown[0],
        )
    return body


def _given(body: dict[str, Any], name: str, default: Any) -> Any:
    # JSON null is "not given": the field's default, as when it is left out.
    value = body.get(name)
    return default if value is None else value


def _choice(body: dict[str, Any], name: str, allowed: Collection[str], default: str | None) -> str:
    """Field ``name``, one of ``allowed`` (``default`` when not given; None: required)."""
    value = _given(body, name, default)
    if value is None:
        raise ControlError(400, f"{name} is required; one of: {', '.join(allowed)}", name)
    if not isinstance(value, str) or value not in allowed:
        raise ControlError(400, f"{name} {_json(value)} is not one of: {', '.join(allowed)}", name)
    return value


def _task(body: dict[str, Any], tasks: Sequence[str]) -> str:
    """The trial's task: a built-in one or one of the server's own ``tasks``."""
    task = _given(body, "task", None)
    if isinstance(task, str) and ":" in task and task not in tasks:
        raise ControlError(
            400,
            f"task {_json(task)} is not one this server was started with; a task of your own "
            f"is named when it starts (twice serve --task {task}) and then exactly as there; "
            + (f"started with: {', '.join(map(_json, tasks))}; " if tasks else "")
            + f"built-in: {', '.join(TASKS)}",
            "task",
        )
    return _choice(body, "task", (*TASKS, *tasks), None)


def _sample(body: dict[str, Any], task: str) -> str:
    """The trial's sample of ``task`` (its first when not given)."""
    samples = [str(s.id) for s in task_parts(task).dataset]
    sample = _given(body, "sample", samples[0])
    if not isinstance(sample, str) or sample not in samples:
        raise ControlError(
            400,
            f"sample {_json(sample)} is not in task {task!r}; its samples are "
            f"{samples[0]} ... {samples[-1]} ({len(samples)})",
            "sample",
        )
    return sample


def _hang_seconds(body: dict[str, Any], default: float) -> float:
    try:
        return check_hang_seconds(_given(body, "hang_seconds", default))
    except ValueError as ex:
        raise ControlError(400, str(ex), "hang_seconds") from None


def _check_lost_reply(body: dict[str, Any]) -> None:
    """The deprecated ``lost_reply`` field: ``"hang"`` or left out."""
    if _given(body, "lost_reply", "hang") == "drop":
        # Closing the connection at once is a connection error, which clients retry on
        # grounds a timeout does not give: its own fault, so the two are measured apart.
        raise ControlError(
            400,
            'lost_reply "drop" is the fault "reset_after_commit" (the connection closed with '
            'no reply); fault "lost_reply" always holds the reply open until the client times '
            "out (lost_reply is deprecated; leave it out)",
            "lost_reply",
        )
    _choice(body, "lost_reply", LOST_REPLY_MODES, "hang")


def _check_fault_served(body: dict[str, Any]) -> None:
    """Refuse a fault that only twice's own agent loop can run."""
    fault = _given(body, "fault", "none")
    if (
        isinstance(fault, str)
        and fault not in FAULTS
        and fault.rpartition("+")[2] in (CONVERSATION_FAULTS)
    ):
        # A served trial's turns are its client's: twice holds no model endpoint or agent
        # run to ask again or to compact, so the fault would act as its wire part alone.
        raise ControlError(
            400,
            f"fault {_json(fault)} changes the conversation between the agent's turns, which "
            "twice drives only when it runs the agent (twice run --agent-cmd, or --agent); "
            f"a served trial's client drives its own turns; one of: {', '.join(SERVE_FAULTS)}",
            "fault",
        )
    if fault in AGENT_FAULTS_REFUSED:
        # A served trial's agent is the client's own: nothing restarts its run from twice's
        # checkpoints, so the fault would act as "none" while its evidence said "crashed".
        raise ControlError(
            400,
            f"fault {_json(fault)} restarts twice's own agent loop from its checkpoints, which "
            f"a served trial's agent does not have; one of: {', '.join(SERVE_FAULTS)}",
            "fault",
        )
