"""twice's inspect tasks, one folder each, and the tool layer they share."""

import inspect
from collections.abc import Callable

from inspect_ai import Task

from ._conversation import CompactingFilter, follow_up
from ._dataset import Record, load_dataset, load_records
from ._inspect_compat import cache_installed_versions, is_registry_object
from ._openapi import openapi_files, openapi_task, openapi_tools
from ._openapi import openapi_parts as _openapi_parts
from ._openapi import openapi_task_function as _openapi_task_function
from ._prompts import PROMPTS_DIR, Prompt, builtin_prompts, load_prompt, read_regular_file
from ._protections import PROTECTIONS, Protection, get_protection
from ._redact import (
    CREDENTIAL_ARG,
    REDACTED,
    SECRET_ENV,
    remember_command_secrets,
    remember_secrets,
    scrub,
    scrub_value,
    secret_values,
    secrets_in,
)
from ._spec import OPENAPI_TASK, file_digest, normal_spec
from ._spec import is_openapi_task as _is_openapi_task
from ._spec import is_spec as _is_spec
from ._spec import load_function as _load_function
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
    AGENT_FAULTS_REFUSED,
    HeldMetadata,
    TaskParts,
    check_agent_cell,
    hold_metadata,
    prompt_metadata,
    resumable_generate,
    stub_setup,
    trial_setup,
    twice_metadata,
    twice_task,
)
from ._trial import (
    TASK_PARTS as _TASK_PARTS,
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


TASK_SPEC = (
    f"path/to/tasks.py:function or package.module:function, or {OPENAPI_TASK} (a task "
    "made from an OpenAPI document and a dataset)"
)
"""How a task of the user's own is named on the task axis."""

_USER_TASKS: dict[str, Callable[..., Task]] = {}


def get_task(name: str) -> Callable[..., Task]:
    """The task function called ``name``: a built-in task, or a task of your own named
    ``path/to/tasks.py:function`` or ``package.module:function`` (an inspect ``@task`` taking
    ``fault``, ``protection`` and ``prompt``, built with :func:`twice_task`), or
    ``openapi:PATH[:DATASET.jsonl]``, a task made from an OpenAPI document and a dataset
    (:func:`openapi_task`; the document and dataset are checked now). A file is imported
    once per process.

    Raises:
        ValueError: naming the bad value and the accepted ones, or what is wrong with a task
            of your own (no such file, function or ``@task``; an import error).
    """
    if name in TASKS:
        return TASKS[name]
    if _is_openapi_task(name):
        if name not in _USER_TASKS:
            _USER_TASKS[name] = _openapi_task_function(name)
        return _USER_TASKS[name]
    if not _is_spec(name):
        raise ValueError(
            f"unknown task {name!r}; expected one of: {', '.join(TASKS)}, or {TASK_SPEC}"
        )
    if name not in _USER_TASKS:
        accepted = f"expected one of: {', '.join(TASKS)}, or {TASK_SPEC}"
        fn = _load_function(name, "task", ValueError, accepted)
        if not is_registry_object(fn, type="task"):
            raise ValueError(
                f"task {name!r} is not an inspect task: decorate it with @task (from "
                "inspect_ai) and build it with twice.tasks.twice_task"
            )
        try:
            inspect.signature(fn).bind(fault="none", protection="bare", prompt="baseline")
        except TypeError:
            raise ValueError(
                f"task {name!r} must take the keyword arguments fault, protection and prompt "
                "(and pass them to twice_task)"
            ) from None
        _USER_TASKS[name] = fn
    return _USER_TASKS[name]


def task_parts(name: str) -> TaskParts:
    """The parts (dataset, services, tools, end state) of the task called ``name``: a built-in
    task, or a task of your own by its spec (``path/to/tasks.py:function``), built once to
    find them.

    Raises:
        ValueError: naming the bad value and the accepted ones, or a task of your own that
            cannot be loaded or was not built with :func:`twice_task`.
    """
    if name not in _PARTS:
        built = get_task(name)(fault="none", protection="bare", prompt="baseline")
        # twice_task registers its parts under the name it was given, just now: read them at
        # once (a task of your own may share a built-in's name; its spec tells them apart).
        parts = _TASK_PARTS.get(built.name)
        if parts is None or twice_metadata(built) is None:
            raise ValueError(
                f"task {name!r} was not built with twice.tasks.twice_task: it has no mock "
                "services, tools or ledger to serve"
            )
        _PARTS[name] = parts
    return _PARTS[name]


_PARTS: dict[str, TaskParts] = {}


def add_openapi_task(
    name: str,
    path: str,
    dataset: str | None = None,
    overrides: str | None = None,
) -> TaskParts:
    """Make the task ``name`` from an OpenAPI document (see :func:`openapi_parts`) and
    register its parts, so :func:`task_parts` (and ``twice serve``) finds it by ``name``.

    Raises:
        ValueError: for a built-in task's name, or a document, overrides or dataset twice
            cannot use.
    """
    if name in TASKS:
        raise ValueError(f"{name!r} is a built-in task; give the OpenAPI service another name")
    parts = _openapi_parts(name, path, dataset, overrides)
    _PARTS[name] = parts
    return parts


__all__ = [
    "ACTION_LOG_STORE_KEY",
    "AGENT_FAULTS_REFUSED",
    "COMPENSATIONS_STORE_KEY",
    "CREDENTIAL_ARG",
    "IDEMPOTENCY_CLASSES",
    "OPENAPI_TASK",
    "PROMPTS_DIR",
    "PROTECTIONS",
    "REDACTED",
    "SECRET_ENV",
    "TASKS",
    "TASK_SPEC",
    "ActionLog",
    "ActionRecord",
    "CompactingFilter",
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
    "add_openapi_task",
    "archive_record",
    "builtin_prompts",
    "cache_installed_versions",
    "check_agent_cell",
    "create_ticket",
    "file_digest",
    "follow_up",
    "get_protection",
    "get_task",
    "hold_metadata",
    "load_dataset",
    "load_prompt",
    "load_records",
    "make_tool",
    "mutate",
    "normal_spec",
    "openapi_files",
    "openapi_task",
    "openapi_tools",
    "place_order",
    "prompt_metadata",
    "read",
    "read_regular_file",
    "refund",
    "remember_command_secrets",
    "remember_secrets",
    "resumable_generate",
    "scrub",
    "scrub_value",
    "secret_values",
    "secrets_in",
    "send_email",
    "stub_setup",
    "task_parts",
    "travel_booking",
    "trial_setup",
    "twice_metadata",
    "twice_task",
]
