"""The operations of a service made from an OpenAPI document, described for tools: a tool
name from the operationId, a description from the summary and description, and one JSON
schema per argument (the path, query and body parameters, ``$ref``s resolved), each argument
knowing where on the request it goes. Data only: ``twice.tasks`` makes inspect tools of it."""

from __future__ import annotations

import html
import re
from dataclasses import dataclass
from typing import Any, Literal

from ._openapi_plan import OpenAPIError, Operation, Plan, _deref, _json_body_schema
from ._wire import FORM_TYPE

_SCHEMA_KEYS = (
    "type",
    "format",
    "description",
    "default",
    "enum",
    "pattern",
    "minLength",
    "maxLength",
    "minimum",
    "maximum",
    "required",
)
_MAX_DEPTH = 8

Where = Literal["path", "query", "body"]


@dataclass(frozen=True)
class OpenAPIArgument:
    """One argument of an operation's tool and where it goes on the request."""

    name: str
    """The tool's argument name (the wire name, unless two places share it)."""
    where: Where
    wire_name: str
    """The parameter's or body field's own name."""
    schema: dict[str, Any]
    """Its JSON schema, ``$ref``s resolved, in the dialect tool schemas use."""
    required: bool


@dataclass(frozen=True)
class OpenAPIOperation:
    """One operation of a generated service, as a tool presents it to a model.

    Attributes:
        tool: The tool name: the operationId made a valid tool name (``[A-Za-z0-9_-]``, at
            most 64 characters), or ``<method>_<path>`` when the document gives none.
        operation_id: The document's operationId (None when it has none).
        method: The HTTP method.
        path: The path template (``/v1/refunds/{refund}``).
        effect: The effect kind a call commits (``stripe.refund.create``); the route name.
        mutating: Whether a call commits an effect.
        resource: The resource acted on (``refund``).
        verb: ``create``, ``list``, ``get``, ``update``, ``delete`` or an action's name.
        description: The summary and description, markup removed.
        arguments: The tool's arguments, path parameters first.
        body_type: ``json`` or ``form`` for an operation that sends a body, else None.
        id_field: The field that holds the id of the resource's objects.
        item_param: The path parameter naming the object acted on (None on a collection).
        lister: The tool name of the operation that lists this resource (None: none does).
    """

    tool: str
    operation_id: str | None
    method: str
    path: str
    effect: str
    mutating: bool
    resource: str
    verb: str
    description: str
    arguments: tuple[OpenAPIArgument, ...]
    body_type: Literal["json", "form"] | None
    id_field: str
    item_param: str | None
    lister: str | None = None

    @property
    def label(self) -> str:
        """``PostRefunds (POST /v1/refunds)``: how messages name the operation."""
        return f"{self.operation_id or self.tool} ({self.method} {self.path})"

    def effect_fields(self) -> set[str]:
        """The fields an effect of this operation may carry (what an intent can name)."""
        fields = {a.wire_name for a in self.arguments if a.where in ("path", "body")}
        if self.item_param is not None:
            fields.discard(self.item_param)
            fields.add(self.id_field)
        return fields


def tool_name(op: Operation) -> str:
    """The tool name of an operation (see :attr:`OpenAPIOperation.tool`)."""
    raw = op.tool or op.operation_id or f"{op.method.lower()}_{op.path}"
    name = re.sub(r"[^A-Za-z0-9_-]+", "_", raw).strip("_")[:64]
    return name or f"{op.method.lower()}_root"


def openapi_operations(service: type[Any]) -> list[OpenAPIOperation]:
    """The operations of a service class :func:`~twice.mocks.openapi_service` made, as tools.

    Args:
        service: The generated service class.

    Raises:
        OpenAPIError: when two operations make one tool name (naming both, and the overrides
            key that renames one), or ``service`` is not a generated service.
    """
    plan = getattr(service, "plan", None)
    if not isinstance(plan, Plan):
        raise OpenAPIError(
            f"{getattr(service, '__name__', service)!r} is not a service made by openapi_service"
        )
    made: dict[str, OpenAPIOperation] = {}
    for op in plan.operations:
        out = _describe(plan, op)
        other = made.get(out.tool)
        if other is not None:
            raise OpenAPIError(
                f"operations {other.label} and {out.label} both make the tool name "
                f"{out.tool!r}; give one its own in an overrides file: operations."
                f"<operationId or 'METHOD /path'>.tool"
            )
        made[out.tool] = out
    listers = {o.resource: o.tool for o in made.values() if o.verb == "list"}
    return [
        OpenAPIOperation(**{**o.__dict__, "lister": listers.get(o.resource)}) for o in made.values()
    ]


