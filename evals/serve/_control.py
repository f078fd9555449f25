"""The control API under ``/_twice/trials``: make, list, read, score and delete trials.

``POST /_twice/trials`` → ``201 {"id", "urls"}``; ``GET /_twice/trials`` → ``{"trials"}``;
``GET /_twice/trials/<id>``, ``.../ledger``, ``.../verdict``; ``DELETE /_twice/trials/<id>``.
With a token, every call needs ``Authorization: Bearer <token>`` (401 otherwise).
"""

from __future__ import annotations

import hmac
import json
import re
from typing import Any

from ._asgi import MAX_CONTROL_BODY, body_within, send_json
from ._config import parse_trial_config
from ._errors import ControlError
from ._guard import require_json
from ._registry import TrialRegistry

_CONTROL_PATH = re.compile(r"^/_twice/trials(?:/(?P<id>[^/]+)(?:/(?P<what>ledger|verdict))?)?/?$")


def authorize(scope: dict[str, Any], token: str | None) -> None:
    """Check the request's bearer token (none needed when ``token`` is None).

    Raises:
        ControlError: 401 for a missing or wrong token.
    """
    if token is None:
        return
    given = dict(scope["headers"]).get(b"authorization", b"").decode("latin-1").strip()
    scheme, _, credentials = given.partition(" ")
    # The scheme is case-insensitive (RFC 9110 11.1); the token is compared in constant time.
    if scheme.lower() != "bearer" or not hmac.compare_digest(
        credentials.strip().encode(), token.encode()
    ):
        raise ControlError(401, "the control API needs 'Authorization: Bearer <token>'")


async def control(
    registry: TrialRegistry, token: str | None, scope: dict[str, Any], receive: Any, send: Any
) -> None:
    """Answer one control API request.

    Raises:
        ControlError: for an unknown path or trial, a missing token, a method a path does
            not allow, or a bad body (which the caller sends as the error reply).
    """
    match = _CONTROL_PATH.match(scope["path"])
    if match is None:
        raise ControlError(404, f"no such endpoint: {scope['path']}")
    authorize(scope, token)
    method = scope["method"]
    trial_id, what = match["id"], match["what"]
    if trial_id is None:
        await _trials(registry, method, scope, receive, send)
        return
    trial = registry.trials.get(trial_id)
    if trial is None:
        raise ControlError(404, f"no such trial: {trial_id!r}", "id")
    if what == "ledger" and method == "GET":
        await send_json(send, 200, trial.services.ledger.to_dict())
    elif what == "verdict" and method == "GET":
        await send_json(send, 200, trial.verdict())
    elif what is None and method == "GET":
        await send_json(send, 200, registry.describe(trial))
    elif what is None and method == "DELETE":
        await registry.delete_trial(trial)
        await send_json(send, 200, {"id": trial.id, "deleted": True})
    else:
        raise ControlError(405, f"{method} is not allowed on {scope['path']}")


async def _trials(
    registry: TrialRegistry, method: str, scope: dict[str, Any], receive: Any, send: Any
) -> None:
    """``/_twice/trials`` itself: POST makes a trial, GET lists them."""
    if method == "POST":
        require_json(scope)
        body = await body_within(scope, receive, MAX_CONTROL_BODY)
        try:
            data = json.loads(body or b"null")
        except (ValueError, RecursionError):  # nested past Python's stack
            raise ControlError(400, "the body is not JSON") from None
        config = parse_trial_config(
            data, registry.tasks, registry.hang_seconds, [u.name for u in registry.upstreams]
        )
        await send_json(send, 201, registry.create_trial(config))
        return
    if method == "GET":
        await send_json(
            send, 200, {"trials": [registry.describe(t) for t in registry.trials.values()]}
        )
        return
    raise ControlError(405, f"{method} is not allowed on /_twice/trials (POST, GET)")
