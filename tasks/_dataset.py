"""Typed JSONL datasets: each record carries its intents and the stub models' gold plan as data."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Literal

from inspect_ai.dataset import MemoryDataset, Sample
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator


class ToolCallSpec(BaseModel):
    """A tool call in a gold plan."""

    model_config = ConfigDict(extra="forbid", strict=True)
    tool: str
    args: dict[str, Any] = Field(default_factory=dict)


class PlanStep(BaseModel):
    """One step of the gold plan that stub models follow (real models never see it).

    Attributes:
        call: The action.
        verify: A read call that tells whether the action already took effect (used by
            ``stub/verify`` after an unknown outcome).
        found_pattern: A regular expression that, found in the ``verify`` result, means the
            action already took effect (``re_\\d+`` for a refund id).
        drift: Argument overrides that ``stub/drift`` uses when it retries.
        compensate: The undo of this step (a saga's compensating action), which stubs call
            when a later step with ``on_fail: "compensate"`` fails for good. The text
            ``{ref}`` in its string arguments is replaced by the reference this step made.
        ref_pattern: A regular expression whose match in this step's last successful result
            (or verify result) is that reference (``fb_\\d+`` for a flight booking id).
        on_fail: What a stub does when it gives up on this step: ``stop`` (report and end),
            ``continue`` (report it and go on with the next step: the steps are independent
            actions, as in a request for two refunds) or ``compensate`` (undo the earlier
            steps that have ``compensate``, latest first, then report).
    """

    model_config = ConfigDict(extra="forbid", strict=True)
    call: ToolCallSpec
    verify: ToolCallSpec | None = None
    found_pattern: str | None = None
    drift: dict[str, Any] = Field(default_factory=dict)
    compensate: ToolCallSpec | None = None
    ref_pattern: str | None = None
    on_fail: Literal["stop", "continue", "compensate"] = "stop"

    @model_validator(mode="after")
    def _verify_needs_pattern(self) -> PlanStep:
        if self.verify is not None and not self.found_pattern:
            raise ValueError("a plan step with 'verify' needs 'found_pattern'")
        return self

    @model_validator(mode="after")
    def _compensate_ref_needs_pattern(self) -> PlanStep:
        uses_ref = self.compensate is not None and any(
            isinstance(v, str) and "{ref}" in v for v in self.compensate.args.values()
        )
        if uses_ref and not self.ref_pattern:
            raise ValueError("a 'compensate' call using '{ref}' needs 'ref_pattern'")
        for name in ("found_pattern", "ref_pattern"):
            pattern = getattr(self, name)
            if pattern is not None:
                try:
                    re.compile(pattern)
                except re.error as ex:
                    raise ValueError(
                        f"{name} {pattern!r} is not a regular expression: {ex}"
                    ) from None
        return self


class IntentSpec(BaseModel):
    """What should happen, as data (see ``assertions.Intent``).

    Attributes:
        effect: The effect name (``payments.refund.create``).
        identity: The fields that say which action this is (``{"order_id": "order_1042"}``).
        expected: How many times it should happen.
        values: What the request asked for beyond the identity, in the form the service
            commits it (``{"amount": 499}``: cents). An effect with another value is
            *wrong*: it does not complete the intent. Compared exactly; a field the
            effect does not have is an error when the trial is scored.
    """

    model_config = ConfigDict(extra="forbid", strict=True)
    effect: str
    identity: dict[str, Any]
    expected: int = 1
    values: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _values_beside_identity(self) -> IntentSpec:
        if both := sorted(set(self.identity) & set(self.values)):
            raise ValueError(
                f"{', '.join(both)} is both in identity and in values; identity fields are "
                "compared exactly already: state it once, in identity"
            )
        if self.values and self.expected < 1:
            raise ValueError(
                f"values {self.values!r} on an intent expected {self.expected} times: values "
                "say what an action that should happen must carry (expected >= 1)"
            )
        for key, value in self.values.items():
            if not isinstance(value, str | int | float | bool) and value is not None:
                raise ValueError(
                    f"value {key!r} is {value!r}; a value is a JSON string, number, boolean "
                    "or null, compared exactly with the effect's field"
                )
        return self


ASSERTIONS_IGNORED = (
    "metadata.assertions is read only by the side_effect_assertions scorer (a hand-made "
    "inspect task); this task is scored by its intents: write each expectation as an "
    "intent (effect, identity, expected, values; expected 0 for never)"
)
"""Why a twice task refuses a sample whose metadata carries assertions."""


class Record(BaseModel):
    """One line of a task's ``dataset.jsonl``."""

    model_config = ConfigDict(extra="forbid", strict=True)
    id: str
    input: str
    state: dict[str, Any] = Field(default_factory=dict)
    """Initial service state for the trial (e.g. ``{"orders": [...]}``)."""
    intents: list[IntentSpec]
    plan: list[PlanStep]
    metadata: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _no_assertions_it_would_ignore(self) -> Record:
        if "assertions" in self.metadata:  # named with the file and line (and see _trial)
            raise ValueError(ASSERTIONS_IGNORED)
        return self

    @model_validator(mode="after")
    def _compensation_has_something_to_undo(self) -> Record:
        for i, step in enumerate(self.plan):
            if step.on_fail == "compensate" and not any(s.compensate for s in self.plan[:i]):
                raise ValueError(
                    f"plan step {i} has on_fail 'compensate' but no earlier step has "
                    "'compensate' (nothing to undo)"
                )
        return self


def _one_line(ex: ValidationError) -> str:
    """Pydantic's report as one line: ``plan.0.call: Field required; id: ...`` (with the bad
    value, so a ``true`` where a count belongs is named)."""
    parts = []
    for err in ex.errors():
        where = ".".join(str(x) for x in err["loc"]) or "record"
        shown = repr(err["input"])
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        got = f" (got {shown})" if err["type"] != "missing" else ""
        parts.append(f"{where}: {err['msg']}{got}")
    return "; ".join(parts)


def load_records(path: Path) -> list[Record]:
    """Read and validate a JSONL dataset.

    Types are strict: ``true`` is not a count and ``"2"`` is not a number.

    Raises:
        ValueError: naming the file, line and problem, on one line.
    """
    records = []
    seen: set[str] = set()
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = Record.model_validate(json.loads(line))
        except ValidationError as ex:
            raise ValueError(f"{path}:{lineno}: invalid dataset record: {_one_line(ex)}") from None
        except ValueError as ex:
            raise ValueError(f"{path}:{lineno}: invalid dataset record: {ex}") from None
        if record.id in seen:
            raise ValueError(f"{path}:{lineno}: duplicate sample id {record.id!r}")
        seen.add(record.id)
        records.append(record)
    return records


def load_dataset(path: Path, name: str) -> MemoryDataset:
    """A validated JSONL file as an inspect dataset; intents, plan and state go to metadata."""
    samples = [
        Sample(
            id=r.id,
            input=r.input,
            metadata={
                **r.metadata,
                "state": r.state,
                "intents": [i.model_dump() for i in r.intents],
                "plan": [s.model_dump() for s in r.plan],
            },
        )
        for r in load_records(path)
    ]
    return MemoryDataset(samples, name=name)
