"""Synthetic twice logs: many trials with known true rates, written with inspect's log API.

For report tests that need logs with known rates without running thousands of trials. The
logs have the shape twice's tasks write: the ``twice`` eval metadata, the ledger in the sample
store, and a short transcript; the ``side_effects`` score is computed from that ledger by
twice's own scoring code (``assertions.trial_metrics``), so the logs can never drift from what
the scorer writes. They hold no events, so they are smaller than real logs.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import itertools
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inspect_ai.log import (
    EvalConfig,
    EvalDataset,
    EvalLog,
    EvalResults,
    EvalSample,
    EvalSpec,
    EvalStats,
    write_eval_log,
)
from inspect_ai.model import (
    ChatMessageAssistant,
    ChatMessageSystem,
    ChatMessageTool,
    ChatMessageUser,
    ModelOutput,
    ModelUsage,
)
from inspect_ai.scorer import Score
from inspect_ai.tool import ToolCall, ToolCallError
from twice.assertions import Intent, trial_metrics
from twice.mocks import LEDGER_STORE_KEY, Attempt, Effect, Ledger

INTENT = Intent("payments.refund.create", {"order_id": "order_1042"})
_TIMEOUT = (
    "Timed out waiting for the payments API after 1 attempt; the refund may or may not have "
    "been made. The outcome is unknown."
)


@dataclass(frozen=True)
class SyntheticCell:
    """One cell of a synthetic run and the true probabilities its trials were drawn from."""

    model: str
    prompt: str
    task: str
    fault: str
    protection: str
    p_duplicate: float
    """Chance a trial commits a second refund (a retry after a lost reply)."""
    p_complete: float
    """Chance a trial that did not duplicate commits its refund at all."""
    p_transport: float
    """Chance the duplicating retry came from the tool layer rather than the model."""


@dataclass
class SyntheticRun:
    """What :func:`write_synthetic_logs` wrote."""

    log_dir: Path
    paths: list[Path]
    cells: list[SyntheticCell] = field(default_factory=list)
    trials: int = 0


def _rate(*parts: str, lo: float, hi: float) -> float:
    digest = hashlib.sha256(":".join(parts).encode()).digest()
    return lo + (hi - lo) * int.from_bytes(digest[:4], "big") / 2**32


def _cells(
    models: Sequence[str],
    prompts: Sequence[str],
    tasks: Sequence[str],
    faults: Sequence[str],
    protections: Sequence[str],
) -> list[SyntheticCell]:
    out = []
    for model, prompt, task, fault, protection in itertools.product(
        models, prompts, tasks, faults, protections
    ):
        risky = fault in ("lost_reply", "error_after_commit")
        out.append(
            SyntheticCell(
                model=model,
                prompt=prompt,
                task=task,
                fault=fault,
                protection=protection,
                p_duplicate=_rate(model, prompt, protection, "dup", lo=0.02, hi=0.7)
                if risky
                else 0.0,
                p_complete=_rate(model, prompt, fault, "done", lo=0.5, hi=1.0),
                p_transport=0.0 if protection == "bare" else 0.7,
            )
        )
    return out


def _attempt(n: int, source: str, outcome: str, effects: list[str], fault: str | None) -> Attempt:
    return Attempt(
        n=n,
        service="payments",
        method="POST",
        path="/v1/refunds",
        route="payments.refund.create",
        mutating=True,
        key=None,
        params={"order_id": "order_1042", "amount": 499, "reason": "arrived cracked"},
        source=source,
        call=1 if source in ("initial", "transport") else 2,
        status=200 if outcome != "fail" else 503,
        delivered=outcome == "ok",
        outcome=outcome,  # type: ignore[arg-type]
        fault=fault,
        effect_ids=effects,
        backoff=0.5 if source == "transport" else 0.0,
    )


LedgerEdit = Callable[[Ledger], None]
"""Rewrites a synthetic trial's ledger in place before it is scored (for targeted tests)."""


