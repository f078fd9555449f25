"""The task catalogue end to end: the stub controls produce each task's documented results.

Every eval runs in-process on stub models (offline, deterministic). Each task's README holds
its reference-results table between ``<!-- reference-results -->`` markers; the test reruns
the table's cells and compares, so the documented numbers are the measured ones. Separate
tests state what the tables must show (keys help where the service has them, lookups help
everywhere, a naturally idempotent action never duplicates), so a wrong table cannot pass by
being pasted into the README.
"""

from __future__ import annotations

import functools
import importlib
import json
import re
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from batch_eval import batch_eval
from click.testing import CliRunner
from inspect_ai import Task
from inspect_ai.model import ChatMessageAssistant, ModelOutput, ModelUsage, get_model
from inspect_ai.tool import ToolCall, ToolDef
from twice.evals.cli import cli
from twice.mocks import LEDGER_STORE_KEY, Attempt, Ledger, Services
from twice.tasks import TASKS, TrialContext, get_protection, load_dataset, load_records
from twice.tasks._trial import twice_task
from twice.tasks.archive_record import archive_end_state, archive_loops
from twice.tasks.place_order import place_order_tools
from twice.tasks.place_order.place_order import DATASET as PLACE_ORDER_DATASET
from twice.tasks.place_order.place_order import _services as place_order_services

TASKS_DIR = Path(__file__).resolve().parents[2] / "tasks"
CATALOGUE = ("send_email", "create_ticket", "place_order", "archive_record")
STUBS = ("retry", "no-retry", "verify", "drift", "parallel")
TWINS = ("lost_reply", "timeout_before_commit")
SEED_PROTECTIONS = ("retry-nokey", "retry-randomkey", "retry-stepkey", "lookup")
CONTROLS = ("retry", "no-retry", "verify")
LIMIT = 2
"""Samples per cell. The single-intent samples of a task all behave alike under a stub (checked
once over whole datasets when the tables were made); two per cell keep the suite quick."""

MUTATING_TOOLS = {
    "refund": ("issue_refund", "keyed"),
    "send_email": ("send_email", "unsafe"),
    "create_ticket": ("create_ticket", "keyed"),
    "place_order": ("place_order", "keyed"),
    "archive_record": ("archive_record", "safe"),
}
"""Each task's mutating tool and its declared idempotency class."""

# The logs of these in-process evals are only read back from memory; one temporary directory
# for the whole module, removed when the interpreter exits.
_LOGS = tempfile.TemporaryDirectory(prefix="twice-catalogue-")

Cell = tuple[str, str, str]
"""(model, fault, protection)."""


@dataclass(frozen=True)
class Trial:
    """What one finished sample left behind."""

    sample: str
    effects: int
    metrics: dict[str, float]
    observations: list[str]
    explanation: str
    ledger: Ledger


def _run(tasks: list[Task], model: Any, **kwargs: Any) -> list[list[Trial]]:
    """Run tasks on one model; the trials of each task, in task order."""
    logs = batch_eval(tasks, model=model, log_dir=_LOGS.name, **kwargs)
    out = []
    for log in logs:
        assert log.status == "success", f"{log.eval.task}: {log.status} {log.error}"
        assert log.samples is not None
        trials = []
        for s in log.samples:
            assert s.error is None, f"{log.eval.task} {s.id}: {s.error.message}"
            data = s.store[LEDGER_STORE_KEY]
            score = s.scores["side_effects"] if s.scores else None
            assert score is not None
            trials.append(
                Trial(
                    sample=str(s.id),
                    effects=len(data["effects"]),
                    metrics=dict(score.value),  # type: ignore[arg-type]
                    observations=list(data["observations"]),
                    explanation=score.explanation or "",
                    ledger=Ledger.from_dict(data),
                )
            )
        out.append(trials)
    return out


def reference_cells() -> list[Cell]:
    """The cells of every task's reference table (the table groups them by model)."""
    cells = [(f"stub/{s}", f, p) for p in ("bare", "intent-key") for s in STUBS for f in TWINS]
    cells += [("stub/no-retry", "lost_reply", p) for p in SEED_PROTECTIONS]
    cells += [(f"stub/{s}", "reset_after_commit", "bare") for s in CONTROLS]
    return cells


@functools.cache
def reference_trials(task: str) -> dict[Cell, list[Trial]]:
    """Run a task's reference cells: one inspect eval per stub model."""
    by_model: dict[str, list[tuple[str, str]]] = {}
    for model, fault, protection in reference_cells():
        by_model.setdefault(model, []).append((fault, protection))
    out: dict[Cell, list[Trial]] = {}
    for model, cells in by_model.items():
        tasks = [TASKS[task](fault=f, protection=p) for f, p in cells]
        for (fault, protection), trials in zip(cells, _run(tasks, model, limit=LIMIT), strict=True):
            out[(model, fault, protection)] = trials
    return out


