"""The Idempotency-Key store, following Stripe API v1 and the IETF Idempotency-Key draft.

* The first request with a key reserves it (in flight) before any work begins; check-then-act
  is atomic because reserving is a single dictionary operation under the services' lock.
* When the work ends, the status and body are saved and replayed to every later request with
  that key, a 5xx the service itself answered included (a gateway's error after the service
  finished is not the service's answer: its own saved response stays).
* A handler that raises releases the key when it committed nothing, and saves a 500 when it
  did, so a later request with the key never waits on a 409 for good.
* A later request with the same key and different parameters is rejected with 422.
* A request arriving while the first is still in flight gets 409 and is not saved.
* A request rejected before execution began (validation, rate limiting, an unavailable
  service) releases the key, so it can be retried.
* Keys over 255 characters, empty keys and keys that are not printable ASCII (the IETF
  draft's key is a structured-field string) are rejected with 400. Keys on GET and DELETE
  do nothing.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Literal

MAX_KEY_LENGTH = 255


@dataclass
class SavedRequest:
    """What the store holds for one key."""

    fingerprint: str
    state: Literal["in_flight", "done"]
    status: int | None = None
    body: Any = None


def fingerprint(method: str, path: str, params: dict[str, Any]) -> str:
    """A stable digest of what a request asked for (endpoint and parameters)."""
    raw = json.dumps([method, path, params], sort_keys=True, default=str)
    return hashlib.sha256(raw.encode()).hexdigest()


@dataclass
class Decision:
    """What the store says about an incoming keyed request."""

    kind: Literal["new", "replay", "conflict", "in_flight", "too_long", "malformed"]
    saved: SavedRequest | None = None


class IdempotencyStore:
    """Per-service key table. One instance per service per trial."""

    def __init__(self) -> None:
        self._rows: dict[str, SavedRequest] = {}

    def begin(self, key: str, fp: str) -> Decision:
        """Reserve ``key`` for a new request, or say why it cannot run."""
        if len(key) > MAX_KEY_LENGTH:
            return Decision("too_long")
        if not key or not (key.isascii() and key.isprintable()):
            # An empty key sent on every request would replay the first reply to all of them.
            return Decision("malformed")
        row = self._rows.get(key)
        if row is None:
            row = SavedRequest(fingerprint=fp, state="in_flight")
            self._rows[key] = row
            return Decision("new", row)
        if row.fingerprint != fp:
            return Decision("conflict", row)
        if row.state == "in_flight":
            return Decision("in_flight", row)
        return Decision("replay", row)

    def save(self, key: str, status: int, body: Any) -> None:
        """Store the response of the request that reserved ``key``."""
        row = self._rows[key]
        row.state, row.status, row.body = "done", status, body

    def release(self, key: str) -> None:
        """Forget a reservation whose request never began executing."""
        self._rows.pop(key, None)

    def __len__(self) -> int:
        return len(self._rows)
