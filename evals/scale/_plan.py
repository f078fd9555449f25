"""The plan a ``--workers`` run gives each of its workers, and what a worker hands back."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

from twice.reports import Location

from ..run import DEFAULT_MAX_RETRIES, DEFAULT_TIMEOUT
from ..suite import Suite


@dataclass(frozen=True)
class WorkerPlan:
    """What every worker of a ``--workers`` run runs: the parsed suite and the run settings.

    A worker receives the plan whole (a fork inherits it; a fresh interpreter unpickles it)
    and runs its shard with :func:`twice.evals.run_suite`: nothing is turned back into a
    command line to be parsed again, so no setting the parent parsed can be lost on the way.

    Attributes:
        suite: The whole suite (each worker runs the cells dealt to its shard).
        log_dir: The run's log directory (each worker writes ``LOG_DIR/shard-i-of-n/``).
        model_args: Parsed ``-M`` model arguments.
        max_connections: Concurrent model connections per worker.
        display: Inspect's progress display in a worker (its stdout is discarded).
        timeout: Seconds one attempt of a model call may take.
        max_retries: Retries of a model call while its endpoint has never answered.
    """

    suite: Suite
    log_dir: Location
    model_args: dict[str, Any] | None = None
    max_connections: int | None = None
    display: str = "none"
    timeout: int = DEFAULT_TIMEOUT
    max_retries: int = DEFAULT_MAX_RETRIES


@dataclass(frozen=True)
class WorkerOutcome:
    """How a worker's run ended, as it says itself (a file beside its records).

    Attributes:
        code: Its exit code (2: the plan was refused, e.g. a model that cannot be loaded).
        errors: One line per thing that went wrong: the refusal's reason, a failed eval,
            an unreachable endpoint.
    """

    code: int
    errors: tuple[str, ...] = field(default=())

    def write(self, path: str) -> None:
        """Write the outcome to ``path`` (atomically: the parent never reads half of it)."""
        with open(f"{path}.tmp", "w", encoding="utf-8") as f:
            json.dump({"code": self.code, "errors": list(self.errors)}, f)
        os.replace(f"{path}.tmp", path)

    @classmethod
    def read(cls, path: str) -> WorkerOutcome | None:
        """The outcome a worker wrote; None when it wrote none (it was killed, or crashed)."""
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
            return cls(int(data["code"]), tuple(str(e) for e in data["errors"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None