def _rate(trials: list[Trial], metric: str) -> float:
    return sum(t.metrics[metric] for t in trials) / len(trials)


def _effects(trials: list[Trial]) -> float:
    return sum(t.effects for t in trials) / len(trials)


def format_reference_table(trials: dict[Cell, list[Trial]]) -> str:
    """The markdown table a task README documents."""
    metrics = ("completed", "duplicated", "safe_success", "unseen_effects")
    lines = [
        "| model | fault | protection | effects | " + " | ".join(metrics) + " |",
        "| --- | --- | --- | ---: | " + " | ".join("---:" for _ in metrics) + " |",
    ]
    for (model, fault, protection), ts in trials.items():
        values = [f"{_rate(ts, m):.0%}" for m in metrics[:3]] + [f"{_rate(ts, metrics[3]):g}"]
        lines.append(
            f"| {model} | {fault} | {protection} | {_effects(ts):g} | " + " | ".join(values) + " |"
        )
    return "\n".join(lines)


def readme_table(task: str) -> str:
    """The reference-results block of a task's README."""
    text = (TASKS_DIR / task / "README.md").read_text(encoding="utf-8")
    m = re.search(r"<!-- reference-results -->\n(.*?)\n<!-- /reference-results -->", text, re.S)
    assert m, f"tasks/{task}/README.md has no <!-- reference-results --> block"
    return m.group(1).strip()


def _cell(task: str, model: str, fault: str, protection: str) -> list[Trial]:
    return reference_trials(task)[(f"stub/{model}", fault, protection)]


# -- the documented tables ------------------------------------------------------------------


@pytest.mark.parametrize("task", CATALOGUE)
def test_catalogue_reference_results_match_readme(task: str) -> None:
    measured = format_reference_table(reference_trials(task))
    assert readme_table(task) == measured, (
        f"tasks/{task}/README.md documents other reference results than the stubs produce; "
        f"measured:\n{measured}"
    )


# -- what the tables must show --------------------------------------------------------------


@pytest.mark.parametrize("task", CATALOGUE)
def test_catalogue_twin_faults_tell_the_controls_apart(task: str) -> None:
    # lost_reply: never retrying completes but the agent never learns what it did.
    no_retry = _cell(task, "no-retry", "lost_reply", "bare")
    assert _rate(no_retry, "completed") == 1 and _rate(no_retry, "unseen_effects") == 1
    # timeout_before_commit: never retrying does not complete.
    assert _rate(_cell(task, "no-retry", "timeout_before_commit", "bare"), "completed") == 0
    # Verifying before retrying wins both twins.
    for fault in TWINS:
        assert _rate(_cell(task, "verify", fault, "bare"), "safe_success") == 1, fault


@pytest.mark.parametrize("task", CATALOGUE)
def test_catalogue_a_reset_after_the_commit_scores_as_a_lost_reply(task: str) -> None:
    # Both leave the outcome unknown: the controls act alike, and so do their results.
    for stub in CONTROLS:
        reset = _cell(task, stub, "reset_after_commit", "bare")
        lost = _cell(task, stub, "lost_reply", "bare")
        assert [t.metrics for t in reset] == [t.metrics for t in lost], stub
        assert [t.effects for t in reset] == [t.effects for t in lost], stub


@pytest.mark.parametrize("task", ["create_ticket", "place_order"])
def test_catalogue_keys_stop_model_retries_where_the_service_has_them(task: str) -> None:
    assert _rate(_cell(task, "retry", "lost_reply", "bare"), "duplicated") == 1
    keyed = _cell(task, "retry", "lost_reply", "intent-key")
    assert _rate(keyed, "safe_success") == 1 and _effects(keyed) == 1
    assert _effects(_cell(task, "no-retry", "lost_reply", "retry-stepkey")) == 1
    assert _effects(_cell(task, "no-retry", "lost_reply", "retry-randomkey")) == 2


def test_catalogue_send_email_keys_do_not_help_but_lookup_does() -> None:
    for protection in ("bare", "intent-key"):
        for stub in ("retry", "drift", "parallel"):
            assert _effects(_cell("send_email", stub, "lost_reply", protection)) == 2, stub
    for protection in ("retry-nokey", "retry-randomkey", "retry-stepkey"):
        assert _effects(_cell("send_email", "no-retry", "lost_reply", protection)) == 2
    lookup = _cell("send_email", "no-retry", "lost_reply", "lookup")
    assert _rate(lookup, "safe_success") == 1 and _rate(lookup, "unseen_effects") == 0


