"""One exception root, its two kinds, and their exit codes, mapped in one place by the CLI.

Every exception twice raises is a ``TwiceError``: a ``UsageError`` (bad input) ends ``twice``
with exit 2, a ``RunError`` (a run that failed) with exit 1, each after one line
``error: MESSAGE``. click's own usage errors stay click's.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from twice.evals.cli import cli
from twice.mocks import RunError, TwiceError, UsageError

ROOT = Path(__file__).resolve().parents[2]
GATE = ROOT / "evals" / "gate.toml"

# Every module that defines an exception, so that the hierarchy below is complete.
MODULES = (
    "twice.mocks",
    "twice.assertions",
    "twice.assertions.pytest_plugin",
    "twice.tasks",
    "twice.tasks.agents",
    "twice.reports",
    "twice.evals",
    "twice.evals.locks",
    "twice.evals.run",
    "twice.evals.serve",
)

USAGE = {
    "AgentError",
    "ControlError",
    "CredentialError",
    "DamagedLog",
    "FrameworkRowError",
    "GateError",
    "LogDirLockedError",
    "LogReadError",
    "ServeError",
    "StorageError",
    "SuiteError",
}
"""Bad input: a flag, a file, a log directory, a request to the control API."""

RUN = {
    "AgentLimitError",
    "AgentTimedOut",
    "LocalModelError",
    "ModelUnreachableError",
    "RunCrashed",
    "RunOutputError",
    "StubCannotPlay",
    "UnmockedRequestError",
}
"""A run, a trial or an agent that failed once started."""

BUILTIN_BASES = {
    "AgentError": ValueError,
    "AgentLimitError": RuntimeError,
    "DamagedLog": ValueError,
    "GateError": ValueError,
    "LocalModelError": RuntimeError,
    "ModelUnreachableError": RuntimeError,
    "RunOutputError": OSError,
    "StorageError": OSError,
    "StubCannotPlay": RuntimeError,
    "SuiteError": ValueError,
}
"""The builtin each class was before the hierarchy: code catching it still catches them."""


def _all_subclasses(cls: type) -> Iterator[type]:
    for sub in cls.__subclasses__():
        yield sub
        yield from _all_subclasses(sub)


def twice_errors() -> dict[str, type[TwiceError]]:
    """Every exception class of twice's five packages, by name."""
    for module in MODULES:
        importlib.import_module(module)
    found = {
        c.__name__: c
        for c in _all_subclasses(TwiceError)
        if c.__module__.startswith("twice.") and c not in (UsageError, RunError)
    }
    return found


def test_cli_errors_every_exception_has_one_root_and_one_kind() -> None:
    found = twice_errors()
    assert set(found) == USAGE | RUN, "a new exception: put it under UsageError or RunError"
    for name, cls in found.items():
        kind = UsageError if name in USAGE else RunError
        assert issubclass(cls, kind), name
        assert cls.exit_code == (2 if name in USAGE else 1), name
        if name in BUILTIN_BASES:
            assert issubclass(cls, BUILTIN_BASES[name]), name


def test_cli_errors_the_root_is_public_where_users_look() -> None:
    from twice import evals, mocks

    for name in ("TwiceError", "UsageError", "RunError"):
        assert getattr(mocks, name) is getattr(evals, name)
    assert issubclass(UsageError, TwiceError) and issubclass(RunError, TwiceError)
    assert (TwiceError.exit_code, UsageError.exit_code, RunError.exit_code) == (1, 2, 1)


def _instance(cls: type[TwiceError], message: str) -> TwiceError:
    """An exception of ``cls`` whose text is ``message``, whatever its constructor takes."""
    if cls.__name__ == "ControlError":
        return cls(400, message)  # type: ignore[call-arg]
    if cls.__name__ == "RunOutputError":
        return cls(message, summary_written=False)  # type: ignore[call-arg]
    if cls.__name__ == "RunCrashed":  # made from a trial's state by the tool layer
        ex = cls.__new__(cls)
        ex.args = (message,)
        return ex
    return cls(message)


