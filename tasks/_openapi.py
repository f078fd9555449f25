"""A task made from an OpenAPI document and a dataset, with no Python of the user's: the
generated service, a tool per operation (its operationId, summary and description, its
parameters as the JSON schema), and the samples, each checked against the document."""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
from inspect_ai import Task
from inspect_ai.dataset import MemoryDataset, Sample
from inspect_ai.tool import Tool, ToolParams
from twice.mocks import (
    OpenAPIOperation,
    Service,
    openapi_operations,
    openapi_service,
    services_from_state,
)

from ._context import ServiceAPI, TrialContext
from ._dataset import Record, load_dataset, load_records
from ._make_tool import make_tool
from ._send import form_pairs
from ._spec import OPENAPI_TASK, OVERRIDES_BESIDE, is_openapi_task, split_openapi_task
from ._trial import TaskParts, twice_task

_DONE = {"create": "Created", "update": "Updated", "delete": "Deleted"}


def openapi_files(name: str) -> tuple[Path, Path, Path | None]:
    """The document, dataset and overrides file an ``openapi:`` task name means.

    Without a dataset, the one beside the document named after it (``stripe.json`` →
    ``stripe.jsonl``); an overrides file beside it (:data:`OVERRIDES_BESIDE`) is read when
    there is one.

    Raises:
        ValueError: for a name of another shape, a document that does not exist, or no
            dataset (naming where it was looked for).
    """
    document, dataset = split_openapi_task(name)
    if not is_openapi_task(name) or not document:
        raise ValueError(f"task {name!r} is not of the form {OPENAPI_TASK}")
    doc = Path(document)
    if not doc.is_file():
        head, sep, tail = document.rpartition(":")
        if sep and Path(head).is_file():
            raise ValueError(
                f"task {name!r}: the dataset {tail!r} is not a .jsonl file; {OPENAPI_TASK}"
            )
        raise ValueError(f"task {name!r}: no OpenAPI document {document!r}")
    data = Path(dataset) if dataset else doc.with_suffix(".jsonl")
    if not data.is_file():
        how = "" if dataset else f"; none given, so the one beside the document, {str(data)!r}"
        raise ValueError(
            f"task {name!r}: no dataset file {str(data)!r}{how}: name one, {OPENAPI_TASK}"
        )
    beside = (doc.with_name(doc.stem + s) for s in OVERRIDES_BESIDE)
    return doc, data, next((p for p in beside if p.is_file()), None)


def openapi_parts(
    name: str,
    path: str | Path,
    dataset: str | Path | None = None,
    overrides: str | Path | None = None,
) -> TaskParts:
    """A task's parts from an OpenAPI document, its service named ``name``: the generated
    service, a tool per operation (:func:`openapi_tools`) and the samples.

    Args:
        name: The service's (and the task's) name.
        path: The OpenAPI 3.0/3.1 document (JSON or YAML).
        dataset: A JSONL dataset (state, intents, plan per sample), each row checked against
            the document; None: one sample ``<name>-1`` starting with no objects.
        overrides: A YAML/TOML overrides file for what inference gets wrong.

    Raises:
        ValueError: for a document, overrides or dataset twice cannot use (naming the row,
            the field and what is accepted).
    """
    kind = openapi_service(path, name=name, overrides=overrides)
    ops = {o.tool: o for o in openapi_operations(kind)}

    def services(state: dict[str, Any]) -> list[Service]:
        return services_from_state(state, kind)

    if dataset is not None:
        records = load_records(Path(dataset))
        lines = _lines(Path(dataset))
        for record in records:
            problem = _problem(record, ops, services, name)
            if problem:
                raise ValueError(
                    f"{dataset}:{lines.get(record.id, '?')}: sample {record.id!r}: {problem}"
                )
        data = load_dataset(Path(dataset), name)
        identities = _identity_keys(records)
    else:
        data = MemoryDataset(
            [
                Sample(
                    id=f"{name}-1",
                    input=f"Use the {kind.api_name}.",
                    metadata={"state": {}, "intents": [], "plan": []},
                )
            ],
            name=name,
        )
        identities = {}
    return TaskParts(name, data, services, openapi_tools(kind, identities), None)