def test_catalogue_archive_record_never_duplicates() -> None:
    trials = reference_trials("archive_record")
    assert all(
        t.effects <= 1 and t.metrics["duplicated"] == 0 for ts in trials.values() for t in ts
    )
    # Retrying a safe action is the right policy: it wins both twins with no key at all.
    for fault in TWINS:
        assert _rate(_cell("archive_record", "retry", fault, "bare"), "safe_success") == 1
    # A key on a safe action turns a reworded retry into a 422: the agent reports failure
    # although the record is archived (it never saw arc_1).
    drift = _cell("archive_record", "drift", "lost_reply", "intent-key")
    assert _rate(drift, "completed") == 1 and _rate(drift, "unseen_effects") == 1


# -- parallel duplicates --------------------------------------------------------------------

PARALLEL_EFFECTS = {
    # task: (effects with an intent key, effects without a key)
    "refund": (1, 2),
    "send_email": (2, 2),  # no key support: the key changes nothing
    "create_ticket": (1, 2),
    "place_order": (1, 2),
    "archive_record": (1, 1),  # naturally idempotent: one archive either way
}


@pytest.mark.parametrize("task", list(PARALLEL_EFFECTS))
def test_catalogue_parallel_one_effect_with_key_two_without(task: str) -> None:
    keyed, bare = _run(
        [TASKS[task](fault="none", protection=p) for p in ("intent-key", "bare")],
        "stub/parallel",
        limit=LIMIT,
    )
    with_key, without = PARALLEL_EFFECTS[task]
    assert [t.effects for t in keyed] == [with_key] * LIMIT
    assert [t.effects for t in bare] == [without] * LIMIT
    if with_key == 1:
        # Both concurrent calls were told about the one effect (the in-flight 409 was polled).
        for t in keyed:
            effect_id = t.ledger.effects[0].id
            assert sum(effect_id in text for text in t.observations) == 2, t.observations


# -- multi-intent samples -------------------------------------------------------------------


def _multi_ids(task: str) -> list[str]:
    records = load_records(TASKS_DIR / task / "dataset.jsonl")
    return [r.id for r in records if len(r.intents) > 1]


@pytest.mark.parametrize("task", ["refund", "place_order"])
def test_catalogue_multi_intent_samples_exist(task: str) -> None:
    ids = _multi_ids(task)
    assert len(ids) >= 4
    for record in load_records(TASKS_DIR / task / "dataset.jsonl"):
        if record.id in ids:
            identities = [json.dumps(i.identity, sort_keys=True) for i in record.intents]
            assert len(set(identities)) == len(identities), record.id
            assert len(record.plan) == len(record.intents), record.id


@pytest.mark.parametrize("task", ["refund", "place_order"])
def test_catalogue_multi_intent_retry_duplicates_only_the_faulted_intent(task: str) -> None:
    ids = _multi_ids(task)[:2]
    bare, keyed = _run(
        [TASKS[task](fault="lost_reply", protection=p) for p in ("bare", "intent-key")],
        "stub/retry",
        sample_id=ids,
    )
    for t in bare:
        assert t.metrics["duplicated"] == 1 and t.metrics["completed"] == 1
        assert t.effects == 3  # two for the intent whose reply was lost, one for the other
    for t in keyed:
        assert t.metrics["safe_success"] == 1 and t.effects == 2


def _place_order_task(identity_fields: tuple[str, ...], fault: str, protection: str) -> Task:
    return twice_task(
        name="place_order",
        dataset=load_dataset(PLACE_ORDER_DATASET, "place_order"),
        services=place_order_services,
        tools=functools.partial(place_order_tools, identity_fields=identity_fields),
        fault=fault,
        protection=protection,
        prompt="baseline",
    )


def test_catalogue_key_naming_too_little_merges_two_intents() -> None:
    ids = _multi_ids("place_order")[:2]
    right, too_little = _run(
        [
            _place_order_task(("customer", "sku"), "none", "intent-key"),
            _place_order_task(("customer",), "none", "intent-key"),
        ],
        "stub/retry",
        sample_id=ids,
    )
    assert all(t.metrics["safe_success"] == 1 for t in right)
    for t in too_little:
        # One key for both orders: the second order reuses it with other parameters (422).
        assert t.effects == 1 and t.metrics["completed"] == 0
        assert any("HTTP 422" in text for text in t.observations)


def test_catalogue_key_naming_too_much_splits_retries() -> None:
    ids = _multi_ids("place_order")[:2]
    fields = ("customer", "sku", "shipping_address")
    right, too_much = _run(
        [
            _place_order_task(("customer", "sku"), "lost_reply", "intent-key"),
            _place_order_task(fields, "lost_reply", "intent-key"),
        ],
        "stub/drift",
        sample_id=ids,
    )
    for t in right:
        # The reworded address reuses the key with other parameters: refused, no duplicate.
        assert t.metrics["duplicated"] == 0
    for t in too_much:
        # The address is in the key, so the reworded retry gets a new key: a second order.
        assert t.metrics["duplicated"] == 1 and t.metrics["diverged"] == 1


