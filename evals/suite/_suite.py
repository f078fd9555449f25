"""The suite matrix: models × agents × prompts × tasks × faults × protections, and its cells.

A suite is one or more :class:`Matrix` blocks (from flags, or a suite file read by
``load_suite``); its cells are their union (a cell named by two blocks runs once), planned
once per suite. ``validate`` checks every name before anything runs.
"""

from __future__ import annotations

import inspect
import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from twice.mocks import STUB_MODELS, UsageError, get_fault
from twice.reports import Cell
from twice.tasks import (
    AGENT_FAULTS_REFUSED,
    PROTECTIONS,
    TASKS,
    check_agent_cell,
    get_task,
    load_prompt,
    normal_spec,
    remember_command_secrets,
    scrub,
    secret_values,
    secrets_in,
)
from twice.tasks.agents import REACT, AgentError
from twice.tasks.agents import check_agent as _check_agent_name

from ..local_model import ServerOptions
from ._hang import DEFAULT_HANG_SECONDS, check_hang_seconds

STUB_NAMES = [f"stub/{n}" for n in STUB_MODELS]
DEFAULT_FAULTS = ["none", "lost_reply", "reset_after_commit", "timeout_before_commit"]
"""Faults used when flags name models but no faults: the control, the twin faults, and the
lost reply's connection-error form."""

AXES = ("models", "agents", "prompts", "tasks", "faults", "protections")


class SuiteError(UsageError, ValueError):
    """A suite that cannot run: names the bad value and what would be accepted."""


AGENT_TIMEOUT = 600.0
"""Default seconds an ``--agent-cmd`` command may run in one trial (``--agent-timeout``)."""
DEFAULT_OUTAGE_WINDOW = 300
"""Seconds an endpoint may go without a successful call, every call failing, before it counts
as unreachable (``--outage-window``). Provider overloads (a burst of 529s or 503s) mostly
clear within seconds to a couple of minutes: five minutes rides them out with room, and a run
that has to stop waits at most that long beyond its last success, the same patience
``--timeout`` gives one request by default."""

AGENT_CMD_PREFIX = "cmd:"
"""How the agent axis names an external agent command (``--agent-cmd``)."""


def command_agent_name(command: str) -> str:
    """The agent-axis name of ``--agent-cmd COMMAND``: ``cmd:COMMAND`` (credentials from the
    environment and those written on the command line scrubbed, as everywhere else). A cell
    of it is never a ``react`` cell: its logs are neither reused for twice's own loop nor
    counted as its trials, and a different command is a different agent."""
    remember_command_secrets(command)  # a key on the line itself: scrubbed from here on
    return AGENT_CMD_PREFIX + scrub(command.strip(), secret_values())


@dataclass(frozen=True)
class Matrix:
    """One block of the suite: the full cross product of its five axes."""

    models: tuple[str, ...]
    agents: tuple[str, ...] = (REACT,)
    prompts: tuple[str, ...] = ("baseline",)
    tasks: tuple[str, ...] = tuple(TASKS)
    faults: tuple[str, ...] = tuple(DEFAULT_FAULTS)
    protections: tuple[str, ...] = ("bare",)

    def __post_init__(self) -> None:
        # `./my_agent.py:run` and `my_agent.py:run` are one agent: one cell, one set of logs.
        for axis in ("agents", "tasks"):
            values = getattr(self, axis)
            if isinstance(values, tuple):
                object.__setattr__(self, axis, tuple(normal_spec(v) for v in values))


