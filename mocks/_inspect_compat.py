"""The one place ``twice.mocks`` uses inspect_ai's private names.

Each is imported here and nowhere else, and ``tests/test_inspect_compat.py`` checks it, so an
inspect release that moves one fails that test by name instead of changing behaviour quietly.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

sample_state: Callable[[], Any] | None
try:  # the running sample's TaskState, by which a stub finds its trial
    from inspect_ai.solver._task_state import sample_state
except ImportError:  # pragma: no cover - a later inspect; the setup uses the store instead
    sample_state = None

TOOL_RESULT_REMOVED: str
try:  # what inspect's edit compaction (CompactionEdit) puts in place of a tool result
    from inspect_ai.model._compaction.edit import TOOL_RESULT_REMOVED
except ImportError:  # pragma: no cover - a later inspect; the text it wrote in 0.3.285
    TOOL_RESULT_REMOVED = "(Tool result removed)"
