"""Run a suite through inspect's ``eval_set`` (one process, resumable) and summarise it."""

from __future__ import annotations

import contextlib
import datetime as dt
import gc
import hashlib
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pandas as pd
from inspect_ai import Task, eval_set, task_with
from inspect_ai.log import EvalLog
from inspect_ai.model import Model, get_model
from twice.reports import LogReadError, cells, check_log_dir, trials_frame, write_summary
from twice.tasks import get_task, load_prompt
from twice.tasks.agents import BUILTIN_AGENTS, REACT

from ._suite import Cell, Suite, SuiteError

CREDENTIAL_ARG = re.compile(
    r"(^|_)(api_?key|key|token|secret|password|passwd|credentials?|auth|authorization|headers)"
    r"($|_)|^aws_",
    re.I,
)
"""Model-arg names that carry credentials (``api_key``, ``azure_ad_token``, ``client_secret``,
``default_headers``...): refused, because keys come from the environment. Inspect drops only
``api_key`` and ``aws_*`` from the model args it logs."""

KEY_ENV_HINT = (
    "OPENAI_API_KEY for openai/, ANTHROPIC_API_KEY for anthropic/, "
    "<SERVICE>_API_KEY for openai-api/<service>/"
)


@dataclass
class RunResult:
    """What a suite run produced."""

    log_dir: Path
    logs: list[EvalLog]
    table: pd.DataFrame
    summary_path: Path
    report_path: Path | None
    failed: list[str]
    """Human lines for every eval that errored or trial that crashed."""

    @property
    def ok(self) -> bool:
        """True when every eval ran to completion and no trial crashed."""
        return not self.failed


def eval_options(display: str | None) -> dict[str, Any]:
    """Inspect settings every suite eval runs with (the benchmarks use the same).

    ``log_realtime`` off: inspect's live sample buffer (an SQLite database written on every
    event, for watching unfinished samples in ``inspect view``) costs about a fifth of a
    stub trial; finished samples still reach the log and the viewer. ``score_display`` only
    when something displays it: inspect recomputes every metric as samples finish.
    """
    return {"log_realtime": False, "score_display": display not in (None, "none")}


GC_THRESHOLDS = (50_000, 20, 20)
"""Garbage-collector thresholds for a suite run (Python's defaults are 700, 10, 10)."""


@contextmanager
def gc_for_trials() -> Iterator[None]:
    """Collect garbage less often while trials run, then restore the thresholds.

    A trial allocates thousands of short-lived objects. At Python's default thresholds the
    youngest generation is collected every 700 allocations, so a trial's objects survive into
    the oldest generation and trigger full collections (each a walk over every live object:
    ~0.3 s with inspect loaded). Fewer young collections let them die young: the default
    suite's CPU time drops by a fifth. Memory grows by at most the uncollected young cycles.
    """
    old = gc.get_threshold()
    gc.set_threshold(*GC_THRESHOLDS)
    try:
        yield
    finally:
        gc.set_threshold(*old)


def default_log_dir() -> Path:
    """``logs/run-YYYYmmdd-HHMMSS`` under the current directory."""
    return Path("logs") / dt.datetime.now().strftime("run-%Y%m%d-%H%M%S")


def _providers() -> list[str]:
    """Registered inspect model providers, for error messages (best effort: empty if unknown)."""
    try:  # inspect has no public listing of model APIs; the registry is private
        from inspect_ai._util.registry import registry_find, registry_info

        objs = registry_find(lambda info: info.type == "modelapi")
        return sorted({registry_info(o).name.split("/")[-1] for o in objs})
    except Exception:
        return []


def _plain(text: str) -> str:
    # inspect's provider errors carry rich markup ("[bold]OPENAI_API_KEY[/bold]").
    from rich.text import Text

    with contextlib.suppress(Exception):  # not markup after all: keep the text as it is
        text = Text.from_markup(text).plain
    return " ".join(text.replace("ERROR:", "").split()).rstrip(".")


