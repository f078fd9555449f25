"""Whole trials through inspect: twice vs a bare inspect trial, a fault vs none, concurrency.

The bare trial is the floor twice stands on: the same dataset inputs and system prompt, the
same turns (the model makes each call of the sample's plan, one per turn, then answers: one
call for most samples, two for the four two-refund samples), trivial tools that return a
string (with the refund task's three signatures, so the model is offered the same schemas),
mockllm with scripted outputs (usage set, so no tokenizer download) and a trivial scorer.
The twice trial is the refund task under a stub model: services, ledger, protections, the
setup solver and the side-effects scorer are what the ratio prices.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from _common import Paired, paired, timed
from inspect_ai import Task, eval
from inspect_ai.dataset import MemoryDataset, Sample
from inspect_ai.log import EvalLog, read_eval_log
from inspect_ai.model import (
    ChatMessage,
    ChatMessageTool,
    GenerateConfig,
    Model,
    ModelOutput,
    ModelUsage,
    get_model,
)
from inspect_ai.scorer import Score, Scorer, Target, mean, scorer
from inspect_ai.solver import TaskState, generate, system_message, use_tools
from inspect_ai.tool import Tool, ToolChoice, ToolInfo, tool
from twice.evals.run import eval_options, gc_for_trials, no_results_table
from twice.reports import read_log_dir
from twice.tasks import load_prompt, load_records, refund
from twice.tasks.refund.refund import DATASET

_USAGE = ModelUsage(input_tokens=10, output_tokens=5, total_tokens=15)
_ARGS = {"order_id": "order_1042", "amount": 4.99, "reason": "arrived cracked"}


def _plans() -> dict[str, list[dict[str, Any]]]:
    """Sample input → the arguments of each ``issue_refund`` call of its plan."""
    out = {}
    for line in DATASET.read_text(encoding="utf-8").splitlines():
        if line.strip():
            record = json.loads(line)
            out[record["input"]] = [step["call"]["args"] for step in record["plan"]]
    return out


_PLANS = _plans()


@tool
def issue_refund() -> Tool:
    """The trivial tool of the bare trial: returns what twice's tool returns, does nothing."""

    async def execute(order_id: str, amount: float, reason: str = "") -> str:
        """Refund money to the customer for an order. This moves real money.

        Args:
            order_id: The order to refund, e.g. "order_1042".
            amount: Amount to refund in US dollars, e.g. 4.99.
            reason: Short reason for the refund, shown to the customer.
        """
        return f"Created refund re_1 of ${amount:.2f} on order {order_id} (status succeeded)."

    return execute


@tool
def find_refunds() -> Tool:
    """A trivial read tool with the signature of twice's (offered, never called)."""

    async def execute(order_id: str) -> str:
        """List the refunds already made on an order. Read-only and safe to call any time.

        Args:
            order_id: The order to look up, e.g. "order_1042".
        """
        return f"No refunds found for order {order_id}."

    return execute


@tool
def get_order() -> Tool:
    """A trivial read tool with the signature of twice's (offered, never called)."""

    async def execute(order_id: str) -> str:
        """Look up an order: customer, amount paid, items, and how much was refunded so far.

        Args:
            order_id: The order to look up, e.g. "order_1042".
        """
        return f"Order {order_id}."

    return execute


def _scripted(
    input: list[ChatMessage], tools: list[ToolInfo], tool_choice: ToolChoice, config: GenerateConfig
) -> ModelOutput:
    """Each call of the sample's plan, then an answer: the turns of a twice trial, no fault."""
    user = next((m.text for m in input if m.role == "user"), "")
    plan = _PLANS.get(user, [_ARGS])
    done = sum(isinstance(m, ChatMessageTool) for m in input)
    if done >= len(plan):
        out = ModelOutput.from_content("mockllm/model", f"Done. {input[-1].text}")
    else:
        out = ModelOutput.for_tool_call(
            "mockllm/model",
            "issue_refund",
            dict(plan[done]),
            tool_call_id=f"call_{done + 1}",
            content="",
        )
    out.usage = _USAGE
    return out


@scorer(metrics=[mean()])
def _done() -> Scorer:
    async def score(state: TaskState, target: Target) -> Score:
        return Score(value=1.0 if state.output.completion.startswith("Done") else 0.0)

    return score


