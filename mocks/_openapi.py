"""A :class:`Service` made from an OpenAPI 3.0 or 3.1 document, with no Python of the user's.

The document is read once into a plan (``_openapi_plan``). The plan becomes a Service subclass
whose routes validate each request against the document (jsonschema), keep objects per
resource, commit an effect per mutating operation, and answer with a body built from the
response schema (valid against it, ``_openapi_values``). Faults, protections, the
idempotency-key rules and the ledger are the base class's, as for every built-in service.
"""

from __future__ import annotations

import inspect
import json
import re
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import httpx

from ._openapi_plan import (
    MUTATING_METHODS,
    Operation,
    Plan,
    Resource,
    _deref,
    _from_pattern,
    _json_body_schema,
    _properties,
    _success_schema,
    read_plan,
)
from ._openapi_values import Builder, _norm, parse_form
from ._service import Call, Route, Service
from ._wire import FORM_TYPE

# -- the service -----------------------------------------------------------------------------


class OpenAPIService(Service):
    """Base of every service made by :func:`openapi_service` (its class attributes hold the
    plan). Objects live per resource on the instance: one instance per trial."""

    plan: ClassVar[Plan]
    builder: ClassVar[Builder]
    # Every mutating operation keeps keys, whatever its method: a document's PUT, PATCH or
    # DELETE commits an effect as its POST does, and a retried one commits another.
    keyed_methods: ClassVar[frozenset[str]] = frozenset(MUTATING_METHODS)

    def __init__(self, base_url: str | None = None, **state: list[dict[str, Any]]) -> None:
        super().__init__(base_url)
        self.objects: dict[str, dict[str, dict[str, Any]]] = {r: {} for r in self.plan.resources}
        by_key = {r.state_key: r for r in self.plan.resources.values()}
        for key, rows in state.items():
            if key not in by_key:
                raise ValueError(
                    f"unknown state key {key!r} for the {self.plan.name} service; accepted: "
                    + ", ".join(sorted(by_key))
                )
            res = by_key[key]
            for row in rows or []:
                if res.id_field not in row:
                    raise ValueError(
                        f"state {key!r}: every object needs its id field {res.id_field!r}, "
                        f"got {sorted(row)}"
                    )
                obj = self.builder.build(res.schema, row) if res.schema is not None else {}
                self.objects[res.name][str(row[res.id_field])] = {**obj, **row}

    def next_id(self, prefix: str) -> str:
        n = self._counters.get(prefix, 0) + 1
        self._counters[prefix] = n
        for res in self.plan.resources.values():
            if res.prefix == prefix and res.id_pattern:
                made = _from_pattern(res.id_pattern, n)
                if made is not None:
                    return made
        return f"{prefix}_{n}"

    def error_response(
        self, status: int, message: str, type: str = "invalid_request_error"
    ) -> httpx.Response:
        schema = self.plan.error_schema
        if schema is None:
            return super().error_response(status, message, type)
        hints = {
            "message": message,
            "detail": message,
            "type": type,
            "errortype": "validation" if status < 500 else "internal",
            "status": status,
            "code": status,
            "errorcode": str(status),
        }
        body = self.builder.build(schema, hints)
        if not isinstance(body, dict) or not self.builder.valid(schema, body):
            return super().error_response(status, message, type)
        return httpx.Response(status, json=body)

    def routes(self) -> list[Route]:
        # Literal paths first: /v1/refunds/search must not be read as /v1/refunds/{id}.
        ordered = sorted(self.plan.operations, key=lambda o: o.regex.count("(?P<"))
        return [
            Route(o.method, o.regex, o.name, self._handler(o), mutating=o.mutating) for o in ordered
        ]

    def _handler(self, op: Operation) -> Callable[[Call], httpx.Response]:
        def handle(call: Call) -> httpx.Response:
            return self._serve(op, call)

        return handle

    # -- one request

    def _request(
        self, op: Operation, call: Call
    ) -> tuple[dict[str, Any], dict[str, Any], str | None]:
        """(parameters by name, body) as the document types them, or why the request is bad."""
        request = call.request
        doc = self.plan.doc
        b = self.builder
        path_values = {
            op.path_params[int(k[1:])]: urllib.parse.unquote(v)
            for k, v in call.params.items()
            if re.fullmatch(r"p\d+", k) and int(k[1:]) < len(op.path_params)
        }
        query = parse_form(request.url.query.decode("ascii", "replace"))
        params: dict[str, Any] = {}
        for raw in op.spec.get("parameters") or []:
            p = _deref(doc, raw)
            where, pname = p.get("in"), str(p.get("name"))
            if where == "path":
                value: Any = path_values.get(pname)
            elif where == "query":
                value = query.get(pname)
            elif where == "header":
                value = request.headers.get(pname)
            else:
                continue
            if value is None:
                if p.get("required"):
                    return {}, {}, f"Missing required {where} parameter: {pname}"
                continue
            schema = p.get("schema")
            value = b.coerce(schema, value)
            problems = b.errors(schema, value)
            if problems:
                return {}, {}, f"Invalid {where} parameter {pname}: {problems[0]}"
            params[pname] = value
        _media, schema = _json_body_schema(op.spec, doc)
        body: Any = {}
        ctype = request.headers.get("content-type", "")
        if request.content:
            if ctype.startswith(FORM_TYPE):
                body = b.coerce(schema, parse_form(request.content.decode("utf-8", "replace")))
            else:
                try:
                    body = json.loads(request.content)
                except ValueError:
                    return {}, {}, "the request body is not JSON"
        required_body = bool((_deref(doc, op.spec.get("requestBody")) or {}).get("required"))
        if schema is not None and (request.content or required_body):
            problems = b.errors(schema, body)
            if problems:
                return {}, {}, "Invalid request body: " + "; ".join(problems)
        if not isinstance(body, dict):
            body = {"body": body}
        return params, body, None

    def _serve(self, op: Operation, call: Call) -> httpx.Response:
        params, body, problem = self._request(op, call)
        if problem is not None:
            return self.error_response(400, problem)
        res = self.plan.resources[op.resource]
        store = self.objects[op.resource]
        status, schema = _success_schema(op.spec, self.plan.doc)
        path_fields = {k: v for k, v in params.items() if k != op.item_param}
        # The path's own parameters (a parent's id: Twilio's AccountSid) are the request's too.
        fields = {**{k: v for k, v in path_fields.items() if k in op.path_params}, **body}
        if op.verb == "list":
            return self._list(op, res, store, params, status, schema)
        target = None
        if op.item_param is not None:
            oid = str(params.get(op.item_param, ""))
            target = store.get(oid)
            if target is None:
                return self.error_response(404, f"No such {res.name}: {oid!r}", "not_found")
        if not op.mutating:
            obj = target if target is not None else {}
            return self._reply(status, schema, obj)
        if op.verb == "create":
            effect = call.commit(op.name, res.prefix, fields)
            obj = self._made(schema, {**fields, res.id_field: effect.id})
            obj[res.id_field] = effect.id
            store[effect.id] = obj
            return self._reply(status, schema, obj)
        oid = str(params.get(op.item_param, "")) if op.item_param else ""
        identity = {res.id_field: oid} if oid else {}
        effect = call.commit(op.name, res.prefix, {**identity, **fields})
        if op.verb == "delete":
            store.pop(oid, None)
            return self._reply(status, schema, {**(target or {}), "deleted": True})
        merged = {**(target or {}), **body}
        if op.verb == "update":
            obj = self._made(res.schema, merged) if res.schema is not None else merged
            obj[res.id_field] = oid
            store[oid] = {**(target or {}), **obj}
            return self._reply(status, schema, store[oid])
        # an action: its reply is the object acted on (updated) or the action's own record
        made = self._made(schema, {**merged, "id": effect.id})
        if (
            res.schema is not None
            and schema is not None
            and _deref(self.plan.doc, schema) is _deref(self.plan.doc, res.schema)
        ):
            store[oid] = {**(target or {}), **made}
        return self._reply(status, schema, made)

    def _made(self, schema: Any, hints: dict[str, Any]) -> dict[str, Any]:
        value = self.builder.build(schema, hints) if schema is not None else dict(hints)
        return value if isinstance(value, dict) else dict(hints)

    def _reply(self, status: int, schema: Any, obj: Any) -> httpx.Response:
        if status == 204 or schema is None:
            return httpx.Response(status) if status == 204 else httpx.Response(status, json=obj)
        if not self.builder.valid(schema, obj):
            obj = self.builder.build(schema, obj if isinstance(obj, dict) else {})
        return httpx.Response(status, json=obj)

    def _list(
        self,
        op: Operation,
        res: Resource,
        store: dict[str, dict[str, Any]],
        params: dict[str, Any],
        status: int,
        schema: Any,
    ) -> httpx.Response:
        props = _properties(self.plan, res.schema)
        by_norm = {_norm(k): k for k in props}
        wanted = {
            by_norm[_norm(k)]: v
            for k, v in params.items()
            if _norm(k) in by_norm and not isinstance(v, dict | list)
        }
        rows = [
            o
            for o in store.values()
            if all(str(o.get(k)) == str(v) or _id_of(o.get(k)) == str(v) for k, v in wanted.items())
        ]
        if schema is None:
            return httpx.Response(status, json=rows)
        s = _deref(self.plan.doc, schema)
        if isinstance(s, dict) and s.get("type") == "array":
            return httpx.Response(status, json=rows)
        body = self.builder.build(schema, {})
        if not isinstance(body, dict):
            return httpx.Response(status, json=body)
        for name, sub in _properties(self.plan, schema).items():
            if (_deref(self.plan.doc, sub) or {}).get("type") == "array":
                body[name] = rows
                break
        for name in ("has_more",):
            if name in body:
                body[name] = False
        if not self.builder.valid(schema, body):
            body = self.builder.build(schema, {})
        return httpx.Response(status, json=body)


