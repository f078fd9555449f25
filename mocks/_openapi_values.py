"""Values from an OpenAPI document's schemas: request values typed as the schema says (form
bodies with bracket keys included), replies built from given fields and valid against the
schema, and id strings that match an id pattern."""

from __future__ import annotations

import copy
import json
import re
import urllib.parse
from typing import Any

from ._openapi_plan import Plan, _deref, _from_pattern, _properties, _to_json_schema


def _norm(name: str) -> str:
    return re.sub(r"[_\-\s]", "", name.lower())


_MAX_DEPTH = 12


class Builder:
    """Values valid against the document's schemas, from given fields and the schema."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self._validators: dict[str, Any] = {}

    def validator(self, schema: Any) -> Any:
        key = json.dumps(schema, sort_keys=True, default=str)
        v = self._validators.get(key)
        if v is None:
            root = dict(self.plan.json_root)
            root["x-twice-schema"] = _to_json_schema(schema, self.plan.nullable_keyword)
            v = self.plan.draft(
                {**root, "$ref": "#/x-twice-schema"},
                format_checker=None,
            )
            self._validators[key] = v
        return v

    def valid(self, schema: Any, value: Any) -> bool:
        return schema is None or bool(self.validator(schema).is_valid(value))

    def errors(self, schema: Any, value: Any) -> list[str]:
        if schema is None:
            return []
        found = sorted(self.validator(schema).iter_errors(value), key=lambda e: list(e.path))
        out = []
        for e in found[:3]:
            where = "/".join(str(p) for p in e.absolute_path)
            msg = e.message if len(e.message) < 200 else e.message[:200] + "..."
            out.append(f"{where}: {msg}" if where else msg)
        return out

    def _nullable(self, schema: dict[str, Any]) -> bool:
        t = schema.get("type")
        return schema.get("nullable") is True or (isinstance(t, list) and "null" in t)

    def build(self, schema: Any, hints: dict[str, Any], depth: int = 0) -> Any:
        """A value for ``schema``: ``hints`` fill properties by (normalised) name, required
        properties get their default, example, first enum value or a minimal value."""
        schema = _deref(self.plan.doc, schema)
        if not isinstance(schema, dict) or depth > _MAX_DEPTH:
            return None
        if "default" in schema and self.valid(schema, schema["default"]):
            return copy.deepcopy(schema["default"])
        if schema.get("enum"):
            return schema["enum"][0]
        if "const" in schema:
            return schema["const"]
        branches = schema.get("anyOf") or schema.get("oneOf")
        if branches:
            options = [
                b for b in branches if (_deref(self.plan.doc, b) or {}).get("type") != "null"
            ]
            for b in options + list(branches):
                value = self.build(b, hints, depth + 1)
                if self.valid(b, value):
                    return value
            return None
        t = schema.get("type")
        if isinstance(t, list):
            t = next((x for x in t if x != "null"), None)
        if t is None and ("properties" in schema or "allOf" in schema):
            t = "object"
        if t == "object":
            return self._object(schema, hints, depth)
        if t == "array":
            return []
        if "example" in schema and self.valid(schema, schema["example"]):
            return copy.deepcopy(schema["example"])
        if self._nullable(schema) and t != "string":
            return None
        if t == "integer":
            return max(int(schema.get("minimum", 0)), 0) if "minimum" in schema else 0
        if t == "number":
            return float(schema.get("minimum", 0))
        if t == "boolean":
            return False
        if t == "string":
            if schema.get("pattern"):
                made = _from_pattern(schema["pattern"], 1)
                if made is not None:
                    return made
                if self._nullable(schema):
                    return None
            fmt = schema.get("format")
            if fmt == "date-time":
                return "2026-01-01T00:00:00Z"
            if fmt == "date":
                return "2026-01-01"
            if fmt in ("uri", "url"):
                return "https://example.com/"
            if fmt == "email":
                return "user@example.com"
            if fmt == "uuid":
                return "00000000-0000-4000-8000-000000000001"
            return "x" * int(schema.get("minLength", 0))
        return None

    def _object(self, schema: dict[str, Any], hints: dict[str, Any], depth: int) -> Any:
        props = _properties(self.plan, schema)
        required: set[str] = set(schema.get("required") or [])
        for sub in schema.get("allOf") or []:
            required |= set((_deref(self.plan.doc, sub) or {}).get("required") or [])
        by_norm = {_norm(k): v for k, v in hints.items()}
        out: dict[str, Any] = {}
        for name, sub in props.items():
            sub_schema = _deref(self.plan.doc, sub)
            hint_key = _norm(name)
            if hint_key in by_norm:
                value = self.coerce(sub_schema, by_norm[hint_key])
                if self.valid(sub, value):
                    out[name] = value
                    continue
            if name in required:
                out[name] = self.build(sub, hints, depth + 1)
        return out

    def coerce(self, schema: Any, value: Any) -> Any:
        """A form value (text, or nested mappings of text) as the type the schema wants."""
        schema = _deref(self.plan.doc, schema)
        if not isinstance(schema, dict):
            return value
        branches = schema.get("anyOf") or schema.get("oneOf")
        if branches:
            for b in branches:
                c = self.coerce(b, value)
                if self.valid(b, c):
                    return c
            return value
        t = schema.get("type")
        types = t if isinstance(t, list) else [t]
        if isinstance(value, str):
            if value == "" and ("null" in types or schema.get("nullable")):
                return None
            for kind in types:
                try:
                    if kind == "integer" and re.fullmatch(r"-?\d+", value):
                        return int(value)
                    if kind == "number":
                        return float(value) if "." in value else int(value)
                    if kind == "boolean" and value in ("true", "false"):
                        return value == "true"
                except ValueError:
                    continue
            return value
        if isinstance(value, dict):
            if "array" in types and all(k.isdigit() or k == "" for k in value):
                value = [value[k] for k in sorted(value, key=lambda k: int(k or 0))]
            else:
                props = _properties(self.plan, schema)
                extra = schema.get("additionalProperties")
                return {
                    k: self.coerce(props.get(k, extra if isinstance(extra, dict) else None), v)
                    for k, v in value.items()
                }
        if isinstance(value, list):
            return [self.coerce(schema.get("items"), v) for v in value]
        return value


def parse_form(text: str) -> dict[str, Any]:
    """A form body with bracket keys (``metadata[k]=v``, ``expand[]=a``, ``items[0][x]=1``),
    as the Stripe SDKs send, into nested mappings (lists are mappings of indices here)."""
    out: dict[str, Any] = {}
    for key, value in urllib.parse.parse_qsl(text, keep_blank_values=True):
        parts = re.findall(r"\[([^\]]*)\]", key)
        head = key.split("[", 1)[0] if parts else key
        node = out
        path = [head, *parts]
        for i, part in enumerate(path[:-1]):
            nxt = node.get(part)
            if not isinstance(nxt, dict):
                nxt = {}
                node[part] = nxt
            node = nxt
            if path[i + 1] == "":
                path[i + 1] = str(len(node))
        node[path[-1]] = value
    return out