# Raised where ``twice run`` parses its suite, each class must end the command with its kind's
# exit code and one line. Reading logs back is part of a run: there a LogReadError is a run
# that failed (exit 1, "rerun to resume"), as it always was.
RUN_EXITS = sorted(
    [(name, 2) for name in USAGE if name not in {"LogReadError", "StorageError"}]
    + [(name, 1) for name in RUN]
    + [("LogReadError", 1), ("StorageError", 1)]
)


@pytest.mark.parametrize(("name", "code"), RUN_EXITS)
def test_cli_errors_each_type_exits_with_its_code(
    name: str, code: int, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    cls = twice_errors()[name]
    message = f"the {name} message"

    def fail(**kwargs: object) -> None:
        raise _instance(cls, message)

    monkeypatch.setattr("twice.evals.cli._run.suite_from_flags", fail)
    result = CliRunner().invoke(cli, ["run", "--log-dir", str(tmp_path / "logs")])
    assert result.exit_code == code, (result.output, result.exception)
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {message}"), result.stderr
    if name in ("LogReadError", "StorageError"):
        assert lines[0].endswith("then rerun the same command to resume"), lines[0]


def test_cli_errors_hide_a_secret_in_the_message(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    secret = "sk-test-SECRET-in-an-error-0123456789"
    monkeypatch.setenv("OPENAI_API_KEY", secret)

    def fail(**kwargs: object) -> None:
        raise RunError(f"the endpoint said: bad key {secret}")

    monkeypatch.setattr("twice.evals.cli._run.suite_from_flags", fail)
    result = CliRunner().invoke(cli, ["run", "--log-dir", str(tmp_path / "logs")])
    assert result.exit_code == 1 and secret not in result.output
    assert result.stderr.startswith("error: the endpoint said: bad key [redacted]")


def _bad_gate(tmp_path: Path) -> Path:
    path = tmp_path / "bad-gate.toml"
    path.write_text('[[rule]]\nname = "r"\nmetric = "no_such_rate"\nmax = 0.1\n')
    return path


# Real input, one row per kind of refusal the tests of each command cover.
CASES = {
    "suite: unknown fault": (["run", "--fault", "nope"], 2, "error: unknown fault 'nope'"),
    "click: bad --epochs": (["run", "--epochs", "0"], 2, "Error: Invalid value for '--epochs'"),
    "click: --batch alone": (["run", "--batch", "2"], 2, "Error: --batch and --max-trials"),
    "gate file for --until-decided": (["run", "--until-decided", "{bad_gate}"], 2, "error: "),
    "gate file for twice gate": (["gate", "{tmp}", "--config", "{bad_gate}"], 2, "error: "),
    "unreadable LOG_DIR": (
        ["gate", "{tmp}/none", "--config", str(GATE)],
        2,
        "Error: Invalid value for LOG_DIR: log directory",
    ),
    "report of no logs": (
        ["report", "{tmp}/none"],
        2,
        "Error: Invalid value for LOG_DIR: log directory",
    ),
    "serve: bad token": (
        ["serve", "--port", "0", "--db", "{tmp}/s.sqlite", "--token", "two words"],
        2,
        "error: --token (not shown)",
    ),
    "local model not installed": (["local-model", "serve"], 1, "error: the local model is not"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_cli_errors_real_input_exits_as_before(
    case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    args, code, said = CASES[case]
    monkeypatch.setenv("TWICE_LOCAL_MODEL_HOME", str(tmp_path / "no-model"))
    monkeypatch.chdir(tmp_path)  # a default --log-dir, a .env: nothing of the repository's
    given = [a.format(tmp=tmp_path, bad_gate=_bad_gate(tmp_path)) if "{" in a else a for a in args]
    result = CliRunner().invoke(cli, given)
    assert result.exit_code == code, result.output
    assert said in result.stderr, result.stderr
    if said.startswith("error: "):  # twice's own: one line, nothing else
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
