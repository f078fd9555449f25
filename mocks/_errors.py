"""The root of every exception twice raises, and the two kinds the ``twice`` command tells apart.

Each package raises its own classes, all under one root, so a caller can catch everything
twice raises with one ``except`` and the command line maps a class to its exit code in one
place (``evals/cli/_main.py``)::

    TwiceError                      exit 1 unless a subclass says otherwise
    ├── UsageError                  exit 2: bad input (a flag, a file, a log directory)
    │   ├── SuiteError (ValueError)         twice.evals: a suite that cannot be planned
    │   │   ├── CredentialError             a -M model argument that carries a credential
    │   │   └── LogDirLockedError           a log directory another run holds
    │   ├── GateError (ValueError)          twice.evals: a gate file that cannot be read
    │   ├── ServeError                      twice.evals: twice serve cannot start as asked
    │   ├── DamagedLog (ValueError)         twice.evals: a serve request log that cannot be read
    │   ├── ControlError                    twice.evals: a bad request to the serve control API
    │   ├── AgentError (ValueError)         twice.tasks: an agent that cannot be loaded
    │   └── LogReadError                    twice.reports: logs that cannot be read
    │       └── StorageError (OSError)      object storage that cannot be used
    └── RunError                    exit 1: a run that was started and failed
        ├── StubCannotPlay (RuntimeError)   twice.mocks: a stub model with no plan to play
        ├── AgentLimitError (RuntimeError)  twice.tasks: an agent past its step limit
        ├── AgentTimedOut                   twice.tasks: an agent stopped at its time limit
        ├── RunCrashed                      twice.tasks: a simulated crash after a commit
        ├── UnmockedRequestError            twice.assertions: a request no mock answered
        ├── ModelUnreachableError (RuntimeError)  twice.evals: a model endpoint that never answered
        ├── RunOutputError (OSError)        twice.evals: a run's summary or report not written
        └── LocalModelError (RuntimeError)  twice.evals: the local model cannot install or serve

A class keeps the builtin base it had before the hierarchy (``SuiteError`` is still a
``ValueError``), so code that catches the builtin goes on catching it.

The root lives in ``twice.mocks``, the bottom layer, because every package must be able to
subclass it; ``twice.reports``, which otherwise imports nothing of twice, imports these three
names and nothing else from it.
"""

from __future__ import annotations


class TwiceError(Exception):
    """The root of every exception twice raises.

    Attributes:
        exit_code: The exit status of the ``twice`` command that ends with this error.
    """

    exit_code: int = 1


class UsageError(TwiceError):
    """Bad input: a flag, a file or a log directory that cannot be used as given.

    The message names the bad value and what would be accepted. ``twice`` exits 2.
    """

    exit_code = 2


class RunError(TwiceError):
    """A run that was started and failed (a model that cannot be reached, an output that
    cannot be written, an agent that timed out inside a trial). ``twice`` exits 1."""

    exit_code = 1