def _describe(plan: Plan, op: Operation) -> OpenAPIOperation:
    doc = plan.doc
    args: list[OpenAPIArgument] = []
    for raw in op.spec.get("parameters") or []:
        p = _deref(doc, raw)
        where = p.get("in") if isinstance(p, dict) else None
        if where not in ("path", "query"):
            continue  # headers are the client's business (credentials, the key), not a model's
        schema = _tool_schema(plan, p.get("schema") or {}, 0)
        text = _plain(p.get("description")) or schema.get("description")
        schema["description"] = text or f"The {p['name']} {where} parameter."
        required = where == "path" or bool(p.get("required"))
        wire = str(p["name"])
        args.append(OpenAPIArgument(_arg_name(wire, args), where, wire, schema, required))
    media, body = _json_body_schema(op.spec, doc)
    body_type: Literal["json", "form"] | None = None
    if op.method != "GET" and body is not None:
        body_type = "form" if media in (FORM_TYPE, "multipart/form-data") else "json"
        required_body = bool((_deref(doc, op.spec.get("requestBody")) or {}).get("required"))
        schema = _tool_schema(plan, body, 0)
        needed = set(schema.get("required") or []) if required_body else set()
        for field, sub in (schema.get("properties") or {}).items():
            sub = dict(sub)
            sub["description"] = sub.get("description") or f"The request's {field} field."
            name = _arg_name(field, args, "body_")
            args.append(OpenAPIArgument(name, "body", field, sub, field in needed))
    text = "\n\n".join(
        t for t in (_plain(op.spec.get("summary")), _plain(op.spec.get("description"))) if t
    )
    res = plan.resources[op.resource]
    return OpenAPIOperation(
        tool=tool_name(op),
        operation_id=op.operation_id,
        method=op.method,
        path=op.path,
        effect=op.name,
        mutating=op.mutating,
        resource=op.resource,
        verb=op.verb,
        description=text or f"{op.method} {op.path}.",
        arguments=tuple(args),
        body_type=body_type,
        id_field=res.id_field,
        item_param=op.item_param,
    )


def _arg_name(wire: str, taken: list[OpenAPIArgument], prefix: str = "") -> str:
    """A tool argument's name for a parameter: model APIs take ``[A-Za-z0-9_.-]`` (so
    Twilio's ``DateSent<`` is ``DateSent_lt``); a name a parameter in another place has
    already taken gets ``prefix`` (a body field named like a path parameter), then a number."""
    name = wire.replace("<", "_lt").replace(">", "_gt")
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", name)[:60] or "arg"
    names = {a.name for a in taken}
    if name in names:
        name = prefix + name
    n = 2
    base = name
    while name in names:
        name, n = f"{base}_{n}", n + 1
    return name


def _plain(text: Any) -> str:
    """A description as plain text: a model reads it, so markup goes."""
    if not isinstance(text, str):
        return ""
    return html.unescape(re.sub(r"<[^>]+>", "", text)).strip()


def _tool_schema(plan: Plan, node: Any, depth: int) -> dict[str, Any]:
    """An OpenAPI schema in the subset of JSON Schema tool parameters take: ``$ref``s
    followed, ``oneOf`` as ``anyOf``, ``allOf`` merged, 3.0's ``nullable`` as a null branch;
    past a depth (a recursive schema) any value."""
    node = _deref(plan.doc, node)
    if not isinstance(node, dict) or depth > _MAX_DEPTH:
        return {}
    out: dict[str, Any] = {k: node[k] for k in _SCHEMA_KEYS if k in node}
    if "const" in node and "enum" not in out:  # tool schemas have no const
        out["enum"] = [node["const"]]
    if isinstance(out.get("description"), str):
        out["description"] = _plain(out["description"])
    if "items" in node:
        out["items"] = _tool_schema(plan, node["items"], depth + 1)
    if isinstance(node.get("properties"), dict):
        out["properties"] = {
            k: _tool_schema(plan, v, depth + 1) for k, v in node["properties"].items()
        }
    extra = node.get("additionalProperties")
    if isinstance(extra, bool):
        out["additionalProperties"] = extra
    elif isinstance(extra, dict):
        out["additionalProperties"] = _tool_schema(plan, extra, depth + 1)
    branches = [*(node.get("anyOf") or []), *(node.get("oneOf") or [])]
    if branches:
        out["anyOf"] = [_tool_schema(plan, b, depth + 1) for b in branches]
    for part in node.get("allOf") or []:
        merged = _tool_schema(plan, part, depth + 1)
        out.setdefault("type", merged.get("type"))
        if merged.get("properties"):
            out["properties"] = {**merged["properties"], **(out.get("properties") or {})}
        if merged.get("required"):
            out["required"] = sorted({*out.get("required", []), *merged["required"]})
        if "description" not in out and merged.get("description"):
            out["description"] = merged["description"]
    if out.get("type") is None:
        out.pop("type", None)
    if plan.nullable_keyword and node.get("nullable") is True:
        described = {"description": out.pop("description")} if "description" in out else {}
        return {**described, "anyOf": [out, {"type": "null"}]}
    return out
