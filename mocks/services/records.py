"""A records API whose archive action is naturally idempotent.

Archiving is a state change, not a creation: ``POST /v1/records/{id}/archive`` moves an active
record to ``archived`` and commits one ``records.record.archive`` effect. Archiving a record
that is already archived is a success, not an error: HTTP 200 with the record and
``"already_archived": true``, and no new effect. So a retry after a lost reply, or two
concurrent calls, leave exactly one archive effect without any key; the handler's
check-then-act runs without yielding, so concurrent requests cannot both see ``active``.

Keys are accepted, as on every POST of these services, but they are not needed here; a key
reused with different parameters is still rejected (422), so a key can turn a harmless
re-archive with a reworded reason into an error.
"""

from __future__ import annotations

from typing import Any, ClassVar

import httpx

from .._service import Call, Route, Service
from .._wire import error_response


class RecordsService(Service):
    """Records to fetch and archive.

    Args:
        records: The records this trial knows, each with ``record_id``, ``title`` and
            ``status`` (``active`` or ``archived``); other fields are returned as given.
        base_url: Where the API lives (default ``https://records.twice.test``).
    """

    name: ClassVar[str] = "records"
    default_base_url: ClassVar[str] = "https://records.twice.test"

    def __init__(self, records: list[dict[str, Any]] | None = None, base_url: str | None = None):
        super().__init__(base_url)
        self.records: dict[str, dict[str, Any]] = {
            r["record_id"]: {"object": "record", "archive_id": None, "archive_reason": None, **r}
            for r in records or []
        }

    def routes(self) -> list[Route]:
        return [
            Route("GET", r"/v1/records/(?P<record_id>[^/?]+)", "records.record.get", self.get),
            Route(
                "POST",
                r"/v1/records/(?P<record_id>[^/?]+)/archive",
                "records.record.archive",
                self.archive,
                mutating=True,
            ),
        ]

    def get(self, call: Call) -> httpx.Response:
        record = self.records.get(call.params["record_id"])
        if record is None:
            return error_response(404, f"No such record: {call.params['record_id']!r}")
        return httpx.Response(200, json=record)

    def archive(self, call: Call) -> httpx.Response:
        record = self.records.get(call.params["record_id"])
        if record is None:
            return error_response(404, f"No such record: {call.params['record_id']!r}")
        if record["status"] == "archived":
            return httpx.Response(200, json={**record, "already_archived": True})
        reason = str(call.params.get("reason", ""))
        effect = call.commit(
            "records.record.archive", "arc", {"record_id": record["record_id"], "reason": reason}
        )
        record.update(status="archived", archive_id=effect.id, archive_reason=reason)
        return httpx.Response(200, json={**record, "already_archived": False})
