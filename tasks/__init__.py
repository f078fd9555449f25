"""twice's inspect tasks, one folder each, and the tool layer they share."""

from collections.abc import Callable

from inspect_ai import Task

from ._dataset import Record, load_dataset, load_records
from ._prompts import PROMPTS_DIR, Prompt, builtin_prompts, load_prompt
from ._protections import PROTECTIONS, Protection, get_protection
from ._redact import REDACTED, SECRET_ENV, scrub, secret_values
from ._toolkit import (
    ACTION_LOG_STORE_KEY,
    COMPENSATIONS_STORE_KEY,
    IDEMPOTENCY_CLASSES,
    ActionLog,
    ActionRecord,
    Compensation,
    IdempotencyClass,
    Mutation,
    Problem,
    RunCrashed,
    ServiceAPI,
    ToolSpec,
    TrialContext,
    Undo,
    make_tool,
    mutate,
    read,
)
from ._trial import (
    HeldMetadata,
    TaskParts,
    check_agent_cell,
    hold_metadata,
    prompt_metadata,
    resumable_generate,
    stub_setup,
    trial_setup,
    twice_task,
)
from .archive_record import archive_record
from .create_ticket import create_ticket
from .place_order import place_order
from .refund import refund
from .send_email import send_email
from .travel_booking import travel_booking

TASKS: dict[str, Callable[..., Task]] = {
    "refund": refund,
    "send_email": send_email,
    "create_ticket": create_ticket,
    "place_order": place_order,
    "archive_record": archive_record,
    "travel_booking": travel_booking,
}
"""Built-in tasks by name; each takes ``fault``, ``protection``, ``prompt``, ``agent`` and
``mocks``."""


def get_task(name: str) -> Callable[..., Task]:
    """The built-in task called ``name``.

    Raises:
        ValueError: naming the bad value and the accepted ones.
    """
    try:
        return TASKS[name]
    except KeyError:
        raise ValueError(f"unknown task {name!r}; expected one of: {', '.join(TASKS)}") from None


def task_parts(name: str) -> TaskParts:
    """The parts of the built-in task called ``name`` (dataset, services, tools, end state).

    Raises:
        ValueError: naming the bad value and the accepted ones.
    """
    from ._trial import TASK_PARTS

    build = get_task(name)
    if name not in TASK_PARTS:
        build()
    return TASK_PARTS[name]


__all__ = [
    "ACTION_LOG_STORE_KEY",
    "COMPENSATIONS_STORE_KEY",
    "IDEMPOTENCY_CLASSES",
    "PROMPTS_DIR",
    "PROTECTIONS",
    "REDACTED",
    "SECRET_ENV",
    "TASKS",
    "ActionLog",
    "ActionRecord",
    "Compensation",
    "HeldMetadata",
    "IdempotencyClass",
    "Mutation",
    "Problem",
    "Prompt",
    "Protection",
    "Record",
    "RunCrashed",
    "ServiceAPI",
    "TaskParts",
    "ToolSpec",
    "TrialContext",
    "Undo",
    "archive_record",
    "builtin_prompts",
    "check_agent_cell",
    "create_ticket",
    "get_protection",
    "get_task",
    "hold_metadata",
    "load_dataset",
    "load_prompt",
    "load_records",
    "make_tool",
    "mutate",
    "place_order",
    "prompt_metadata",
    "read",
    "refund",
    "resumable_generate",
    "scrub",
    "secret_values",
    "send_email",
    "stub_setup",
    "task_parts",
    "travel_booking",
    "trial_setup",
    "twice_task",
]
