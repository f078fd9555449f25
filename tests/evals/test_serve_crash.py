"""Crash test: ``kill -9`` a ``twice serve`` process mid-run, restart it on the same db."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(db: Path, port: int, ignore_sigint: bool = False) -> tuple[subprocess.Popen[str], str]:
    """Start ``twice serve``; its address is the first line of its standard output (what a
    client reads for the port), stderr goes to a file beside the db."""
    with (db.parent / "serve.err").open("a") as err:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "from twice.evals.cli import main; main()",
                "serve",
                "--port",
                str(port),
                "--db",
                str(db),
            ],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            # What a script's background job (`twice serve &`) inherits.
            preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
            if ignore_sigint
            else None,
        )
    assert proc.stdout is not None
    first = proc.stdout.readline()  # blocks until the line or the process's end
    if first.startswith("listening on "):
        return proc, first.split()[-1]
    proc.kill()
    proc.wait(30)
    raise AssertionError(
        f"twice serve's first line was {first!r}; stderr:\n" + (db.parent / "serve.err").read_text()
    )


def _ledgers(url: str, ids: list[str]) -> dict[str, Any]:
    return {i: httpx.get(f"{url}/_twice/trials/{i}/ledger", timeout=30).json() for i in ids}


@pytest.mark.slow
def test_kill_9_mid_run_then_restart_restores_every_ledger(tmp_path: Path) -> None:
    db = tmp_path / "serve.sqlite"
    port = _free_port()
    proc, url = _start(db, port)
    try:
        trials = [
            httpx.post(f"{url}/_twice/trials", json=body, timeout=30).json()
            for body in (
                {"task": "refund", "fault": "reset_after_commit"},
                {"task": "refund", "fault": "lost_reply", "hang_seconds": 60},
                {"task": "send_email"},
            )
        ]
        ids = [t["id"] for t in trials]
        dropped, hung, email = trials
        refunds = f"{dropped['urls']['payments']}/v1/refunds"
        body = {"order_id": "order_1042", "amount": 499}
        with pytest.raises(httpx.RemoteProtocolError):
            httpx.post(refunds, json=body, headers={"Idempotency-Key": "a"})
        assert (
            httpx.post(refunds, json=body, headers={"Idempotency-Key": "a"}).json()["id"] == "re_1"
        )

        # A reply held for a minute is in flight when the server dies.
        hung_error: list[BaseException] = []

        def wait_for_hung_reply() -> None:
            try:
                httpx.post(
                    f"{hung['urls']['payments']}/v1/refunds",
                    json=body,
                    headers={"Idempotency-Key": "h"},
                    timeout=120,
                )
            except httpx.HTTPError as ex:
                hung_error.append(ex)

        # And a client keeps sending emails, remembering every one it was answered.
        answered: list[str] = []
        stop = threading.Event()

        def send_emails() -> None:
            n = 0
            with httpx.Client(timeout=30) as client:
                while not stop.is_set():
                    n += 1
                    try:
                        r = client.post(
                            f"{email['urls']['email']}/v1/messages",
                            json={"to": "a@example.com", "subject": f"s{n}", "body": "b"},
                        )
                    except httpx.HTTPError:
                        return
                    answered.append(r.json()["id"])

        hanging = threading.Thread(target=wait_for_hung_reply)
        sender = threading.Thread(target=send_emails)
        hanging.start()
        sender.start()
        while len(answered) < 20:
            time.sleep(0.05)
        before_fixed = _ledgers(url, ids[:2])
        assert before_fixed[hung["id"]]["effects"][0]["id"] == "re_1"

        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
        stop.set()
        sender.join(30)
        hanging.join(30)
        assert hung_error, "the held reply's client saw its connection die"

        proc, url2 = _start(db, port)
        assert url2 == url
        after = _ledgers(url, ids)
        # Every ledger identical; every email a client was answered is there.
        for i in ids[:2]:
            assert after[i] == before_fixed[i]
        sent = [e["id"] for e in after[email["id"]]["effects"]]
        assert sent[: len(answered)] == answered
        assert len(sent) - len(answered) <= 1  # at most the one in flight, never answered

        # Clients go on where they were: the held refund's key still replays its result.
        again = httpx.post(
            f"{hung['urls']['payments']}/v1/refunds", json=body, headers={"Idempotency-Key": "h"}
        )
        assert again.json()["id"] == "re_1"
        r = httpx.post(
            f"{email['urls']['email']}/v1/messages",
            json={"to": "a@example.com", "subject": "after", "body": "b"},
        )
        assert r.json()["id"] == f"msg_{len(sent) + 1}"
    finally:
        proc.kill()
        proc.wait(30)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("sig", "code", "ignore_sigint"),
    [
        (signal.SIGINT, 130, False),
        (signal.SIGTERM, -signal.SIGTERM, False),
        # Started as a script's background job, with SIGINT ignored: it stops all the same,
        # and does not exit 0 (uvicorn's re-raise of the signal is ignored there too).
        (signal.SIGINT, 130, True),
    ],
)
def test_a_stop_signal_ends_serve_with_its_documented_code_and_keeps_its_trials(
    tmp_path: Path, sig: int, code: int, ignore_sigint: bool
) -> None:
    # README: "with the shell's codes for them: 130 after Ctrl-C (SIGINT), 143 after SIGTERM";
    # subprocess reports a death by SIGTERM (which the shell shows as 143) as -15.
    db = tmp_path / "serve.sqlite"
    proc, url = _start(db, _free_port(), ignore_sigint)
    try:
        made = httpx.post(f"{url}/_twice/trials", json={"task": "refund"}, timeout=30)
        assert made.status_code == 201, made.text
        trial = made.json()
        refund = {"order_id": "order_1042", "amount": 499}
        assert httpx.post(f"{trial['urls']['payments']}/v1/refunds", json=refund).status_code == 200
        proc.send_signal(sig)
        assert proc.wait(30) == code
    finally:
        if proc.poll() is None:
            proc.kill()
    # The failing path: the signal's default action ended the process before the log was
    # closed, so every record stayed in serve.sqlite-wal beside an empty serve.sqlite (and a
    # stale lock): a copy of the --db file alone restored 0 trials.
    assert sorted(p.name for p in tmp_path.glob("serve.sqlite*")) == ["serve.sqlite"]
    alone = tmp_path / "copy" / "serve.sqlite"
    alone.parent.mkdir()
    shutil.copy(db, alone)
    again, url = _start(alone, _free_port())
    try:
        ledger = _ledgers(url, [trial["id"]])[trial["id"]]
        assert [e["id"] for e in ledger["effects"]] == ["re_1"]
    finally:
        again.kill()
        again.wait(30)


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_held_lost_reply_is_dropped_when_serve_stops(tmp_path: Path, sig: int) -> None:
    # The held reply was never going to be answered: the client sees its connection close
    # (a lost reply), not the 500 uvicorn answered for the request it cancelled after its
    # 2 s grace under SIGINT, and the stop does not wait for the hang.
    db = tmp_path / "serve.sqlite"
    proc, url = _start(db, _free_port())
    try:
        body = {"task": "refund", "fault": "lost_reply", "hang_seconds": 60}
        trial = httpx.post(f"{url}/_twice/trials", json=body, timeout=30).json()
        seen: list[object] = []

        def refund() -> None:
            try:
                r = httpx.post(
                    f"{trial['urls']['payments']}/v1/refunds",
                    json={"order_id": "order_1042", "amount": 499},
                    timeout=120,
                )
                seen.append(r.status_code)
            except httpx.HTTPError as ex:
                seen.append(type(ex).__name__)

        client = threading.Thread(target=refund)
        client.start()
        while not _ledgers(url, [trial["id"]])[trial["id"]]["effects"]:
            time.sleep(0.05)  # committed; its reply is being held
        proc.send_signal(sig)
        proc.wait(30)  # well before the 60 s hang ends
        client.join(30)
        assert seen == ["RemoteProtocolError"]  # "Server disconnected without sending a response"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    again, url = _start(db, _free_port())
    try:
        (attempt,) = _ledgers(url, [trial["id"]])[trial["id"]]["attempts"]
        assert attempt["delivered"] is False  # as the client saw it
    finally:
        again.kill()
        again.wait(30)


@pytest.mark.slow
def test_a_restarted_serve_still_prints_its_address_first(tmp_path: Path) -> None:
    # The replay count went to stdout before "listening on": a client reading the first line
    # for the port read that instead. It now goes to stderr.
    db = tmp_path / "serve.sqlite"
    proc, url = _start(db, _free_port())
    try:
        assert httpx.post(f"{url}/_twice/trials", json={"task": "refund"}).status_code == 201
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    again, _ = _start(db, _free_port())  # asserts the first line is the address
    again.send_signal(signal.SIGTERM)
    again.wait(30)
    assert "1 trial(s) restored" in (tmp_path / "serve.err").read_text()
