"""An OpenAPI 3.0 or 3.1 document read into the plan of a service: operations with their
resource, verb and effect name, inferred the usual REST way (a POST on a collection creates, a
GET lists, an item path reads, updates and deletes, a POST on an item's sub-path is an action)
and corrected by an overrides file."""

from __future__ import annotations

import json
import re
import tomllib
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from ._wire import FORM_TYPE, KEY_HEADER

MUTATING_METHODS = ("POST", "PUT", "PATCH", "DELETE")
_METHODS = ("get", "put", "post", "delete", "patch")
_PARAM = re.compile(r"^\{([^}]+)\}(.*)$")
_ID_NAMES = ("id", "sid", "uuid")
OVERRIDE_KEYS = ("base_url", "idempotency_header", "name", "operations", "resources")


class OpenAPIError(ValueError):
    """A document or overrides file twice cannot make a service of (names what and where)."""


# -- reading the document --------------------------------------------------------------------


def _load(path: Path, what: str) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as ex:
        raise OpenAPIError(f"cannot read the {what} {str(path)!r}: {ex.strerror}") from None
    try:
        if path.suffix == ".toml":
            data: Any = tomllib.loads(text)
        elif path.suffix == ".json":
            data = json.loads(text)
        else:  # YAML is a superset of JSON: .yaml, .yml and anything else
            data = yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as ex:
        raise OpenAPIError(f"the {what} {str(path)!r} is not valid: {ex}") from None
    if not isinstance(data, dict):
        raise OpenAPIError(f"the {what} {str(path)!r} must hold a mapping at its top")
    return data


def _pointer(doc: dict[str, Any], ref: str) -> Any:
    if not ref.startswith("#/"):
        raise OpenAPIError(f"only local $refs are supported (#/...), got {ref!r}")
    node: Any = doc
    for part in ref[2:].split("/"):
        part = urllib.parse.unquote(part).replace("~1", "/").replace("~0", "~")
        try:
            node = node[part]
        except (KeyError, TypeError):
            raise OpenAPIError(f"$ref {ref!r} points at nothing in the document") from None
    return node


def _deref(doc: dict[str, Any], node: Any) -> Any:
    """``node`` with its own ``$ref`` followed (not its children's)."""
    seen = 0
    while isinstance(node, dict) and isinstance(node.get("$ref"), str):
        node = _pointer(doc, node["$ref"])
        seen += 1
        if seen > 64:
            raise OpenAPIError("a $ref cycle: a reference that only refers to itself")
    return node


def _to_json_schema(node: Any, nullable_keyword: bool) -> Any:
    """OpenAPI 3.0's schema dialect as JSON Schema: ``nullable`` becomes a null branch.
    3.1's schemas are JSON Schema already (``nullable_keyword`` False leaves them be)."""
    if isinstance(node, list):
        return [_to_json_schema(n, nullable_keyword) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _to_json_schema(v, nullable_keyword) for k, v in node.items()}
    if nullable_keyword and out.pop("nullable", False) is True:
        if "enum" in out and None not in out["enum"]:
            out["enum"] = [*out["enum"], None]
        return {"anyOf": [out, {"type": "null"}]}
    return out


# -- the plan --------------------------------------------------------------------------------


@dataclass
class Operation:
    """One (method, path) of the document as the service serves it."""

    method: str
    path: str
    name: str
    """The route and effect name: ``<service>.<resource>.<verb>`` or an overridden name."""
    resource: str
    verb: str
    mutating: bool
    regex: str
    path_params: list[str]
    """Names of the path's parameters, in the order of the regex groups ``p0``, ``p1``..."""
    item_param: str | None
    """The path parameter naming the object acted on (None on a collection)."""
    spec: dict[str, Any]
    operation_id: str | None = None
    action: str | None = None
    tool: str | None = None
    """The tool name an overrides file gives it (None: from the operationId)."""


@dataclass
class Resource:
    """The objects one collection of the API holds."""

    name: str
    state_key: str
    id_field: str = "id"
    prefix: str = ""
    schema: Any = None
    id_pattern: str | None = None


@dataclass
class Plan:
    """A document read and inferred: what the generated service class is made of."""

    name: str
    title: str
    base_url: str
    key_header: str
    doc: dict[str, Any]
    operations: list[Operation]
    resources: dict[str, Resource]
    error_schema: Any = None
    json_root: dict[str, Any] = field(default_factory=dict)
    draft: type[Any] = jsonschema.Draft4Validator
    nullable_keyword: bool = True
    """OpenAPI 3.0's ``nullable`` (3.1 writes ``type: [..., "null"]``)."""


