"""The parts of a task made from an OpenAPI document: its generated service, a dataset (a
file, or one sample with no starting state), no tools of twice's own (the agent under test
brings its own client, pointed at the service's URL)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from inspect_ai.dataset import MemoryDataset, Sample
from twice.mocks import Service, openapi_service, services_from_state

from ._dataset import load_dataset
from ._trial import TaskParts


def openapi_parts(
    name: str,
    path: str | Path,
    dataset: str | Path | None = None,
    overrides: str | Path | None = None,
) -> TaskParts:
    """A task's parts from an OpenAPI document, its service named ``name``.

    Args:
        name: The service's (and the task's) name.
        path: The OpenAPI 3.0/3.1 document (JSON or YAML).
        dataset: A JSONL dataset (state, intents, plan per sample); None: one sample
            ``<name>-1`` starting with no objects.
        overrides: A YAML/TOML overrides file for what inference gets wrong.

    Raises:
        ValueError: for a document, overrides or dataset twice cannot use (naming it).
    """
    kind = openapi_service(path, name=name, overrides=overrides)

    def services(state: dict[str, Any]) -> list[Service]:
        return services_from_state(state, kind)

    if dataset is not None:
        data = load_dataset(Path(dataset), name)
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
    kinds = {r.name for r in kind().routes()}
    for sample in data:
        meta = sample.metadata or {}
        services(meta.get("state", {}))  # a misspelt key fails here
        for intent in meta.get("intents", []):
            if intent["effect"] not in kinds:
                raise ValueError(
                    f"sample {sample.id!r}: intent effect {intent['effect']!r} is not one the "
                    f"{name} service makes; its effects: {', '.join(sorted(kinds))}"
                )
    return TaskParts(name, data, services, lambda ctx: [], None)
