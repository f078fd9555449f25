"""``twice serve``'s write-ahead request log: SQLite in WAL mode.

Every request that can change a trial is appended here *before* it is served, so after a
``kill -9`` the server replays the log on the same file and rebuilds every trial exactly: the
services are deterministic, so the same requests in the same order give the same state and the
same ledger. A client was only ever answered after its request was in the log, so nothing it
was told is lost.

``synchronous=NORMAL`` in WAL mode makes each append a write to the WAL file without an fsync:
it survives the process being killed (the operating system has the bytes), not a power cut.
``durable=True`` (``synchronous=FULL``) pays an fsync per request for that too.

What is stored is only what the services read: the method, path, query, body and the headers
twice's pipeline looks at. ``Authorization`` (a Stripe SDK sends its API key there) is never
written.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from twice.mocks import UsageError

from ..locks import hold_lock

SCHEMA = """
CREATE TABLE IF NOT EXISTS log (
    seq   INTEGER PRIMARY KEY AUTOINCREMENT,
    trial TEXT NOT NULL,
    kind  TEXT NOT NULL,
    data  TEXT NOT NULL
)
"""

KINDS = ("create", "request", "upstream", "observe", "context", "delete")
"""Record kinds: a trial created, a service request, a request forwarded to an upstream (with
what the ledger recorded of it: the forward is never made again), a text the agent was shown
(MCP), the tool layer's state after an MCP tool call, a trial deleted."""


class DamagedLog(UsageError, ValueError):
    """A record of the log that cannot be read back (the file was edited or corrupted)."""


@dataclass(frozen=True)
class Record:
    """One entry of the log."""

    seq: int
    trial: str
    kind: str
    data: dict[str, Any]


class RequestLog:
    """An append-only log of trial records in one SQLite file.

    Args:
        path: The database file (created if missing). ``":memory:"`` keeps it in memory.
        durable: fsync every append (``synchronous=FULL``) so it survives a power cut too.

    Raises:
        ValueError: when the file is not a twice serve database.
    """

    def __init__(self, path: str | Path, *, durable: bool = False) -> None:
        self.path = str(path)
        self._lock = contextlib.ExitStack()
        if self.path != ":memory:":
            # Two servers on one file would each restore only their own trials, then merge
            # them on the next restart: one server per log, as one run per log directory.
            try:
                self._lock.enter_context(hold_lock(Path(f"{self.path}.lock"), self._busy))
            except OSError as ex:
                raise ValueError(self._unopenable(ex)) from None
        # The server appends from its event loop thread only; autocommit makes every append
        # its own transaction, written to the WAL before the request is served.
        try:
            self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as ex:
            self._lock.close()
            raise ValueError(self._unopenable(ex)) from None
        try:
            # Another program's database is refused before anything is written to it (the
            # WAL switch below rewrites the file's header).
            tables = {r[0] for r in self._db.execute("SELECT name FROM sqlite_master")}
            foreign = sorted(tables - {"log", "sqlite_sequence"})
            if foreign and "log" not in tables:
                self.close()
                raise ValueError(
                    f"{self.path} is another program's database (tables: "
                    f"{', '.join(foreign[:5])}); it is not a twice serve database: give --db "
                    "a new file"
                )
            cols = [r[1] for r in self._db.execute("PRAGMA table_info(log)")]
            if cols and cols != ["seq", "trial", "kind", "data"]:
                self.close()
                raise ValueError(
                    f"{self.path} has a 'log' table of another shape ({', '.join(cols)}); "
                    "it is not a twice serve database"
                )
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute(f"PRAGMA synchronous={'FULL' if durable else 'NORMAL'}")
            self._db.execute(SCHEMA)
        except sqlite3.DatabaseError as ex:
            self.close()
            raise ValueError(f"{self.path} is not a twice serve database: {ex}") from None

    def append(self, trial: str, kind: str, data: dict[str, Any]) -> None:
        """Write one record; it is in the WAL when this returns."""
        self._db.execute(
            "INSERT INTO log (trial, kind, data) VALUES (?, ?, ?)",
            (trial, kind, json.dumps(data, separators=(",", ":"))),
        )

    def records(self) -> Iterator[Record]:
        """Every record, oldest first."""
        rows = self._db.execute("SELECT seq, trial, kind, data FROM log ORDER BY seq").fetchall()
        for seq, trial, kind, data in rows:
            try:
                parsed = json.loads(data)
            except (TypeError, ValueError) as ex:
                raise DamagedLog(
                    f"{self.path} is damaged: its record {seq} is not JSON ({ex}); restore it "
                    "from a copy, or start with a new --db"
                ) from None
            yield Record(seq, trial, kind, parsed)

    def __len__(self) -> int:
        return int(self._db.execute("SELECT COUNT(*) FROM log").fetchone()[0])

    def close(self) -> None:
        """Close the database (a checkpoint folds the WAL into the main file) and let go of
        its lock."""
        try:
            self._db.close()
        finally:
            self._lock.close()

    def _busy(self, holder: str) -> ValueError:
        return ValueError(
            f"{self.path} is in use by another twice serve ({holder}); stop it, or pass "
            "another --db"
        )

    def _unopenable(self, ex: Exception) -> str:
        return (
            f"cannot open {self.path} as twice serve's request log ({ex}); pass --db a file "
            "in an existing directory you can write to"
        )