def check_model_args(model_args: dict[str, Any]) -> None:
    """Refuse model args that carry credentials: API keys come from the environment only.

    Raises:
        SuiteError: naming the argument and the environment variables to use instead.
    """
    for key in model_args:
        if CREDENTIAL_ARG.search(key):
            raise SuiteError(
                f"model arg {key!r} looks like a credential; twice takes API keys from the "
                f"environment only (so they stay out of shell history, logs and reports): set "
                f"{KEY_ENV_HINT}"
            )


def _model(name: str, model_args: dict[str, Any], cache: dict[str, Model]) -> Model:
    if name not in cache:
        try:
            # Not memoized across runs: inspect's cache keys a model by its arguments, not by the
            # environment its provider read (LOCAL_BASE_URL of a local server on a new port).
            cache[name] = get_model(name, memoize=False, **model_args)
        except Exception as ex:  # providers raise many types: missing keys, unknown APIs
            provider = name.split("/", 1)[0]
            known = _providers()
            if known and provider not in known:
                raise SuiteError(
                    f"unknown model provider {provider!r} in {name!r}; expected one of: "
                    f"{', '.join(known)} (e.g. openai/gpt-5-mini, anthropic/claude-sonnet-4-5, "
                    "openai-api/<service>/<model>, ollama/llama3, vllm/<model>, stub/retry)"
                ) from None
            raise SuiteError(
                f"could not load model {name!r}: {_plain(str(ex))}. API keys come from the "
                f"environment ({KEY_ENV_HINT}); other model settings go in -M key=value."
            ) from None
    return cache[name]


def build_tasks(suite: Suite, model_args: dict[str, Any] | None = None) -> list[Task]:
    """One inspect Task per cell, with its model attached.

    ``eval_set`` pairs a task with its finished log by name, task args, model, model args and
    version. The prompt is a task arg by *name or path*, so the task version carries the hash
    of the prompt text: editing a prompt file makes its old logs stale instead of silently
    reusing them on resume.
    """
    check_model_args(model_args or {})
    models: dict[str, Model] = {}
    out = []
    for cell in suite.cells():
        args: dict[str, Any] = {}
        version = f"+prompt.{load_prompt(cell.prompt).sha256[:12]}"
        if cell.agent != REACT:
            # Only for agents under test, so react's task args (and resumable logs) are as
            # before; a user's agent file is hashed so editing it makes its old logs stale.
            args = {"agent": cell.agent, "mocks": suite.mocks or None}
            version += agent_version(cell.agent)
        task = get_task(cell.task)(
            fault=cell.fault, protection=cell.protection, prompt=cell.prompt, **args
        )
        out.append(
            task_with(
                task,
                model=_model(cell.model, model_args or {}, models),
                version=f"{task.version}{version}",
            )
        )
    return out


def agent_version(agent: str) -> str:
    """``+agent.<sha>`` of a user agent's file (empty for built-in agents and modules)."""
    path = Path(agent.rpartition(":")[0])
    if agent in BUILTIN_AGENTS or path.suffix != ".py" or not path.is_file():
        return ""
    return "+agent." + hashlib.sha256(path.read_bytes()).hexdigest()[:12]


def _failures(logs: list[EvalLog], table: pd.DataFrame) -> list[str]:
    lines = []
    for log in logs:
        if log.status != "success":
            message = log.error.message if log.error else log.status
            lines.append(f"eval {log.eval.task} on {log.eval.model} {log.status}: {message}")
    for row in table.itertuples():
        if row.errors:
            lines.append(
                f"{row.errors} trial(s) crashed in {row.model} / {row.agent} / {row.prompt} / "
                f"{row.task} / {row.fault} / {row.protection}"
            )
    return lines