def bare_task() -> Task:
    """The bare inspect trial: refund's inputs, prompt and tool signatures; no twice code."""
    samples = [Sample(id=r.id, input=r.input) for r in load_records(DATASET)]
    return Task(
        name="bare",
        dataset=MemoryDataset(samples, name="bare"),
        solver=[
            system_message(load_prompt("baseline").text),
            use_tools(issue_refund(), find_refunds(), get_order()),
            generate(),
        ],
        scorer=_done(),
        message_limit=30,
    )


def bare_model() -> Model:
    """mockllm with the scripted policy above."""
    return get_model("mockllm/model", custom_outputs=_scripted)


@contextmanager
def scratch_dir(root: Path, name: str) -> Iterator[Path]:
    """A fresh directory under ``root`` for logs, removed afterwards."""
    root.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=root))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _runner(
    task: Callable[[], Task], model: Model, epochs: int, log_dir: Path, **extra: Any
) -> Callable[[], EvalLog]:
    options = {**eval_options("none"), **extra}

    def run() -> EvalLog:
        def go() -> EvalLog:
            log = eval(
                task(),
                model=model,
                epochs=epochs,
                log_dir=str(log_dir),
                display="none",
                **options,
            )[0]
            if log.status != "success":
                raise RuntimeError(
                    f"benchmark eval {log.eval.task} ended {log.status}: {log.error}"
                )
            return log

        return go()

    return run


def overhead(work: Path, epochs: int, reps: int) -> tuple[float, Paired]:
    """A twice refund trial (stub/retry, fault none) vs the bare trial, per eval of equal size.

    Both run under the garbage-collector thresholds ``twice run`` sets (a process setting any
    inspect user could make) and without the results table inspect lays out at the end of an
    eval on a quiet console (``twice run`` skips it; it is larger for twice's seven metrics),
    so the ratio prices twice's work per trial, not those settings.
    """
    with scratch_dir(work, "overhead") as logs, gc_for_trials(), no_results_table("none"):
        base, subject = overhead_runners(epochs, logs)
        result = paired(base, subject, reps)
    return result.ratio(), result


def overhead_runners(
    epochs: int, log_dir: Path, **extra: Any
) -> tuple[Callable[[], EvalLog], Callable[[], EvalLog]]:
    """The two evals ``overhead_ratio`` compares: the bare trial's, then twice's refund trial
    (``stub/retry``, fault ``none``, protection ``bare``). ``extra``: more eval options."""
    base = _runner(bare_task, bare_model(), epochs, log_dir, **extra)
    subject = _runner(
        lambda: refund(fault="none", protection="bare"),
        get_model("stub/retry"),
        epochs,
        log_dir,
        **extra,
    )
    return base, subject


def fault_cost(work: Path, epochs: int, reps: int) -> tuple[float, Paired]:
    """The refund task under ``lost_reply`` vs ``none``, same model.

    stub/no-retry makes the same turns under both (one call, then an answer), so the ratio
    prices the fault itself; a retrying model does more turns under a fault by design.
    """
    with scratch_dir(work, "fault") as logs, gc_for_trials(), no_results_table("none"):
        none, lost = fault_runners(epochs, logs)
        result = paired(none, lost, reps)
    return result.ratio(), result


def fault_runners(
    epochs: int, log_dir: Path
) -> tuple[Callable[[], EvalLog], Callable[[], EvalLog]]:
    """The two evals ``fault_ratio`` compares: the refund task under ``none``, then under
    ``lost_reply``, both with ``stub/no-retry``."""
    model = get_model("stub/no-retry")
    none = _runner(lambda: refund(fault="none"), model, epochs, log_dir)
    lost = _runner(lambda: refund(fault="lost_reply"), model, epochs, log_dir)
    return none, lost


def _sleepy(delay: float) -> Callable[..., Awaitable[ModelOutput]]:
    async def policy(
        input: list[ChatMessage],
        tools: list[ToolInfo],
        tool_choice: ToolChoice,
        config: GenerateConfig,
    ) -> ModelOutput:
        await asyncio.sleep(delay)
        return _scripted(input, tools, tool_choice, config)

    return policy