def _singular(word: str) -> str:
    w = word.lower()
    for plural, single in (("ies", "y"), ("sses", "ss"), ("xes", "x"), ("ches", "ch")):
        if w.endswith(plural):
            return w[: -len(plural)] + single
    if w.endswith("s") and not w.endswith("ss"):
        return w[:-1]
    return w


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")


def _segments(path: str) -> list[tuple[str, str, str]]:
    """``(kind, name, suffix)`` per segment: kind ``lit`` or ``param``."""
    out = []
    for seg in path.strip("/").split("/"):
        m = _PARAM.match(seg)
        if m:
            out.append(("param", m.group(1), m.group(2)))
        else:
            stem, dot, ext = seg.partition(".")
            out.append(("lit", stem if dot and ext.isalpha() else seg, "." + ext if dot else ""))
    return out


def _regex(path: str) -> tuple[str, list[str]]:
    names: list[str] = []
    parts = []
    for seg in path.strip("/").split("/"):
        out = ""
        for piece in re.split(r"(\{[^}]+\})", seg):
            if piece.startswith("{") and piece.endswith("}"):
                out += f"(?P<p{len(names)}>[^/?]+?)"
                names.append(piece[1:-1])
            else:
                out += re.escape(piece)
        parts.append(out)
    return "/" + "/".join(parts), names


def _infer(method: str, path: str) -> tuple[str, str, str | None, str | None]:
    """(resource, verb, item parameter, action) the usual REST way."""
    segs = _segments(path)
    if not segs or segs == [("lit", "", "")]:
        return "root", "read" if method == "GET" else "action", None, None
    last = segs[-1]
    if last[0] == "param":
        lits = [s for s in segs[:-1] if s[0] == "lit"]
        resource = _singular(lits[-1][1]) if lits else "item"
        verb = {"GET": "get", "DELETE": "delete"}.get(method, "update")
        return resource, verb, last[1], None
    name = last[1]
    parent_is_item = len(segs) >= 2 and segs[-2][0] == "param"
    if method == "POST" and parent_is_item and not name.lower().endswith("s"):
        # /v1/charges/{charge}/refund: an action on the item
        lits = [s for s in segs[:-2] if s[0] == "lit"]
        resource = _singular(lits[-1][1]) if lits else "item"
        return resource, _slug(name) or "action", segs[-2][1], _slug(name)
    verb = {"GET": "list", "POST": "create", "DELETE": "delete", "PUT": "update"}.get(
        method, "update"
    )
    return _singular(name), verb, None, None


def _json_body_schema(op: dict[str, Any], doc: dict[str, Any]) -> tuple[str | None, Any]:
    body = _deref(doc, op.get("requestBody"))
    if not isinstance(body, dict):
        return None, None
    content = body.get("content") or {}
    for media in ("application/json", FORM_TYPE, "multipart/form-data"):
        for declared, spec in content.items():
            if declared.split(";")[0].strip() == media:
                return media, (spec or {}).get("schema")
    for declared, spec in content.items():
        if "json" in declared:
            return "application/json", (spec or {}).get("schema")
    return None, None


def _success_schema(op: dict[str, Any], doc: dict[str, Any]) -> tuple[int, Any]:
    responses = op.get("responses") or {}
    for code in sorted(str(c) for c in responses):
        if code.startswith("2") and code.isdigit():
            resp = _deref(doc, responses[code]) or {}
            for media, spec in (resp.get("content") or {}).items():
                if "json" in media:
                    return int(code), (spec or {}).get("schema")
            return int(code), None
    return 200, None


def _error_schema(doc: dict[str, Any]) -> Any:
    """The schema of the API's errors: the first JSON schema of a 4xx or default response."""
    for ops in (doc.get("paths") or {}).values():
        for method in _METHODS:
            op = (ops or {}).get(method)
            if not isinstance(op, dict):
                continue
            for code, resp in (op.get("responses") or {}).items():
                if str(code).startswith("4") or str(code) == "default":
                    content = (_deref(doc, resp) or {}).get("content") or {}
                    for media, spec in content.items():
                        if "json" in media and (spec or {}).get("schema"):
                            return spec["schema"]
    return None


def _key_header(doc: dict[str, Any]) -> str:
    for ops in (doc.get("paths") or {}).values():
        for method in _METHODS:
            op = (ops or {}).get(method)
            for p in (op or {}).get("parameters", []) if isinstance(op, dict) else []:
                p = _deref(doc, p)
                if p.get("in") == "header" and "idempotency" in str(p.get("name", "")).lower():
                    return str(p["name"])
    return KEY_HEADER