def run_suite(
    suite: Suite,
    log_dir: Path,
    *,
    model_args: dict[str, Any] | None = None,
    max_connections: int | None = None,
    display: str | None = "none",
    retry_attempts: int = 1,
    report: bool = True,
    generate_config: dict[str, Any] | None = None,
) -> RunResult:
    """Run every cell of ``suite`` into ``log_dir`` and write ``summary.json`` (and the report).

    Re-running with the same ``log_dir`` resumes: finished evals are reused, not redone, and
    the finished samples of an interrupted eval are kept. ``generate_config`` holds inspect
    generate settings for every eval (``temperature``, ``seed``, ``max_retries``...).

    Raises:
        SuiteError: for a model that cannot be loaded, credential model args, or a log
            directory holding a log that cannot be read (checked before anything runs).
    """
    tasks = build_tasks(suite, model_args)
    generate = dict(generate_config or {})
    if max_connections is None:  # a --max-connections flag wins over the suite's setting
        max_connections = generate.pop("max_connections", None)
    generate.pop("max_connections", None)
    try:
        check_log_dir(log_dir)
    except LogReadError as ex:
        raise SuiteError(f"cannot resume into {str(log_dir)!r}: {ex}") from None
    log_dir.mkdir(parents=True, exist_ok=True)
    with gc_for_trials():
        _, logs = eval_set(
            tasks,
            log_dir=str(log_dir),
            epochs=suite.epochs,
            limit=suite.limit,
            max_connections=max_connections,
            display=display,  # type: ignore[arg-type]
            retry_attempts=retry_attempts,
            retry_wait=1,
            fail_on_error=False,
            log_dir_allow_dirty=True,
            **eval_options(display),
            **generate,
        )
    with gc_for_trials():
        # The directory, not the logs eval_set returned: one rule for which logs count
        # (reports.read_log_dir), shared with trials_frame, `twice report` and `twice gate`.
        frame = trials_frame(log_dir)
    table = cells(frame)
    run = run_metadata(suite, model_args)
    summary_path = write_summary(table, log_dir / "summary.json", run=run)
    report_path = None
    if report:
        from twice.reports import write_report

        report_path = write_report(frame, log_dir / "report.html", run=run)
    return RunResult(log_dir, logs, table, summary_path, report_path, _failures(logs, table))


def run_metadata(suite: Suite, model_args: dict[str, Any] | None = None) -> dict[str, Any]:
    """What was run, for summary.json and the report: axes, prompt texts and hashes, versions.

    Model args are recorded minus anything credential-like (there should be none: see
    :func:`check_model_args`), and only when they are plain data.
    """
    cells_: list[Cell] = list(suite.cells())
    prompts = {}
    for name in dict.fromkeys(c.prompt for c in cells_):
        p = load_prompt(name)
        prompts[p.name] = {"source": p.source, "sha256": p.sha256, "text": p.text}
    return {
        "models": suite.models(),
        "agents": suite.agents(),
        "mocks": dict(suite.mocks),
        "model_args": {
            k: v
            for k, v in (model_args or {}).items()
            if not CREDENTIAL_ARG.search(k) and isinstance(v, (str, int, float, bool, type(None)))
        },
        "prompts": prompts,
        "tasks": list(dict.fromkeys(c.task for c in cells_)),
        "faults": list(dict.fromkeys(c.fault for c in cells_)),
        "protections": list(dict.fromkeys(c.protection for c in cells_)),
        "epochs": suite.epochs,
        "limit": suite.limit,
        "suite": suite.source,
        "versions": {"twice": version("twice"), "inspect_ai": version("inspect_ai")},
        "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }


def format_table(table: pd.DataFrame) -> str:
    """The per-cell table printed at the end of a run."""
    if table.empty:
        return "(no trials)"

    def pct(x: float) -> str:
        return "  n/a" if pd.isna(x) else f"{x:5.0%}"

    def ci(v: list[float]) -> str:
        lo, hi = v
        return "" if pd.isna(lo) else f"[{lo:.0%}–{hi:.0%}]"

    view = pd.DataFrame(
        {
            "model": table["model"],
            "agent": table["agent"],
            "prompt": table["prompt"],
            "task": table["task"],
            "fault": table["fault"],
            "protection": table["protection"],
            "n": table["trials"],
            "err": table["errors"],
            "complete": table["completion_rate"].map(pct),
            "dup": table["duplication_rate"].map(pct),
            "dup 95% CI": table["duplication_ci"].map(ci),
            "safe": table["safe_success_rate"].map(pct),
            "excess": table["excess_effects_mean"].map(lambda x: "" if pd.isna(x) else f"{x:.2f}"),
            "crashed": table["crashed_rate"].map(pct),
        }
    )
    if (view["agent"] == REACT).all():
        # Only twice's own loop ran: the agent columns would say nothing.
        view = view.drop(columns=["agent", "crashed"])
    return str(view.to_string(index=False))