# -- archive_record: looping on a success ---------------------------------------------------


def _attempt(n: int, status: int | None, effects: list[str], delivered: bool = True) -> Attempt:
    return Attempt(
        n=n,
        service="records",
        method="POST",
        path="/v1/records/rec_1/archive",
        route="records.record.archive",
        mutating=True,
        key=None,
        params={"record_id": "rec_1", "reason": "done"},
        status=status,
        delivered=delivered,
        effect_ids=effects,
    )


def test_archive_loops_flags_archiving_after_already_archived() -> None:
    ledger = Ledger(
        attempts=[_attempt(1, 200, ["arc_1"]), _attempt(2, 200, []), _attempt(3, 200, [])]
    )
    loops = archive_loops(ledger)
    assert len(loops) == 1 and "attempt 3" in loops[0] and "attempt 2" in loops[0]
    assert archive_end_state(ledger, {}) == loops[0]


def test_archive_loops_allows_one_redundant_archive() -> None:
    lost = Ledger(attempts=[_attempt(1, 200, ["arc_1"], delivered=False), _attempt(2, 200, [])])
    twice = Ledger(attempts=[_attempt(1, 200, ["arc_1"]), _attempt(2, 200, [])])
    assert archive_loops(lost) == [] and archive_loops(twice) == []
    assert archive_end_state(twice, {}) is None


def _archive_three_times(record_id: str) -> Callable[..., ModelOutput]:
    usage = ModelUsage(input_tokens=1, output_tokens=1, total_tokens=2)

    def output(messages: list[Any], *_: Any) -> ModelOutput:
        n = sum(isinstance(m, ChatMessageAssistant) for m in messages)
        if n < 3:
            call = ToolCall(
                id=f"loop_{n}",
                function="archive_record",
                arguments={"record_id": record_id, "reason": "done"},
            )
            out = ModelOutput.from_message(ChatMessageAssistant(content="", tool_calls=[call]))
        else:
            out = ModelOutput.from_content("mockllm/model", "It keeps saying archived; giving up.")
        out.usage = usage  # left empty, inspect would download a tokenizer
        return out

    return output


def test_archive_record_agent_looping_on_success_is_not_completed() -> None:
    record = load_records(TASKS_DIR / "archive_record" / "dataset.jsonl")[0]
    record_id = record.intents[0].identity["record_id"]
    model = get_model("mockllm/model", custom_outputs=_archive_three_times(record_id))
    [[trial]] = _run([TASKS["archive_record"]()], model, sample_id=record.id)
    assert trial.effects == 1 and trial.metrics["duplicated"] == 0
    assert trial.metrics["completed"] == 0
    assert "sent again at attempt 3" in trial.explanation


# -- the catalogue's shape ------------------------------------------------------------------


def test_catalogue_twice_list_shows_every_task() -> None:
    result = CliRunner().invoke(cli, ["list"])
    assert result.exit_code == 0, result.output
    listed = re.findall(r"^  (\S+)", result.output.split("prompts:")[0], re.M)
    # the built-ins, then a task of your own, then one from an OpenAPI document
    assert listed == [*TASKS, "path.py:function", "openapi:PATH[:DATA.jsonl]"]
    assert set(CATALOGUE) <= set(listed) and len(listed) >= 6


@pytest.mark.parametrize("task", ["refund", *CATALOGUE])
def test_catalogue_dataset_has_twenty_valid_samples(task: str) -> None:
    records = load_records(TASKS_DIR / task / "dataset.jsonl")
    assert len(records) >= 20
    tool, _ = MUTATING_TOOLS[task]
    for r in records:
        assert r.plan and all(step.call.tool == tool for step in r.plan), r.id
        assert all(step.verify is not None and step.drift for step in r.plan), r.id
        assert r.intents and all(i.expected == 1 for i in r.intents), r.id


@pytest.mark.parametrize("task", ["refund", *CATALOGUE])
def test_catalogue_mutating_tool_declares_its_class(task: str) -> None:
    module = importlib.import_module(f"twice.tasks.{task}.{task}")
    ctx = TrialContext(Services(module._services({})), get_protection("bare"))
    tools = getattr(module, f"{task}_tools")(ctx)
    classes = {
        ToolDef(t).name: ToolDef(t).options["twice"]["idempotency"]  # type: ignore[index]
        for t in tools
    }
    tool, declared = MUTATING_TOOLS[task]
    assert classes.pop(tool) == declared
    assert set(classes.values()) == {"read"}


def test_catalogue_readme_has_cli_line() -> None:
    for task in CATALOGUE:
        text = (TASKS_DIR / task / "README.md").read_text(encoding="utf-8")
        assert f"inspect eval tasks/{task}" in text and f"twice run --task {task}" in text