def _id_of(value: Any) -> str | None:
    if isinstance(value, dict):
        return str(value.get("id"))
    return None


_SECRET_HEADER = re.compile(r"authorization|cookie|token|secret|api[-_]?key", re.IGNORECASE)


def _read_headers(plan: Plan) -> frozenset[str]:
    """The key header and the header parameters the document declares, less credentials."""
    names = {plan.key_header.lower()}
    for op in plan.operations:
        for raw in op.spec.get("parameters") or []:
            p = _deref(plan.doc, raw)
            if isinstance(p, dict) and p.get("in") == "header":
                names.add(str(p.get("name", "")).lower())
    return frozenset(n for n in names if n and not _SECRET_HEADER.search(n))


def openapi_service(
    path: str | Path,
    name: str | None = None,
    overrides: str | Path | dict[str, Any] | None = None,
) -> type[OpenAPIService]:
    """A Service class made from an OpenAPI 3.0 or 3.1 document (JSON or YAML).

    Each mutating operation is an effect kind ``<name>.<resource>.<verb>`` (``stripe.refund
    .create``); the class takes each resource's starting objects as a constructor argument
    named after its collection (``refunds=[...]``), so ``services_from_state(state, cls)``
    builds it from a sample's ``state``.

    Args:
        path: The document.
        name: The service's name (default: the overrides' ``name``, else the first word of the
            document's title).
        overrides: A YAML/TOML file (or its mapping) fixing what inference gets wrong:
            ``name``, ``base_url``, ``idempotency_header``, ``resources.<resource>`` (``id_field``,
            ``prefix``, ``state_key``) and ``operations.<operationId or "METHOD /path">``
            (``name``, ``resource``, ``verb``, ``mutating``, ``tool``).

    Raises:
        OpenAPIError: naming what in the document or the overrides cannot be used.
    """
    plan = read_plan(path, name, overrides)
    builder = Builder(plan)
    # The constructor's signature names the state keys: services_from_state reads it to give
    # each key to the service that takes it.
    params = [inspect.Parameter("base_url", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None)]
    params += [
        inspect.Parameter(k, inspect.Parameter.KEYWORD_ONLY, default=None)
        for k in (r.state_key for r in plan.resources.values())
    ]
    cls_name = "".join(w.capitalize() for w in plan.name.split("_")) + "Service"
    cls = type(
        cls_name,
        (OpenAPIService,),
        {
            "name": plan.name,
            "api_name": f"{plan.title} API" if "api" not in plan.title.lower() else plan.title,
            "default_base_url": plan.base_url,
            "key_header": plan.key_header,
            "read_headers": _read_headers(plan),
            "plan": plan,
            "builder": builder,
            "__signature__": inspect.Signature(params),
            "__module__": __name__,
        },
    )
    return cls
