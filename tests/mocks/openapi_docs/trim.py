"""Keep some paths of an OpenAPI document and every component they reference, unchanged.

python trim.py FULL.json OUT.json PATH...
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def refs(node: Any, out: set[str]) -> None:
    """Add every local ``$ref`` under ``node`` to ``out``."""
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/"):
            out.add(ref)
        for value in node.values():
            refs(value, out)
    elif isinstance(node, list):
        for value in node:
            refs(value, out)


def trim(doc: dict[str, Any], keep: set[str]) -> dict[str, Any]:
    """``doc`` with only the paths in ``keep`` and the components they reach."""
    paths = {p: v for p, v in doc["paths"].items() if p in keep}
    seen: set[str] = set()
    todo: set[str] = set()
    refs(paths, todo)
    while todo:
        ref = todo.pop()
        if ref in seen:
            continue
        seen.add(ref)
        node = doc
        for part in ref[2:].split("/"):
            node = node[part.replace("~1", "/").replace("~0", "~")]
        refs(node, todo)
    comps: dict[str, dict[str, Any]] = {}
    for ref in seen:
        _, kind, name = ref[2:].split("/")
        comps.setdefault(kind, {})[name] = doc["components"][kind][name]
    if "securitySchemes" in doc.get("components", {}):
        comps["securitySchemes"] = doc["components"]["securitySchemes"]
    out = {k: v for k, v in doc.items() if k not in ("paths", "components")}
    out["paths"] = paths
    out["components"] = {k: dict(sorted(v.items())) for k, v in sorted(comps.items())}
    return out


if __name__ == "__main__":
    src, dst, *kept = sys.argv[1:]
    trimmed = trim(json.loads(Path(src).read_text()), set(kept))
    Path(dst).write_text(json.dumps(trimmed, indent=1))