@dataclass(frozen=True)
class Suite:
    """What ``twice run`` runs."""

    matrices: tuple[Matrix, ...]
    epochs: int = 1
    limit: int | None = None
    source: str = "flags"
    mocks: dict[str, str] = field(default_factory=dict)
    """``--mock SERVICE=URL``: production URL by service name, for agents other than react."""
    local_model: ServerOptions | None = None
    """The ``[local_model]`` server this suite starts for its run, if any."""
    agent_cmd: str | None = None
    """An external agent command run per trial against ``twice serve`` (``--agent-cmd``);
    None: twice's own agent loop."""
    agent_timeout: float = AGENT_TIMEOUT
    """Seconds the agent command may run in one trial before its processes are stopped and
    the trial counts as crashed (``--agent-timeout``)."""
    outage_window: int = DEFAULT_OUTAGE_WINDOW
    """Seconds a model endpoint may go without a success, every call failing, before it counts
    as unreachable and the run ends, resumable (``--outage-window``)."""
    hang_seconds: float = DEFAULT_HANG_SECONDS
    """Seconds the agent command's trials hold a lost reply open before closing the
    connection (``--hang-seconds``): an agent whose own timeout is shorter sees a read
    timeout, and a trial costs that timeout's wall time."""
    max_agent_cmds: int | None = None
    """How many agent commands run at once (``--max-agent-cmds``); None: one per usable CPU,
    as inspect runs its own subprocesses. An agent that mostly waits on a remote model can
    take more."""

    def cells(self) -> tuple[Cell, ...]:
        """Every distinct cell, in suite order, planned once per suite.

        A prompt given twice under different spellings (``p/my.md`` and ``./p/my.md``: the
        same name and text) is one prompt, named by its first spelling: two cells of it would
        run the same trials twice and count them both.
        """
        return self._planned

    @cached_property
    def _planned(self) -> tuple[Cell, ...]:
        # Planning reads every prompt file; a run asks for its cells at every step, and a
        # frozen suite's cells cannot change (``replace`` makes a new suite, planned anew).
        return tuple(self._each_cell())

    def _each_cell(self) -> Iterator[Cell]:
        seen: set[Cell] = set()
        canon = self._prompt_spellings()
        # An agent command is every trial's agent (validate() refuses it with other agents).
        command = None if self.agent_cmd is None else command_agent_name(self.agent_cmd)
        for m in self.matrices:
            for model, agent in itertools.product(m.models, (command,) if command else m.agents):
                for prompt, task in itertools.product((canon[p] for p in m.prompts), m.tasks):
                    for fault, protection in itertools.product(m.faults, m.protections):
                        cell = Cell(
                            model=model,
                            agent=agent,
                            prompt=prompt,
                            task=task,
                            fault=fault,
                            protection=protection,
                        )
                        if cell not in seen:
                            seen.add(cell)
                            yield cell

    def _prompt_spellings(self) -> dict[str, str]:
        first: dict[tuple[str, str], str] = {}
        canon: dict[str, str] = {}
        for spec in dict.fromkeys(p for m in self.matrices for p in m.prompts):
            try:
                p = load_prompt(spec)
            except ValueError:  # refused by validate(); here it stands for itself
                canon[spec] = spec
                continue
            canon[spec] = first.setdefault((p.name, p.sha256), spec)
        return canon

    def models(self) -> list[str]:
        """Distinct models, in order."""
        return list(dict.fromkeys(c.model for c in self.cells()))

    def agents(self) -> list[str]:
        """Distinct agents, in order."""
        return list(dict.fromkeys(c.agent for c in self.cells()))

    def override(self, **axes: Sequence[str]) -> Suite:
        """Replace the named axes in every block (flags given with ``--config``)."""
        given = {k: tuple(v) for k, v in axes.items() if v}
        if not given:
            return self
        return replace(self, matrices=tuple(replace(m, **given) for m in self.matrices))

    def validate(self) -> None:
        """Check every name now, before anything runs.

        Raises:
            SuiteError: naming the bad value and the accepted ones.
        """
        named: dict[str, tuple[str, str]] = {}
        for m in self.matrices:
            for axis in AXES:
                if not getattr(m, axis):
                    raise SuiteError(
                        f"a [[matrix]] block in {self.source} has an empty {axis!r} list"
                    )
            _check_tasks(m.tasks)
            _check_faults(m.faults)
            _check(m.protections, PROTECTIONS, "protection")
            _check_prompts(m.prompts, named)
            _check_models(m.models)
        self._validate_agents()
        self._validate_settings()

    def _validate_settings(self) -> None:
        """Check the run settings: counts, the outage window, the agent command's bounds."""
        if isinstance(self.epochs, bool) or self.epochs < 1:
            raise SuiteError(f"epochs must be a positive integer, got {self.epochs!r}")
        if self.limit is not None and (isinstance(self.limit, bool) or self.limit < 1):
            raise SuiteError(f"limit must be a positive integer, got {self.limit!r}")
        window = self.outage_window
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise SuiteError(
                f"outage_window must be a positive whole number of seconds, got {window!r}"
            )
        if self.agent_cmd is not None and not self.agent_cmd.strip():
            raise SuiteError("agent_cmd is empty; give the command that runs your agent")
        timeout = self.agent_timeout
        if (
            isinstance(timeout, bool)
            or not isinstance(timeout, int | float)
            or not math.isfinite(timeout)
            or timeout <= 0
        ):
            raise SuiteError(f"agent_timeout must be a positive number of seconds, got {timeout!r}")
        try:
            check_hang_seconds(self.hang_seconds)
        except ValueError as ex:
            raise SuiteError(str(ex)) from None
        at_once = self.max_agent_cmds
        if at_once is not None and (
            isinstance(at_once, bool) or not isinstance(at_once, int) or at_once < 1
        ):
            raise SuiteError(f"max_agent_cmds must be a positive whole number, got {at_once!r}")
        if at_once is not None and self.agent_cmd is None:
            raise SuiteError(
                "max_agent_cmds bounds how many --agent-cmd commands run at once; this suite "
                "runs no agent command (give --agent-cmd, or leave --max-agent-cmds out)"
            )
        if self.hang_seconds != DEFAULT_HANG_SECONDS and self.agent_cmd is None:
            raise SuiteError(
                "hang_seconds bounds how long an --agent-cmd agent's trials hold a lost reply "
                "open over a socket; in process a lost reply is a timeout raised at once "
                "(give --agent-cmd, or leave --hang-seconds out)"
            )
        agents = {a for m in self.matrices for a in m.agents}
        if timeout != AGENT_TIMEOUT and self.agent_cmd is None and agents <= {REACT}:
            raise SuiteError(
                "agent_timeout bounds an agent under test (--agent or --agent-cmd); this suite "
                "runs only twice's own loop (react), which --timeout and the message limit bound"
            )

    def _validate_agents(self) -> None:
        """Check each agent once, then every cell an agent other than ``react`` is in."""
        mocks = self.mocks
        if self.agent_cmd is not None:
            others = [a for m in self.matrices for a in m.agents if a != REACT]
            if others:
                raise SuiteError(
                    f"--agent-cmd runs its command as the agent of every trial; it does not "
                    f"combine with --agent {others[0]!r} (run that agent in its own --log-dir)"
                )
            if mocks:
                raise SuiteError(
                    "--mock applies to an in-process agent under test; an --agent-cmd agent "
                    "reaches the services at the TWICE_<SERVICE>_URL twice serve gives it"
                )
            refused = [f for m in self.matrices for f in m.faults if f in AGENT_FAULTS_REFUSED]
            if refused:
                # Found up front, not as every trial's error after the eval had started.
                raise SuiteError(
                    f"fault {refused[0]!r} restarts twice's own agent loop from its "
                    "checkpoints, which an --agent-cmd agent does not have; its other faults "
                    "apply (drop the fault, or run it in a suite of its own)"
                )
            return
        checked: set[str] = set()
        for cell in self.cells():
            try:
                if cell.agent not in checked:
                    try:
                        _check_agent_name(cell.agent)
                    except SystemExit as ex:
                        raise SuiteError(_exited("agent", cell.agent, ex)) from None
                    checked.add(cell.agent)
                if cell.agent != REACT:
                    check_agent_cell(cell.agent, cell.task, cell.fault, cell.protection)
                    if cell.task not in TASKS:
                        _check_own_task_takes_agents(cell.task, cell.agent)
            except AgentError as ex:
                raise SuiteError(f"{self.source}: {ex}") from None
        if mocks and checked <= {REACT}:
            raise SuiteError(
                "--mock applies to an agent under test (--agent path.py:function ...), not to "
                f"twice's own loop {REACT!r}"
            )