def openapi_task(
    document: str | Path,
    dataset: str | Path,
    *,
    fault: str = "none",
    protection: str = "bare",
    prompt: str = "baseline",
    action_log: bool | None = None,
    agent: str = "react",
    mocks: dict[str, str] | None = None,
    overrides: str | Path | None = None,
    name: str | None = None,
) -> Task:
    """A twice task from an OpenAPI document and a dataset: the service generated from the
    document, a tool per operation, and the dataset's samples (checked against the document).

    Args:
        document: The OpenAPI 3.0/3.1 document (JSON or YAML).
        dataset: The JSONL dataset: per row the request (``input``), the starting ``state``,
            the ``intents`` (effect kinds the service names) and the stubs' ``plan`` (tool
            names are operationIds).
        fault: A fault name.
        protection: A protection name.
        prompt: A built-in prompt name or a prompt file path.
        action_log: Keep a durable action log (None: as the protection says).
        agent: The agent under test.
        mocks: Production URL by service name, for an agent under test.
        overrides: A YAML/TOML overrides file for what inference gets wrong.
        name: The service's name (default: from the document's title).

    Raises:
        ValueError: for a document, overrides or dataset twice cannot use, or a cell the
            task cannot run, naming the bad value and what is accepted.
    """
    service = name or openapi_service(document, overrides=overrides).name
    parts = openapi_parts(service, document, dataset, overrides)
    return twice_task(
        name=f"openapi_{service}",
        dataset=parts.dataset,
        services=parts.services,
        tools=parts.tools,
        fault=fault,
        protection=protection,
        prompt=prompt,
        action_log=action_log,
        agent=agent,
        mocks=mocks,
    )


def openapi_task_function(name: str) -> Callable[..., Task]:
    """The task function of an ``openapi:PATH[:DATASET.jsonl]`` task name (as
    :func:`~twice.tasks.get_task` returns one); the document and dataset are read and
    checked now.

    Raises:
        ValueError: naming what cannot be used (see :func:`openapi_files`, :func:`openapi_task`).
    """
    document, dataset, overrides = openapi_files(name)
    try:
        openapi_task(document, dataset, overrides=overrides)
    except ValueError as ex:
        raise ValueError(f"task {name!r}: {ex}") from None

    def task(
        fault: str = "none",
        protection: str = "bare",
        prompt: str = "baseline",
        action_log: bool | None = None,
        agent: str = "react",
        mocks: dict[str, str] | None = None,
    ) -> Task:
        return openapi_task(
            document,
            dataset,
            fault=fault,
            protection=protection,
            prompt=prompt,
            action_log=action_log,
            agent=agent,
            mocks=mocks,
            overrides=overrides,
        )

    return task


# -- the tools -------------------------------------------------------------------------------


def openapi_tools(
    service: type[Service], identities: dict[str, tuple[str, ...]] | None = None
) -> Callable[[TrialContext], list[Tool]]:
    """The tools of a generated service, one per operation, for a trial.

    A tool's name is the operationId (made a valid tool name), its description the
    summary and description, its parameters the path, query and body parameters. A
    mutating operation's tool sends through the trial's protection, as a built-in task's
    mutating tool does (its idempotency key under the header the document declares; a
    lost reply reaches the model as the same unknown outcome); a read's tool GETs.

    Args:
        service: A class :func:`~twice.mocks.openapi_service` made.
        identities: Per effect kind, the fields that say which action a call is (from the
            dataset's intents); an intent key is derived from them, so a model's retry with
            another value of another field reuses it. An effect kind not named: every field.
    """
    ops = openapi_operations(service)
    keys = identities or {}
    schemas = {o.tool: _params(o) for o in ops}
    by_tool = {o.tool: o for o in ops}

    def tools(ctx: TrialContext) -> list[Tool]:
        api = ctx.api(service.name)
        out = []
        for op in ops:
            if op.mutating:
                lister = by_tool.get(op.lister) if op.lister else None
                fn = _mutating_tool(api, op, keys.get(op.effect), lister)
            else:
                fn = _read_tool(api, op)
            out.append(
                make_tool(
                    ctx,
                    fn,
                    idempotency="keyed" if op.mutating else None,
                    parallel=op.mutating,
                    verify_with=op.lister if op.mutating and op.verb == "create" else None,
                    name=op.tool,
                    description=op.description,
                    parameters=schemas[op.tool],
                )
            )
        return out

    return tools