def _trial(
    cell: SyntheticCell,
    sample_id: str,
    epoch: int,
    rng: random.Random,
    edit: LedgerEdit | None = None,
) -> EvalSample:
    dup = rng.random() < cell.p_duplicate
    done = dup or rng.random() < cell.p_complete
    retry_source = "transport" if rng.random() < cell.p_transport else "model"
    fault = cell.fault if cell.fault != "none" else None
    ledger = Ledger()
    attempts, effects, observations = ledger.attempts, ledger.effects, ledger.observations
    messages: list[Any] = [
        ChatMessageSystem(content=f"You are a support agent ({cell.prompt})."),
        ChatMessageUser(content="Refund $4.99 on order order_1042 (mug arrived cracked)."),
    ]
    call = {"order_id": "order_1042", "amount": 4.99, "reason": "arrived cracked"}

    def commit(n: int) -> str:
        eid = f"re_{len(effects) + 1}"
        fields = {"order_id": "order_1042", "amount": 499}
        effects.append(Effect(eid, "payments.refund.create", n, fields))
        return eid

    messages.append(
        ChatMessageAssistant(content="", tool_calls=[ToolCall("c1", "issue_refund", call)])
    )
    if dup:
        attempts.append(_attempt(1, "initial", "unknown", [commit(1)], fault))
        retry_id = commit(2)
        attempts.append(_attempt(2, retry_source, "ok", [retry_id], None))
        text = f"Created refund {retry_id} of $4.99 on order order_1042."
        if retry_source == "model":
            messages.append(
                ChatMessageTool(
                    content="",
                    tool_call_id="c1",
                    function="issue_refund",
                    error=ToolCallError("unknown", _TIMEOUT),
                )
            )
            observations.append(_TIMEOUT)
            messages.append(
                ChatMessageAssistant(content="", tool_calls=[ToolCall("c2", "issue_refund", call)])
            )
            messages.append(
                ChatMessageTool(content=text, tool_call_id="c2", function="issue_refund")
            )
        else:
            messages.append(
                ChatMessageTool(content=text, tool_call_id="c1", function="issue_refund")
            )
        observations.append(text)
    elif done:
        eid = commit(1)
        attempts.append(_attempt(1, "initial", "ok", [eid], None))
        text = f"Created refund {eid} of $4.99 on order order_1042."
        messages.append(ChatMessageTool(content=text, tool_call_id="c1", function="issue_refund"))
        observations.append(text)
    else:
        attempts.append(_attempt(1, "initial", "fail", [], fault))
        messages.append(
            ChatMessageTool(
                content="",
                tool_call_id="c1",
                function="issue_refund",
                error=ToolCallError("unknown", "HTTP 503. No refund was made."),
            )
        )
        observations.append("HTTP 503. No refund was made.")
    answer = "Done." if done else "I could not complete the refund."
    messages.append(ChatMessageAssistant(content=answer))

    if edit is not None:
        edit(ledger)
    metrics = trial_metrics(ledger, [INTENT])
    score = Score(
        value=metrics.values(),
        answer=answer,
        explanation=metrics.explanation(),
        metadata=metrics.evidence(),
    )
    tokens = 200 + 60 * len(messages)
    return EvalSample(
        id=sample_id,
        epoch=epoch,
        input=messages[1].text,
        target="",
        messages=messages,
        output=ModelOutput.from_content(cell.model, answer),
        scores={"side_effects": score},
        store={LEDGER_STORE_KEY: ledger.to_dict()},
        model_usage={
            cell.model: ModelUsage(input_tokens=tokens - 40, output_tokens=40, total_tokens=tokens)
        },
        total_time=round(rng.uniform(0.5, 3.0), 3),
        working_time=round(rng.uniform(0.4, 2.5), 3),
    )


def write_synthetic_logs(
    log_dir: str | Path,
    trials: int = 10_000,
    *,
    models: Sequence[str] = ("synth/careful", "synth/eager", "synth/sloppy", "synth/steady"),
    prompts: Sequence[str] = ("baseline", "cautious"),
    tasks: Sequence[str] = ("refund",),
    faults: Sequence[str] = ("none", "lost_reply", "timeout_before_commit"),
    protections: Sequence[str] = ("bare", "retry-stepkey"),
    epochs: int = 1,
    seed: int = 0,
    edit: LedgerEdit | None = None,
) -> SyntheticRun:
    """Write one ``.eval`` log per cell, ``trials`` trials in all, drawn from known rates.

    Args:
        log_dir: Directory to write into (created if missing).
        trials: Total trials, split as evenly as possible over the cells (at least one each).
        models, prompts, tasks, faults, protections: The axes of the synthetic suite.
        epochs: Epochs per sample (samples per cell = trials per cell / epochs, rounded up).
        seed: Seed of the draws, so a run repeats exactly.
        edit: Rewrites each trial's ledger before twice's scorer scores it.

    Returns:
        The paths written and each cell's true probabilities.
    """
    root = Path(log_dir)
    root.mkdir(parents=True, exist_ok=True)
    cells = _cells(models, prompts, tasks, faults, protections)
    rng = random.Random(seed)
    per_cell, extra = divmod(max(trials, len(cells)), len(cells))
    created = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    paths: list[Path] = []
    total = 0
    for i, cell in enumerate(cells):
        n = per_cell + (1 if i < extra else 0)
        n_samples = -(-n // epochs)
        samples = []
        for k in range(n):
            sample_id = f"{cell.task}-{k % n_samples + 1:04d}"
            samples.append(_trial(cell, sample_id, k // n_samples + 1, rng, edit))
        total += len(samples)
        prompt_text = f"You are a support agent ({cell.prompt})."
        spec = EvalSpec(
            created=(created + dt.timedelta(seconds=i)).isoformat(),
            task=cell.task,
            task_id=f"synth{i:05d}",
            eval_id=f"synth-eval-{i:05d}",
            run_id="synth-run",
            dataset=EvalDataset(
                name=cell.task,
                samples=n_samples,
                sample_ids=[f"{cell.task}-{k + 1:04d}" for k in range(n_samples)],
            ),
            model=cell.model,
            config=EvalConfig(epochs=epochs),
            task_args={"fault": cell.fault, "protection": cell.protection, "prompt": cell.prompt},
            metadata={
                "twice": {
                    "task": cell.task,
                    "fault": cell.fault,
                    "protection": cell.protection,
                    "prompt": cell.prompt,
                    "prompt_source": "builtin",
                    "prompt_sha256": hashlib.sha256(prompt_text.encode()).hexdigest(),
                    "prompt_text": prompt_text,
                }
            },
        )
        log = EvalLog(
            eval=spec,
            status="success",
            results=EvalResults(total_samples=n, completed_samples=n),
            stats=EvalStats(),
            samples=samples,
        )
        path = root / f"{created:%Y-%m-%dT%H-%M-%S}-00-00_{cell.task}_synth{i:05d}.eval"
        write_eval_log(log, str(path))
        paths.append(path)
    return SyntheticRun(log_dir=root, paths=paths, cells=cells, trials=total)