def _check_tasks(tasks: Sequence[str]) -> None:
    """Each task a built-in name, or a task of your own (imported here)."""
    for name in tasks:
        try:
            get_task(name)
        except ValueError as ex:
            raise SuiteError(str(ex)) from None
        except SystemExit as ex:
            raise SuiteError(_exited("task", name, ex)) from None


def _check_prompts(prompts: Sequence[str], named: dict[str, tuple[str, str]]) -> None:
    """Each prompt readable, free of credentials, and the only text under its name
    (``named``: name → (digest, source) of the prompts seen so far, in every block)."""
    for prompt in prompts:
        try:
            p = load_prompt(prompt)
        except ValueError as ex:
            raise SuiteError(str(ex)) from None
        leaked = secrets_in(p.text)
        if leaked:
            # It would be sent to every model and kept in every log header.
            raise SuiteError(
                f"prompt {p.source!r} contains the value of ${leaked[0]}; twice never "
                "sends a credential to a model or writes one to a log: take it out of "
                "the prompt"
            )
        # The report and summary.json name a prompt by its file stem: two different
        # texts under one name would be merged into one row.
        sha, source = named.setdefault(p.name, (p.sha256, p.source))
        if sha != p.sha256:
            raise SuiteError(
                f"two different prompts are both named {p.name!r} ({source} and "
                f"{p.source}); a prompt file is named by its stem, so rename one of them"
            )