def _params(op: OpenAPIOperation) -> ToolParams:
    return ToolParams.model_validate(
        {
            "properties": {a.name: a.schema for a in op.arguments},
            "required": [a.name for a in op.arguments if a.required],
        }
    )


def _request(
    op: OpenAPIOperation, args: dict[str, Any]
) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """(path, query, body) of a call with these tool arguments."""
    path = op.path
    query: dict[str, Any] = {}
    body: dict[str, Any] = {}
    for a in op.arguments:
        if a.name not in args:
            continue
        value = args[a.name]
        if a.where == "path":
            path = path.replace("{" + a.wire_name + "}", urllib.parse.quote(str(value), safe=""))
        elif a.where == "query":
            query[a.wire_name] = value
        else:
            body[a.wire_name] = value
    return path, query, body


def _query(query: dict[str, Any]) -> dict[str, Any]:
    """Query values as the form brackets the services read (``created[gt]=1``)."""
    return dict(form_pairs(query))


def _fields(op: OpenAPIOperation, args: dict[str, Any]) -> dict[str, Any]:
    """The effect's fields a call with these arguments commits (the item's id by its field)."""
    out = {}
    for a in op.arguments:
        if a.name in args and a.where in ("path", "body"):
            key = op.id_field if a.wire_name == op.item_param else a.wire_name
            out[key] = args[a.name]
    return out


def _read_tool(api: ServiceAPI, op: OpenAPIOperation) -> Callable[..., Any]:
    async def call(**kwargs: Any) -> str:
        path, query, _ = _request(op, kwargs)
        found = await api.get(path, params=_query(query) or None)
        return f"{op.tool}: {json.dumps(found, separators=(',', ':'))}"

    return call


def _mutating_tool(
    api: ServiceAPI,
    op: OpenAPIOperation,
    identity_keys: tuple[str, ...] | None,
    lister: OpenAPIOperation | None,
) -> Callable[..., Any]:
    async def call(**kwargs: Any) -> str:
        path, query, body = _request(op, kwargs)
        fields = _fields(op, kwargs)
        identity = {k: fields.get(k) for k in identity_keys} if identity_keys else fields
        lookup = None
        if op.verb == "create" and lister is not None:
            # Only a create has a list to look in; the lookup protection refuses the others.
            found_in = lister

            async def lookup() -> dict[str, Any] | None:
                return await _find(api, found_in, kwargs, identity)

        result = await api.mutate(
            op.effect,
            path,
            payload=body,
            identity=identity,
            noun=op.resource,
            lookup=lookup,
            method=op.method,
            form=op.body_type == "form",
            params=_query(query) or None,
        )
        made = result.body
        oid = made.get(op.id_field) if isinstance(made, dict) else None
        what = f"{op.resource}{f' {oid}' if oid else ''}: {json.dumps(made, separators=(',', ':'))}"
        return result.say(_DONE.get(op.verb, "Done"), what)

    return call


async def _find(
    api: ServiceAPI,
    lister: OpenAPIOperation,
    args: dict[str, Any],
    identity: dict[str, Any],
) -> dict[str, Any] | None:
    """The object a create call made already, found in the resource's list (for the
    ``lookup`` protection): a row whose identity fields are the call's."""
    path, _, _ = _request(lister, args)
    wanted = {a.wire_name for a in lister.arguments if a.where == "query"}
    query = {k: v for k, v in identity.items() if k in wanted and v is not None}
    found = await api.get(path, params=_query(query) or None)
    if isinstance(found, dict):
        found = next((v for v in found.values() if isinstance(v, list)), [])
    for row in found if isinstance(found, list) else []:
        if isinstance(row, dict) and all(_same(row.get(k), v) for k, v in identity.items()):
            return row
    return None