def read_plan(
    path: str | Path,
    name: str | None = None,
    overrides: str | Path | dict[str, Any] | None = None,
) -> Plan:
    """Read an OpenAPI document (and an overrides file) into the plan of a service.

    Raises:
        OpenAPIError: naming what in the document or the overrides twice cannot use.
    """
    path = Path(path)
    doc = _load(path, "OpenAPI document")
    version = str(doc.get("openapi", ""))
    if not re.match(r"^3\.[01]\.", version):
        raise OpenAPIError(
            f"{str(path)!r} is not an OpenAPI 3.0 or 3.1 document (openapi: {version or 'none'})"
            "; convert a Swagger 2.0 document first"
        )
    if isinstance(overrides, str | Path):
        fixes = _load(Path(overrides), "overrides file")
    else:
        fixes = dict(overrides or {})
    unknown = sorted(set(fixes) - set(OVERRIDE_KEYS))
    if unknown:
        raise OpenAPIError(
            f"unknown overrides key(s) {', '.join(map(repr, unknown))}; accepted: base_url, "
            "idempotency_header, name, operations, resources"
        )
    title = str((doc.get("info") or {}).get("title") or path.stem)
    service = name or fixes.get("name") or _slug(title.split()[0] if title.split() else "api")
    if not re.fullmatch(r"[a-z][a-z0-9_]*", service):
        raise OpenAPIError(
            f"service name {service!r}: use lowercase letters, digits and _ (it starts every "
            "effect name)"
        )
    servers = doc.get("servers") or [{}]
    prefix = urllib.parse.urlparse(str(servers[0].get("url", ""))).path.rstrip("/")
    base_url = str(fixes.get("base_url") or f"https://{service}.twice.test{prefix}")
    nullable = version.startswith("3.0")
    plan = Plan(
        name=service,
        title=title,
        base_url=base_url,
        key_header=str(fixes.get("idempotency_header") or _key_header(doc)),
        doc=doc,
        operations=[],
        resources={},
        json_root=_to_json_schema(doc, nullable),
        draft=jsonschema.Draft4Validator if nullable else jsonschema.Draft202012Validator,
        nullable_keyword=nullable,
    )
    plan.error_schema = _error_schema(doc)
    op_fixes: dict[str, Any] = dict(fixes.get("operations") or {})
    used_fixes: set[str] = set()
    names: dict[str, Operation] = {}
    for p, ops in (doc.get("paths") or {}).items():
        shared = list((ops or {}).get("parameters") or [])
        for method in _METHODS:
            spec = (ops or {}).get(method)
            if not isinstance(spec, dict):
                continue
            m = method.upper()
            resource, verb, item, action = _infer(m, p)
            op_id = spec.get("operationId")
            fix: dict[str, Any] = {}
            for key in (op_id, f"{m} {p}"):
                if key and key in op_fixes:
                    fix = dict(op_fixes[key])
                    used_fixes.add(key)
            resource = str(fix.get("resource", resource))
            verb = str(fix.get("verb", verb))
            regex, params = _regex(p)
            spec = {**spec, "parameters": shared + list(spec.get("parameters") or [])}
            mutating = bool(fix.get("mutating", m in MUTATING_METHODS))
            op = Operation(
                method=m,
                path=p,
                name=str(fix.get("name") or f"{service}.{resource}.{verb}"),
                resource=resource,
                verb=verb,
                mutating=mutating,
                regex=regex,
                path_params=params,
                item_param=item if verb not in ("create", "list") else None,
                spec=spec,
                operation_id=op_id,
                action=action,
                tool=str(fix["tool"]) if fix.get("tool") else None,
            )
            if op.name in names:
                # Two paths infer one name (a nested and a top-level route): the operationId
                # tells them apart, else the method and path.
                op.name = f"{service}.{_slug(op_id or f'{m} {p}')}"
            names[op.name] = op
            plan.operations.append(op)
    unused = sorted(set(op_fixes) - used_fixes)
    if unused:
        raise OpenAPIError(
            f"overrides name operation(s) the document does not have: {', '.join(unused)} "
            "(name an operationId or 'METHOD /path')"
        )
    res_fixes: dict[str, Any] = dict(fixes.get("resources") or {})
    for op in plan.operations:
        if op.resource in plan.resources:
            continue
        plural = next(
            (
                _slug(s[1])
                for o in plan.operations
                if o.resource == op.resource
                for s in reversed(_segments(o.path))
                if s[0] == "lit" and _singular(s[1]) == op.resource
            ),
            op.resource + "s",
        )
        plan.resources[op.resource] = Resource(name=op.resource, state_key=plural)
    for rname, fix in res_fixes.items():
        if rname not in plan.resources:
            raise OpenAPIError(
                f"overrides name resource {rname!r}, which no operation has; resources: "
                + ", ".join(sorted(plan.resources))
            )
        res = plan.resources[rname]
        res.id_field = str(fix.get("id_field", res.id_field))
        res.prefix = str(fix.get("prefix", res.prefix))
        res.state_key = str(fix.get("state_key", res.state_key))
    for res in plan.resources.values():
        _fill_resource(plan, res, res_fixes.get(res.name, {}))
    keys = [r.state_key for r in plan.resources.values()]
    if len(set(keys)) != len(keys) or "base_url" in keys:
        raise OpenAPIError(f"resources share a state key: {keys}; set state_key in overrides")
    return plan


