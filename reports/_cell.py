"""A cell: the (model, agent, prompt, task, fault, protection) all its trials share.

One type, one field order and one label for every place that names a cell: the run's
table, ``summary.json``, the report, the gate, JUnit and the shards. It lives here because
``reports`` imports nothing from the rest of twice and ``evals`` imports ``reports``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

DEFAULT_AGENT = "react"
"""twice's own agent loop; a log or summary entry that names no agent was run by it."""


@dataclass(frozen=True, kw_only=True)
class Cell:
    """One (model, agent, prompt, task, fault, protection): all its trials share these.

    Keyword-only, so no call site depends on the field order. ``prompt`` is the prompt as
    the suite names it (a built-in name or a file path) in a planned cell, and its name (the
    file stem) in a cell read from logs or ``summary.json``.
    """

    model: str
    agent: str = DEFAULT_AGENT
    """The agent under test (``react``: twice's own loop)."""
    prompt: str
    task: str
    fault: str
    protection: str

    @classmethod
    def from_mapping(cls, row: Mapping[str, Any]) -> Cell:
        """The cell of a mapping with the :data:`CELL` keys: a dict, a pandas row (a
        ``Series``) or a ``summary.json`` entry. A missing or empty ``agent`` is ``react``
        (logs and summaries written before agents existed).

        Raises:
            KeyError: naming the first cell key the mapping lacks.
        """
        agent = row.get("agent")
        values = {k: str(row[k]) for k in CELL if k != "agent"}
        # Missing from a frame, the value is NaN or pd.NA: anything but a name is no agent.
        name = agent if isinstance(agent, str) and agent else DEFAULT_AGENT
        return cls(agent=name, **values)

    @property
    def label(self) -> str:
        """``model / prompt / task / fault / protection``, with the agent after the model
        when it is not ``react`` (labels of twice's own loop name no agent)."""
        return " / ".join(
            v for k, v in self.as_dict().items() if not (k == "agent" and v == DEFAULT_AGENT)
        )

    def as_dict(self) -> dict[str, str]:
        """The cell's keys in :data:`CELL` order (a ``summary.json`` entry's first keys)."""
        return {k: getattr(self, k) for k in CELL}


CELL: tuple[str, ...] = tuple(f.name for f in fields(Cell))
"""The columns that identify a cell, in :class:`Cell`'s order. ``agent`` is the agent under
test (``react``: twice's own loop; logs written before agents existed read as ``react``)."""