def _same(have: Any, want: Any) -> bool:
    if isinstance(have, dict):
        have = have.get("id")
    return str(have) == str(want)


# -- the dataset, checked against the document ------------------------------------------------


def _lines(path: Path) -> dict[str, int]:
    """Each sample id's line in the dataset file."""
    out: dict[str, int] = {}
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        try:
            row = json.loads(line) if line.strip() else None
        except ValueError:
            continue
        if isinstance(row, dict) and isinstance(row.get("id"), str):
            out.setdefault(row["id"], n)
    return out


def _identity_keys(records: list[Record]) -> dict[str, tuple[str, ...]]:
    keys: dict[str, set[str]] = {}
    for r in records:
        for intent in r.intents:
            keys.setdefault(intent.effect, set()).update(intent.identity)
    return {effect: tuple(sorted(names)) for effect, names in keys.items()}


def _problem(
    record: Record,
    ops: dict[str, OpenAPIOperation],
    services: Callable[[dict[str, Any]], list[Service]],
    service: str,
) -> str | None:
    """What in one row the document does not have, naming the field and what is accepted."""
    try:
        services(record.state)
    except (TypeError, ValueError) as ex:
        return f"state: {ex}"
    effects = {o.effect: o for o in ops.values() if o.mutating}
    for i, intent in enumerate(record.intents):
        op = effects.get(intent.effect)
        if op is None:
            return (
                f"intents[{i}].effect {intent.effect!r} is not one the {service} service "
                f"makes; its effects: {', '.join(sorted(effects)) or 'none'}"
            )
        accepted = op.effect_fields()
        for part in ("identity", "values"):
            for key in getattr(intent, part):
                if key not in accepted:
                    return (
                        f"intents[{i}].{part} field {key!r} is not a field of a "
                        f"{intent.effect} effect ({op.label}); its fields: "
                        + ", ".join(sorted(accepted))
                    )
    tools = ", ".join(sorted(ops))
    reads = ", ".join(sorted(t for t, o in ops.items() if not o.mutating)) or "none"
    for i, step in enumerate(record.plan):
        for part in ("call", "verify", "compensate"):
            spec = getattr(step, part)
            if spec is None:
                continue
            where = f"plan[{i}].{part}"
            op = ops.get(spec.tool)
            if op is None:
                return (
                    f"{where}.tool {spec.tool!r} is not an operation of the document; its "
                    f"tools: {tools}"
                )
            if part == "verify" and op.mutating:
                return (
                    f"{where}.tool {spec.tool!r} is a mutating operation; stub/verify looks "
                    f"first with a read operation: {reads}"
                )
            problem = _args_problem(op, spec.args, f"{where}.args")
            if problem:
                return problem
        takes = {a.name for a in ops[step.call.tool].arguments}
        for key in step.drift:
            if key not in takes:
                return (
                    f"plan[{i}].drift argument {key!r} is not one {step.call.tool!r} takes; "
                    f"it takes: {', '.join(sorted(takes))}"
                )
    return None


def _args_problem(op: OpenAPIOperation, args: dict[str, Any], where: str) -> str | None:
    by_name = {a.name: a for a in op.arguments}
    takes = ", ".join(by_name) or "nothing"
    for key, value in args.items():
        arg = by_name.get(key)
        if arg is None:
            return f"{where}.{key}: {op.tool!r} takes no argument {key!r}; it takes: {takes}"
        errors = sorted(jsonschema.Draft7Validator(arg.schema).iter_errors(value), key=str)
        if errors:
            return f"{where}.{key}: {_short(errors[0].message)} (the schema {op.label} gives it)"
    missing = [a.name for a in op.arguments if a.required and a.name not in args]
    if missing:
        return f"{where}: {op.tool!r} needs argument {missing[0]!r}; it takes: {takes}"
    return None


def _short(text: str) -> str:
    return text if len(text) <= 160 else text[:157] + "..."