def _check_models(models: Sequence[str]) -> None:
    """Each model an inspect model string; a stub one of twice's."""
    for model in models:
        provider, _, rest = model.partition("/")
        if not provider or not rest.strip("/"):
            raise SuiteError(
                f"model {model!r} is not an inspect model string; expected "
                "'<provider>/<model>', e.g. openai/gpt-5-mini, "
                "anthropic/claude-sonnet-4-5, "
                f"or one of the stubs: {', '.join(STUB_NAMES)}"
            )
        if model.startswith("stub/") and model not in STUB_NAMES:
            raise SuiteError(
                f"unknown stub model {model!r}; expected one of: {', '.join(STUB_NAMES)}"
            )


def _exited(kind: str, spec: str, ex: SystemExit) -> str:
    """Why a file of the user's that ended the process as it was imported cannot be run: a
    script's ``sys.exit()`` at import would otherwise end ``twice run`` with its code and no
    word (a ``SystemExit`` is no ``Exception``)."""
    where = spec.rpartition(":")[0] or spec
    return (
        f"{kind} file {where!r} (from {spec!r}) called sys.exit({ex.code!r}) as it was "
        f"imported; a {kind} file defines the {kind}, it must not end the process (put script "
        'code under `if __name__ == "__main__":`)'
    )


def _check_own_task_takes_agents(task: str, agent: str) -> None:
    """A task of your own runs an agent other than ``react`` only if it passes ``agent`` and
    ``mocks`` on to ``twice_task`` (the run calls it with both)."""
    try:
        inspect.signature(get_task(task)).bind(
            fault="none", protection="bare", prompt="baseline", agent=agent, mocks=None
        )
    except TypeError:
        raise AgentError(
            f"task {task!r} takes no agent and mocks arguments, so it cannot run agent "
            f"{agent!r}: add agent: str = 'react' and mocks: dict[str, str] | None = None "
            "and pass them to twice_task"
        ) from None


def _check_faults(faults: Sequence[str]) -> None:
    """Wire faults, conversation faults, and the two joined by ``+`` (``get_fault``)."""
    for fault in faults:
        try:
            get_fault(fault)
        except ValueError as ex:
            raise SuiteError(str(ex)) from None


def _check(values: Sequence[str], known: dict[str, Any], what: str) -> None:
    for v in values:
        if v not in known:
            raise SuiteError(f"unknown {what} {v!r}; expected one of: {', '.join(known)}")
