"""The tool layer shared by every task, in one import for the task files.

It is layered the way a reader follows a call (each module one job):

* ``_declare`` -- what a tool declares: its idempotency class, its undo (:class:`Compensation`)
  and the call being executed;
* ``_make_tool`` -- :func:`make_tool`, an async function made into an inspect tool bound to a
  trial, and :func:`bind_tools`, the stand-ins inspect holds for a trial's tools;
* ``_context`` -- :class:`TrialContext`, a trial's state, and :class:`ServiceAPI`, the
  per-service handle tools call through (``ctx.api("payments")``);
* ``_send`` -- the send path: :func:`mutate` (open the call, consult the action log, send with
  retries, settle) and :func:`read`; :class:`Mutation` composes the sentence the agent is told;
* ``_action_log`` -- the durable :class:`ActionLog` a restarted run is saved by.
"""

from ._action_log import ACTION_LOG_STORE_KEY, COMPENSATIONS_STORE_KEY, ActionLog, ActionRecord
from ._context import ServiceAPI, TrialContext
from ._declare import IDEMPOTENCY_CLASSES, Compensation, IdempotencyClass, ToolSpec, Undo
from ._make_tool import bind_tools, make_tool
from ._send import Mutation, Problem, RunCrashed, mutate, read

__all__ = [
    "ACTION_LOG_STORE_KEY",
    "COMPENSATIONS_STORE_KEY",
    "IDEMPOTENCY_CLASSES",
    "ActionLog",
    "ActionRecord",
    "Compensation",
    "IdempotencyClass",
    "Mutation",
    "Problem",
    "RunCrashed",
    "ServiceAPI",
    "ToolSpec",
    "TrialContext",
    "Undo",
    "bind_tools",
    "make_tool",
    "mutate",
    "read",
]