def _throughput(
    run: Callable[[], EvalLog], connections: int, turns: int, delay: float
) -> dict[str, float]:
    sample, log = timed(run)
    trials = log.results.completed_samples if log.results else 0
    achieved = trials / sample.wall
    logged, _ = logged_run([log.location])
    ideal = connections / (turns * delay)
    # One Python thread finishes at most 1 / (CPU seconds per trial) trials a second.
    cpu_per_trial = sample.cpu / trials
    return {
        "trials": trials,
        "wall_seconds": sample.wall,
        "achieved_per_second": achieved,
        # the clock concurrency_workers reads from its logs, for like-for-like ratios
        "logged_seconds": logged,
        "logged_per_second": trials / logged,
        "ideal_per_second": ideal,
        "efficiency": achieved / ideal,
        "cpu_ms_per_trial": cpu_per_trial * 1000,
        "cpu_bound_ceiling": min(1.0, (1 / cpu_per_trial) / ideal),
        # The per-turn latency above which one process keeps 90% of the connections busy.
        "break_even_delay": connections * cpu_per_trial / (turns * 0.9),
    }


def concurrency(
    work: Path, epochs: int, connections: int, delay: float
) -> tuple[float, dict[str, float], dict[str, float]]:
    """Achieved / ideal trials per second with a model that waits ``delay`` per turn.

    Ideal: every connection busy all the time, ``connections / (turns × delay)`` trials per
    second; stub/retry under no fault makes 2 turns per trial. The bare trial with a
    mockllm that waits as long is measured the same way, for the floor.
    """
    turns = 2
    with scratch_dir(work, "concurrency") as logs, gc_for_trials():
        runs = {
            name: {
                n: _runner(task, model, n, logs, max_connections=connections) for n in (1, epochs)
            }
            for name, task, model in (
                ("twice", lambda: refund(fault="none"), get_model("stub/retry", delay=delay)),
                (
                    "bare",
                    bare_task,
                    get_model("mockllm/model", custom_outputs=_sleepy(delay)),
                ),
            )
        }
        # Warm-up: the first eval of a process imports what inspect loads lazily for its
        # first sample (the anthropic SDK, acp, ...: 2.7 s here), whichever side runs first.
        for run in runs.values():
            run[1]()
        twice, bare = (
            _throughput(runs[name][epochs], connections, turns, delay) for name in ("twice", "bare")
        )
    return twice["efficiency"], twice, bare


def concurrency_workers(
    work: Path, epochs: int, connections: int, delay: float, workers: int = 2
) -> dict[str, float]:
    """Trials per second of ``twice run --workers N`` with the same total connections.

    Two cells (the refund task under two prompts, which stub/retry treats alike) so that
    there are shards to deal, ``connections / N`` connections per worker, half the epochs
    each: the same trials and connections as the one-process run. The clock runs from the
    first eval's start to the last one's end, as in the logs (so interpreter start-up is
    outside it, as it is for an in-process ``eval``).
    """
    per_cell = max(1, epochs // 2)
    with scratch_dir(work, "concurrency-workers") as logs:
        cmd = [
            sys.executable, "-m", "twice.evals.cli", "run", "--model", "stub/retry",
            "-M", f"delay={delay}", "--task", "refund", "--fault", "none",
            "--prompt", "baseline", "--prompt", "cautious", "--epochs", str(per_cell),
            "--max-connections", str(max(1, connections // workers)),
            "--workers", str(workers), "--no-report", "--display", "none",
            "--log-dir", str(logs),
        ]  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"`{' '.join(cmd)}` exited {done.returncode}:\n{done.stderr}")
        wall, trials = logged_run([str(entry.path) for entry in read_log_dir(logs).current])
    ideal = connections / (2 * delay)
    return {
        "trials": trials,
        "wall_seconds": wall,
        "achieved_per_second": trials / wall,
        "logged_per_second": trials / wall,
        "ideal_per_second": ideal,
        "efficiency": trials / wall / ideal,
    }


def logged_run(locations: list[str]) -> tuple[float, int]:
    """Seconds from the first trial's start to the last write of the last log, and the trials
    completed, from the logs (each read once).

    Not the eval's own ``started_at``/``completed_at``: inspect stamps those in whole seconds,
    so a 5.4 s run of workers read as 5 or 6 s (±20% on this figure). Samples carry
    microseconds, and a log's modification time is its last write (the eval's end).
    """
    paths = [unquote(urlparse(loc).path) if loc.startswith("file:") else loc for loc in locations]
    starts = []
    trials = 0
    for path in paths:
        log = read_eval_log(path)
        starts += [_when(s.started_at) for s in log.samples or [] if s.started_at]
        trials += log.results.completed_samples if log.results else 0
    return max(os.path.getmtime(p) for p in paths) - min(starts), trials


def _when(stamp: str) -> float:
    return dt.datetime.fromisoformat(stamp).timestamp()