def _fill_resource(plan: Plan, res: Resource, fix: dict[str, Any]) -> None:
    """The resource's object schema, id field and id prefix, from its operations."""
    for op in plan.operations:
        if op.resource != res.name or op.verb not in ("create", "get", "update"):
            continue
        _, schema = _success_schema(op.spec, plan.doc)
        if schema is not None:
            res.schema = schema
            break
    props = _properties(plan, res.schema)
    if "id_field" not in fix:
        candidates = [*_ID_NAMES, f"{res.name}_id", f"{res.name}Id"]
        res.id_field = next((c for c in candidates if c in props), "id")
    id_schema = _deref(plan.doc, props.get(res.id_field)) or {}
    res.id_pattern = id_schema.get("pattern") if isinstance(id_schema, dict) else None
    if not res.prefix:
        example = str(id_schema.get("example", "")) if isinstance(id_schema, dict) else ""
        from_pattern = id_prefix(res.id_pattern) if res.id_pattern else None
        if from_pattern:
            res.prefix = from_pattern
        elif "_" in example:
            res.prefix = example.split("_")[0]
        else:
            res.prefix = res.name


def _properties(plan: Plan, schema: Any) -> dict[str, Any]:
    """Properties of an object schema (allOf merged; the first object branch of anyOf)."""
    schema = _deref(plan.doc, schema)
    if not isinstance(schema, dict):
        return {}
    props = dict(schema.get("properties") or {})
    for sub in schema.get("allOf") or []:
        props.update(_properties(plan, sub))
    if not props:
        for sub in (schema.get("anyOf") or []) + (schema.get("oneOf") or []):
            found = _properties(plan, sub)
            if found:
                return found
    return props


def _from_pattern(pattern: str, n: int) -> str | None:
    """A string matching ``pattern`` made from ``n``, for the usual shapes of id patterns:
    ``^LITERAL[class]{k}$`` (``^SM[0-9a-fA-F]{32}$``) and a literal prefix (``^/v1/refunds``).
    None for any other pattern. A leading alternation (``^(SM|MM)...``) takes its first."""
    pattern = _first_alternative(pattern)
    m = re.fullmatch(r"\^?([A-Za-z0-9_\-]*)\[([^\]]+)\]\{(\d+)\}\$?", pattern)
    if m:
        lit, cls, width = m.group(1), m.group(2), int(m.group(3))
        if "a-f" in cls or "A-F" in cls:
            digits = format(n, "x").rjust(width, "0")
        elif "0-9" in cls:
            digits = str(n).rjust(width, "0")
        else:
            return None
        return lit + digits if len(digits) == width else None
    m = re.fullmatch(r"\^((?:[A-Za-z0-9_/\-]|\\.)+)(\$?)", pattern)
    if m:
        return re.sub(r"\\(.)", r"\1", m.group(1))
    return None


def _first_alternative(pattern: str) -> str:
    return re.sub(r"^(\^?)\(([A-Za-z0-9_\-]+)(\|[A-Za-z0-9_\-]+)+\)", r"\1\2", pattern)


def id_prefix(pattern: str) -> str | None:
    """The literal an id pattern starts with (``^(SM|MM)[0-9a-f]{32}$`` → ``SM``), when
    :func:`_from_pattern` can make ids of it."""
    if _from_pattern(pattern, 1) is None:
        return None
    m = re.match(r"^\^?([A-Za-z0-9_\-]+)\[", _first_alternative(pattern))
    return m.group(1) if m else None
