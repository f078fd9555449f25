"""``twice serve`` over loopback with real clients: httpx, requests, the Stripe SDK, MCP."""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import requests
import stripe
from twice.evals.serve import ControlError, ServeError, parse_trial_config, running_server
from twice.evals.serve._asgi import MAX_SERVICE_BODY
from twice.evals.serve._log import RequestLog
from twice.evals.serve._mcp import tool_annotations
from twice.evals.serve._server import _prepare
from twice.evals.suite._hang import DEFAULT_HANG_SECONDS
from twice.mocks import UNKNOWN_OUTCOME
from twice.tasks import ToolSpec


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with running_server() as running:
        yield running.url


@pytest.fixture
def trial(server: str) -> Callable[..., dict[str, Any]]:
    """Make a trial: ``trial(fault="lost_reply", hang_seconds=3)``."""

    def make(**body: Any) -> dict[str, Any]:
        r = httpx.post(f"{server}/_twice/trials", json={"task": "refund", **body})
        assert r.status_code == 201, r.text
        return dict(r.json())

    return make


def ledger(server: str, trial: dict[str, Any]) -> dict[str, Any]:
    r = httpx.get(f"{server}/_twice/trials/{trial['id']}/ledger")
    assert r.status_code == 200, r.text
    return dict(r.json())


def verdict(server: str, trial: dict[str, Any]) -> dict[str, float]:
    r = httpx.get(f"{server}/_twice/trials/{trial['id']}/verdict")
    assert r.status_code == 200, r.text
    return dict(r.json()["metrics"])


def refunds(server: str, trial: dict[str, Any]) -> list[str]:
    return [e["id"] for e in ledger(server, trial)["effects"]]


REFUND = {"order_id": "order_1042", "amount": 499}


# -- control API -------------------------------------------------------------------------


def test_serve_create_trial_gives_per_trial_urls(server: str, trial: Callable[..., Any]) -> None:
    t = trial(sample="refund-002", fault="lost_reply", hang_seconds=1.5)
    assert t["urls"] == {
        "payments": f"{server}/t/{t['id']}/payments",
        "mcp": f"{server}/t/{t['id']}/mcp",
    }
    assert (t["sample"], t["fault"], t["hang_seconds"]) == ("refund-002", "lost_reply", 1.5)
    # The trial starts from its sample's initial state.
    order = httpx.get(f"{t['urls']['payments']}/v1/orders/order_1054").json()
    assert order["amount"] == 9850 and order["amount_refunded"] == 0


def test_serve_turns_nagle_off_on_the_connections_it_accepts(server: str) -> None:
    # A reply goes out as head then body; with Nagle's algorithm on, the body waits for the
    # client's delayed ACK, about 40 ms on every request after the first on a kept-alive
    # connection (every SDK's pool). The server runs in this process: find its end of the
    # connection among this process's sockets and read the option there.
    url = httpx.URL(server)
    with socket.create_connection((url.host, url.port)) as client:
        client.sendall(
            f"GET /_twice/trials HTTP/1.1\r\nHost: {url.netloc.decode()}\r\n\r\n".encode()
        )
        assert client.recv(65536).startswith(b"HTTP/1.1 200")
        ends = []
        for fd in os.listdir("/proc/self/fd"):
            try:
                other = socket.socket(fileno=os.dup(int(fd)))
            except OSError:
                continue  # not a socket
            with other:
                try:
                    if other.getsockname() == client.getpeername() and (
                        other.getpeername() == client.getsockname()
                    ):
                        ends.append(other.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
                except OSError:
                    continue  # not a connected TCP socket
    assert ends == [1]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"task": "nope"}, "task"),
        ({}, "task"),
        ({"task": "refund", "sample": "refund-999"}, "sample"),
        ({"task": "refund", "fault": "gremlins"}, "fault"),
        # Accepted, it acted as "none" (nothing restarts a client's agent) while the verdict
        # said the run crashed before the agent saw the reply.
        ({"task": "refund", "fault": "crash_after_commit"}, "fault"),
        ({"task": "refund", "protection": "prayer"}, "protection"),
        ({"task": "refund", "lost_reply": "vanish"}, "lost_reply"),
        # The connection closed at once is its own fault now, never lost_reply's form.
        ({"task": "refund", "fault": "lost_reply", "lost_reply": "drop"}, "lost_reply"),
        ({"task": "refund", "hang_seconds": 0}, "hang_seconds"),
        ({"task": "refund", "hang_seconds": "2"}, "hang_seconds"),
        ({"task": "refund", "hang_seconds": 10_000}, "hang_seconds"),
        ({"task": "refund", "colour": "red"}, "colour"),
    ],
)
def test_serve_bad_trial_request_is_400_naming_the_field(
    server: str, body: dict[str, Any], field: str
) -> None:
    r = httpx.post(f"{server}/_twice/trials", json=body)
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["param"] == field
    assert field in error["message"]


JSON = {"Content-Type": "application/json"}


def test_serve_control_body_that_is_not_json_or_too_big(server: str) -> None:
    r = httpx.post(f"{server}/_twice/trials", content=b"{task: refund", headers=JSON)
    assert r.status_code == 400 and "not JSON" in r.json()["error"]["message"]
    r = httpx.post(f"{server}/_twice/trials", content=b"[" + b" " * 70_000 + b"]", headers=JSON)
    assert r.status_code == 413


def test_serve_json_nested_past_the_stack_is_a_400(server: str, trial: Callable[..., Any]) -> None:
    # The failing path: json.loads raised RecursionError, a 500 with a server traceback.
    deep = b"[" * 30_000 + b"]" * 30_000
    r = httpx.post(f"{server}/_twice/trials", content=deep, headers=JSON)
    assert r.status_code == 400 and "not JSON" in r.json()["error"]["message"]
    t = trial()
    r = httpx.post(
        f"{t['urls']['payments']}/v1/refunds",
        content=deep, headers={"Content-Type": "application/json"},
    )  # fmt: skip
    assert r.status_code == 400 and "neither JSON" in r.json()["error"]["message"]


def test_serve_a_lone_surrogate_is_a_400_and_commits_nothing(
    server: str, trial: Callable[..., Any]
) -> None:
    # The failing path: the refund was committed, its reply could not be encoded (a 500), and
    # every later list of that order's refunds was a 500 too: a careful client could never
    # check before retrying.
    t = trial()
    url = f"{t['urls']['payments']}/v1/refunds"
    body = b'{"order_id": "order_1042", "amount": 10, "reason": "\\ud800"}'
    r = httpx.post(url, content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 400, r.text
    assert "half a surrogate pair" in r.json()["error"]["message"]
    assert refunds(server, t) == []
    assert httpx.get(url, params={"order_id": "order_1042"}).status_code == 200
    # The same body in UTF-16 (json.loads reads it; the escape's bytes are spread by NULs).
    utf16 = body.decode("ascii").encode("utf-16")
    r = httpx.post(url, content=utf16, headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and refunds(server, t) == []
    # A whole pair (an emoji, escaped) is a string like any other.
    pair = b'{"order_id": "order_1042", "amount": 10, "reason": "\\ud83d\\ude00"}'
    r = httpx.post(url, content=pair, headers={"Content-Type": "application/json"})
    assert r.status_code == 200 and r.json()["reason"] == "\U0001f600"


@pytest.mark.parametrize(
    ("key", "message"),
    [
        (b"k\xe9y", "Idempotency-Key is 'k\xe9y', not printable ASCII"),
        (b"", "Idempotency-Key is empty"),
    ],
)
def test_serve_an_empty_or_non_ascii_key_is_a_400(
    server: str, trial: Callable[..., Any], key: bytes, message: str
) -> None:
    # The failing paths: a non-ASCII key was a 500 (httpx could not encode the header); an
    # empty key was a key like any other, so a client sending it on every request had its
    # first reply replayed to all of them and was scored idempotent.
    t = trial()
    for _ in range(2):
        r = httpx.post(
            f"{t['urls']['payments']}/v1/refunds", json=REFUND, headers=[(b"Idempotency-Key", key)]
        )
        assert r.status_code == 400, r.text
        assert message in r.json()["error"]["message"]
    assert refunds(server, t) == []


def test_serve_service_body_size_limit(server: str, trial: Callable[..., Any]) -> None:
    t = trial()
    big = b"x" * (MAX_SERVICE_BODY + 1)
    r = httpx.post(f"{t['urls']['payments']}/v1/refunds", content=big)
    assert r.status_code == 413
    assert ledger(server, t)["attempts"] == []  # refused before it reached the service


@pytest.mark.parametrize("chunked", [False, True])
def test_serve_mcp_body_size_limit(server: str, trial: Callable[..., Any], chunked: bool) -> None:
    # The failing path: only a Content-Length was checked, so a chunked body of any size up
    # to the MCP SDK's own 4 MB reached it.
    t = trial()
    big = b'{"jsonrpc": "2.0", "id": 1, "method": "ping", "pad": "' + b"x" * MAX_SERVICE_BODY
    content = iter([big[i : i + 65536] for i in range(0, len(big), 65536)]) if chunked else big
    r = httpx.post(
        t["urls"]["mcp"],
        content=content,
        headers={"content-type": "application/json", "accept": "application/json"},
    )
    assert r.status_code == 413, r.text
    assert f"at most {MAX_SERVICE_BODY}" in r.json()["error"]["message"]


def test_serve_unknown_service_path_404_names_the_served_path(
    server: str, trial: Callable[..., Any]
) -> None:
    t = trial()
    r = httpx.delete(f"{t['urls']['payments']}/v1/refunds")
    assert r.status_code == 404
    # The path the client sent, not the service's internal base URL it was forwarded to.
    assert r.json()["error"]["message"] == "the payments API has no endpoint DELETE /v1/refunds"
    assert "twice.test" not in r.text


def test_serve_trials_are_isolated(server: str, trial: Callable[..., Any]) -> None:
    a, b = trial(), trial()
    assert httpx.post(f"{a['urls']['payments']}/v1/refunds", json=REFUND).status_code == 200
    assert refunds(server, a) == ["re_1"]
    assert refunds(server, b) == []
    assert httpx.get(f"{b['urls']['payments']}/v1/refunds").json()["data"] == []
    for url in (
        f"{server}/_twice/trials/{'0' * 16}/ledger",
        f"{server}/_twice/trials/{'0' * 16}/verdict",
        f"{server}/t/{'0' * 16}/payments/v1/refunds",
    ):
        r = httpx.get(url)
        assert r.status_code == 404 and "no such trial" in r.json()["error"]["message"]
    r = httpx.get(f"{server}/t/{a['id']}/email/v1/messages")
    assert r.status_code == 404 and "has no service 'email'" in r.json()["error"]["message"]


def test_serve_delete_forgets_the_trial(server: str, trial: Callable[..., Any]) -> None:
    t = trial()
    assert httpx.delete(f"{server}/_twice/trials/{t['id']}").status_code == 200
    assert httpx.get(f"{server}/_twice/trials/{t['id']}/ledger").status_code == 404
    assert httpx.delete(f"{server}/_twice/trials/{t['id']}").status_code == 404


def test_serve_token_guards_the_control_api() -> None:
    with running_server(token="s3cret") as running:
        url = f"{running.url}/_twice/trials"
        refused = httpx.post(url, json={"task": "refund"})
        assert refused.status_code == 401
        assert refused.headers["www-authenticate"].startswith("Bearer")  # RFC 9110 11.6.1
        for bad in ("Bearer nope", "Basic s3cret", "Bearer", "s3cret", "Bearer s3cret2"):
            response = httpx.post(url, json={"task": "refund"}, headers={"Authorization": bad})
            assert response.status_code == 401, bad
        for good in ("Bearer s3cret", "bearer s3cret", "BEARER  s3cret"):  # scheme: any case
            response = httpx.post(url, json={"task": "refund"}, headers={"Authorization": good})
            assert response.status_code == 201, good


def test_serve_refuses_non_loopback_without_token(tmp_path: Path) -> None:
    with pytest.raises(ServeError, match=r"refusing to bind '0\.0\.0\.0' without --token"):
        _prepare("0.0.0.0", 0, tmp_path / "x.sqlite", None, ())


def test_serve_refused_on_a_busy_port_leaves_no_database_or_lock(tmp_path: Path) -> None:
    # The failing path: the request log was opened before the port was bound and not closed
    # when the bind failed: x.sqlite, its -wal and -shm and a lock naming a dead pid stayed.
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(ServeError, match=f"cannot listen on 127.0.0.1:{port}"):
            _prepare("127.0.0.1", port, tmp_path / "x.sqlite", None, ())
    assert list(tmp_path.iterdir()) == []


def test_serve_refuses_a_file_that_is_not_its_database(tmp_path: Path) -> None:
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(ServeError, match="not a twice serve database"):
        _prepare("127.0.0.1", 0, junk, None, ())


def test_serve_leaves_another_programs_database_untouched(tmp_path: Path) -> None:
    # The failing path: it was accepted, and twice's tables were written into the user's file.
    theirs = tmp_path / "app.sqlite"
    with sqlite3.connect(theirs) as db:
        db.execute("CREATE TABLE users (name TEXT)")
    before = theirs.read_bytes()
    with pytest.raises(ServeError, match=r"app\.sqlite is another program's database \(tables: "
                       r"users\); it is not a twice serve database"):  # fmt: skip
        _prepare("127.0.0.1", 0, theirs, None, ())
    assert theirs.read_bytes() == before
    # One with a 'log' table of its own: refused for its shape, still before the WAL switch
    # rewrote its header.
    with sqlite3.connect(theirs) as db:
        db.execute("CREATE TABLE log (msg TEXT)")
    before = theirs.read_bytes()
    with pytest.raises(ServeError, match=r"has a 'log' table of another shape \(msg\)"):
        _prepare("127.0.0.1", 0, theirs, None, ())
    assert theirs.read_bytes() == before


def test_serve_refuses_a_damaged_log_in_one_line(tmp_path: Path) -> None:
    # The failing path: a record that is not JSON ended the restart in a traceback, exit 1.
    from twice.evals import RequestLog

    db = tmp_path / "damaged.sqlite"
    log = RequestLog(db)
    log.append("abc", "create", {"task": "refund", "sample": "refund-001"})
    log.close()
    with sqlite3.connect(db) as raw:
        raw.execute("UPDATE log SET data = '{bad json' WHERE seq = 1")
    with pytest.raises(ServeError, match=r"damaged\.sqlite is damaged: its record 1 is not JSON"):
        _prepare("127.0.0.1", 0, db, None, ())


def test_serve_refuses_a_db_it_cannot_open_in_one_line(tmp_path: Path) -> None:
    # A --db in a missing directory, or a directory, ended in sqlite3's traceback and exit 1.
    from click.testing import CliRunner
    from twice.evals.cli import cli

    (tmp_path / "adir").mkdir()
    for db in (tmp_path / "missing" / "x.sqlite", tmp_path / "adir"):
        result = CliRunner().invoke(cli, ["serve", "--port", "0", "--db", str(db)])
        assert result.exit_code == 2, result.output
        assert f"cannot open {db} as twice serve's request log" in result.output
        assert "Traceback" not in result.output


@pytest.mark.parametrize(
    ("db", "token", "shown"),
    [
        ("", None, "--db ''"),
        (" ", None, "--db ' '"),
        ("x.sqlite", "", "--token ''"),
        ("x.sqlite", "two words", "--token (not shown)"),
    ],
)
def test_serve_refuses_an_empty_db_or_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, db: str, token: str | None, shown: str
) -> None:
    # The failing path: --db "" served with nothing kept and no one-server lock, and
    # --token "" served with no authentication at all, both without a word.
    monkeypatch.chdir(tmp_path)  # where a --db ' ' would land
    if db.strip():
        db = str(tmp_path / db)
    with pytest.raises(ServeError, match=re.escape(shown)):
        _prepare("127.0.0.1", 0, db, token, ())
    args = ["--db", db, *(["--token", token] if token is not None else [])]
    done = subprocess.run(
        [sys.executable, "-c", "from twice.evals.cli import main; main()", "serve",
         "--port", "0", *args],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {shown} ") and done.stdout == ""
    assert "two words" not in done.stderr  # a token is a secret, even a bad one
    assert list(tmp_path.iterdir()) == []


def test_serve_answers_only_loopback_host_and_origin(
    server: str, trial: Callable[..., Any]
) -> None:
    # The failing path: a page whose name resolved to 127.0.0.1 (DNS rebinding) sent its own
    # Host and was answered, and a cross-origin page's POST was taken: it could make and
    # read trials and call their services.
    t = trial()
    port = server.rsplit(":", 1)[1]
    payments = f"{t['urls']['payments']}/v1/refunds"
    mcp = t["urls"]["mcp"]
    for host in (f"evil.example:{port}", "evil.example", f"127.0.0.1.evil.example:{port}",
                 f"user@127.0.0.1:{port}", ""):  # fmt: skip
        for method, url in (("GET", f"{server}/_twice/trials"), ("GET", payments),
                            ("POST", mcp)):  # fmt: skip
            r = httpx.request(method, url, headers={"Host": host, **JSON}, content=b"{}")
            assert r.status_code == 421, (host, url, r.text)
            assert "DNS rebinding" in r.json()["error"]["message"]
    made = len(httpx.get(f"{server}/_twice/trials").json()["trials"])
    for origin in ("http://evil.example", f"http://evil.example:{port}", "null",
                   "http://localhost:3000.evil.example", "file://"):  # fmt: skip
        r = httpx.post(f"{server}/_twice/trials", json={"task": "refund"},
                       headers={"Origin": origin})  # fmt: skip
        assert r.status_code == 403, (origin, r.text)
        r = httpx.post(payments, json=REFUND, headers={"Origin": origin})
        assert r.status_code == 403, (origin, r.text)
    assert len(httpx.get(f"{server}/_twice/trials").json()["trials"]) == made
    assert refunds(server, t) == []
    # Loopback names and origins (a browser-based agent served from localhost) still work.
    for host, origin in ((f"localhost:{port}", None), (f"127.0.0.1:{port}", None),
                         (f"127.0.0.1:{port}", "http://localhost:5173"),
                         (f"localhost:{port}", f"http://127.0.0.1:{port}"),
                         (f"127.0.0.1:{port}", "https://[::1]:8443")):  # fmt: skip
        headers = {"Host": host, **({"Origin": origin} if origin else {})}
        r = httpx.post(f"{server}/_twice/trials", json={"task": "refund"}, headers=headers)
        assert r.status_code == 201, (host, origin, r.text)
    r = httpx.get(f"{payments}?order_id=order_1042", headers={"Origin": "http://localhost:3000"})
    assert r.status_code == 200, r.text


def test_serve_process_refuses_a_web_page_and_serves_an_sdk(tmp_path: Path) -> None:
    # The same checks on a `twice serve` process, as a user starts it.
    proc = subprocess.Popen(
        [sys.executable, "-c", "from twice.evals.cli import main; main()", "serve",
         "--port", "0", "--db", str(tmp_path / "serve.sqlite")],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().split()[-1]
        trials = f"{url}/_twice/trials"
        rebound = {"Host": f"evil.example:{url.rsplit(':', 1)[1]}"}
        assert httpx.get(trials, headers=rebound).status_code == 421
        page = {"Origin": "http://evil.example"}
        assert httpx.post(trials, json={"task": "refund"}, headers=page).status_code == 403
        plain = {"Content-Type": "text/plain"}
        assert httpx.post(trials, content=b'{"task": "refund"}', headers=plain).status_code == 415
        made = httpx.post(trials, json={"task": "refund"})
        assert made.status_code == 201, made.text
        assert httpx.get(trials).json()["trials"] == [made.json()]
    finally:
        proc.terminate()
        proc.wait(30)


def test_serve_control_post_needs_a_json_content_type(server: str) -> None:
    # The failing path: a text/plain POST (which a cross-origin page sends with no preflight)
    # made a trial.
    made = len(httpx.get(f"{server}/_twice/trials").json()["trials"])
    body = json.dumps({"task": "refund"}).encode()
    for content_type in ("text/plain", "application/x-www-form-urlencoded",
                         "multipart/form-data; boundary=x", None):  # fmt: skip
        headers = {"Content-Type": content_type} if content_type else {}
        r = httpx.post(f"{server}/_twice/trials", content=body, headers=headers)
        assert r.status_code == 415, (content_type, r.text)
        assert "Content-Type: application/json" in r.json()["error"]["message"]
    assert len(httpx.get(f"{server}/_twice/trials").json()["trials"]) == made
    for content_type in ("application/json", "Application/JSON; charset=utf-8"):
        r = httpx.post(
            f"{server}/_twice/trials", content=body, headers={"Content-Type": content_type}
        )
        assert r.status_code == 201, (content_type, r.text)


def _closed_within(sock: socket.socket, seconds: float) -> float | None:
    """Seconds until the server closed ``sock`` (None: still open after ``seconds``)."""
    started = time.monotonic()
    sock.settimeout(seconds)
    try:
        while sock.recv(4096):
            pass
    except TimeoutError:
        return None
    return time.monotonic() - started


def test_serve_closes_connections_that_send_no_whole_request() -> None:
    # The failing path: uvicorn bounds a connection's idle time only after a reply, and any
    # byte ends that bound: a connection opened and left silent, or sent half a request
    # head, was held open for ever.
    with running_server(idle_seconds=0.5) as running:
        host, port = running.url.removeprefix("http://").rsplit(":", 1)
        with socket.create_connection((host, int(port))) as silent:
            assert (_closed_within(silent, 10) or 99) < 5
        with socket.create_connection((host, int(port))) as half:
            half.sendall(b"GET /_twice/trials HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            for _ in range(3):  # bytes that never finish a head do not reset the bound
                time.sleep(0.2)
                half.sendall(b"X-Slow: 1\r\n")
            assert (_closed_within(half, 10) or 99) < 5
        # After a reply, as uvicorn's keep-alive bound does.
        with httpx.Client() as client:
            assert client.get(f"{running.url}/_twice/trials").status_code == 200
            time.sleep(1.5)
            assert client.get(f"{running.url}/_twice/trials").status_code == 200  # reconnects


def test_serve_a_held_reply_is_not_idle() -> None:
    # A hang longer than the idle bound is held for its own hang_seconds.
    with running_server(idle_seconds=0.5) as running:
        made = httpx.post(
            f"{running.url}/_twice/trials",
            json={"task": "refund", "fault": "lost_reply", "lost_reply": "hang",
                  "hang_seconds": 2},
        ).json()  # fmt: skip
        started = time.monotonic()
        with pytest.raises(httpx.RemoteProtocolError):
            httpx.post(f"{made['urls']['payments']}/v1/refunds", json=REFUND, timeout=30)
        assert 1.9 < time.monotonic() - started < 10


def test_one_serve_per_db(tmp_path: Path) -> None:
    # Two servers on one file each restored only their own trials, then merged both sets on
    # the next restart.
    from twice.evals import RequestLog

    db = tmp_path / "one.sqlite"
    first = RequestLog(db)
    try:
        with pytest.raises(ServeError, match=r"one\.sqlite is in use by another twice serve \(pid"):
            _prepare("127.0.0.1", 0, db, None, ())
    finally:
        first.close()
    RequestLog(db).close()  # released with the first server


def test_serve_refuses_a_log_it_cannot_replay(tmp_path: Path) -> None:
    from twice.evals import RequestLog

    db = tmp_path / "old.sqlite"
    log = RequestLog(db)
    log.append("abc", "create", {"task": "refund", "sample": "refund-999"})
    log.close()
    with pytest.raises(ServeError, match=r"cannot be replayed: trial abc .*no sample 'refund-999'"):
        _prepare("127.0.0.1", 0, db, None, ())


OWN_TASK = f"{Path(__file__).parents[2] / 'docs/examples/own_task/courtesy.py'}:courtesy_refund"


def test_serve_hosts_a_task_of_your_own_it_was_started_with(tmp_path: Path) -> None:
    db = tmp_path / "own.sqlite"
    with running_server(db, tasks=[OWN_TASK]) as running:
        r = httpx.post(
            f"{running.url}/_twice/trials", json={"task": OWN_TASK, "fault": "reset_after_commit"}
        )
        assert r.status_code == 201, r.text
        made = r.json()
        assert (made["task"], made["sample"]) == (OWN_TASK, "courtesy-001")
        # The same file spelt another way is not it: the refusal shows the spelling that is
        # (it listed only the built-in tasks).
        other = OWN_TASK.replace("/docs/", "/docs/./")
        r = httpx.post(f"{running.url}/_twice/trials", json={"task": other})
        assert r.status_code == 400
        assert f'started with: "{OWN_TASK}"' in r.json()["error"]["message"]
        refund = {"order_id": "order_1042", "amount": 500, "reason": "courtesy"}
        with pytest.raises(httpx.RemoteProtocolError):  # committed, reply lost
            httpx.post(f"{made['urls']['payments']}/v1/refunds", json=refund)
        httpx.post(f"{made['urls']['payments']}/v1/refunds", json=refund)  # a blind retry
        assert verdict(running.url, made)["duplicated"] == 1.0  # the task's own intents
        before = ledger(running.url, made)
    # The request log names the task by its spec: a restart needs the same --task.
    with pytest.raises(ServeError, match=r"of task '.*courtesy\.py:courtesy_refund', a task of "):
        _prepare("127.0.0.1", 0, db, None, ())
    with running_server(db, tasks=[OWN_TASK]) as again:
        assert ledger(again.url, made) == before


def test_mcp_serves_the_tools_of_a_task_of_your_own() -> None:
    with running_server(tasks=[OWN_TASK]) as running:
        r = httpx.post(
            f"{running.url}/_twice/trials",
            json={"task": OWN_TASK, "fault": "lost_reply", "protection": "intent-key"},
        )
        assert r.status_code == 201, r.text
        made = r.json()
        args = {"order_id": "order_1042", "cents": 500}
        tools, results = asyncio.run(
            _mcp_session(made["urls"]["mcp"], [("refund_order", args), ("refund_order", args)])
        )
        assert sorted(t.name for t in tools.tools) == ["list_refunds", "refund_order"]
        assert "may or may not have been made" in results[0].content[0].text  # reply lost
        assert "re_1" in results[1].content[0].text  # the intent key replays the first
        assert refunds(running.url, made) == ["re_1"]


def test_serve_makes_no_trial_of_a_task_file_it_was_not_started_with(server: str) -> None:
    # A request never names code for the server to load.
    r = httpx.post(f"{server}/_twice/trials", json={"task": OWN_TASK})
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"]
    assert f"twice serve --task {OWN_TASK}" in message and "built-in: refund" in message


def test_serve_refuses_a_task_of_your_own_it_cannot_load(tmp_path: Path) -> None:
    from click.testing import CliRunner
    from twice.evals.cli import cli

    missing = f"{tmp_path / 'nope.py'}:task"
    db = tmp_path / "serve.sqlite"
    result = CliRunner().invoke(cli, ["serve", "--port", "0", "--db", db, "--task", missing])
    assert result.exit_code == 2, result.output
    assert not db.exists()  # refused before anything was written
    assert f"--task '{missing}': task file" in result.output and "does not exist" in result.output
    plain = tmp_path / "plain.py"
    plain.write_text(
        "from inspect_ai import Task, task\nfrom inspect_ai.dataset import Sample\n\n@task\n"
        "def t(fault='none', protection='bare', prompt='baseline'):\n"
        "    return Task(dataset=[Sample(input='hi')])\n"
    )
    with pytest.raises(ServeError, match=r"was not built with twice\.tasks\.twice_task"):
        _prepare("127.0.0.1", 0, ":memory:", None, [f"{plain}:t"])


def test_parse_trial_config_defaults() -> None:
    config = parse_trial_config({"task": "send_email"})
    assert (config.sample, config.fault, config.protection, config.hang_seconds) == (
        "send_email-001",
        "none",
        "bare",
        DEFAULT_HANG_SECONDS,
    )
    assert DEFAULT_HANG_SECONDS >= 60  # longer than the clients' usual read timeouts
    # The server's own default (twice serve --hang-seconds) applies when the body has none.
    assert parse_trial_config({"task": "refund"}, hang_seconds=4).hang_seconds == 4.0
    # JSON null is "not given" (it was refused), and errors quote JSON, not Python values
    nulls = {k: None for k in ("sample", "fault", "protection", "lost_reply", "hang_seconds")}
    assert parse_trial_config({"task": "send_email", **nulls}) == config
    for body, said in [
        ({}, "task is required; one of: "),
        ({"task": None}, "task is required; one of: "),
        ({"task": "refund", "fault": True}, "fault true is not one of"),
        ({"task": "refund", "hang_seconds": True}, "hang_seconds true must be a number"),
        ({"task": "refund", "sample": 7}, "sample 7 is not in task 'refund'"),
        ({"task": "refund", "fault": "crash_after_commit"}, "restarts twice's own agent loop"),
        # A served trial's client drives its own turns: nothing would ask it again or compact.
        ({"task": "refund", "fault": "ask_again"}, 'fault "ask_again" changes the conversation'),
        (
            {"task": "refund", "fault": "lost_reply+compaction"},
            'fault "lost_reply+compaction" changes the conversation',
        ),
        (
            {"task": "refund", "fault": "lost_reply", "lost_reply": "drop"},
            'lost_reply "drop" is the fault "reset_after_commit"',
        ),
    ]:
        with pytest.raises(ControlError, match=re.escape(said)):
            parse_trial_config(body)
    # The deprecated field's remaining value is what every timeout fault does anyway.
    assert parse_trial_config({"task": "refund", "lost_reply": "hang"}) == parse_trial_config(
        {"task": "refund"}
    )


# -- lost replies over a socket ----------------------------------------------------------


def test_serve_reset_after_commit_closes_without_a_response_httpx(
    server: str, trial: Callable[..., Any]
) -> None:
    t = trial(fault="reset_after_commit")
    url = f"{t['urls']['payments']}/v1/refunds"
    start = time.monotonic()
    with pytest.raises(httpx.RemoteProtocolError):
        httpx.post(url, json=REFUND, headers={"Idempotency-Key": "k-1"}, timeout=30)
    assert time.monotonic() - start < 5  # at once: a connection error, not a timeout
    # The work was done: a keyed retry gets the saved reply, an unkeyed one refunds again.
    assert httpx.post(url, json=REFUND, headers={"Idempotency-Key": "k-1"}).json()["id"] == "re_1"
    assert refunds(server, t) == ["re_1"]
    assert httpx.post(url, json=REFUND).json()["id"] == "re_2"
    assert verdict(server, t)["duplicated"] == 1.0
    first = ledger(server, t)["attempts"][0]
    assert (first["fault"], first["delivered"], first["outcome"]) == (
        "reset_after_commit",
        False,
        "unknown",
    )


def test_serve_reset_after_commit_is_a_connection_error_for_requests(
    server: str, trial: Callable[..., Any]
) -> None:
    t = trial(fault="reset_after_commit")
    with pytest.raises(requests.exceptions.ConnectionError):
        requests.post(f"{t['urls']['payments']}/v1/refunds", json=REFUND, timeout=5)
    assert refunds(server, t) == ["re_1"]


def test_serve_verdict_names_a_refund_of_another_amount_than_asked(
    server: str, trial: Callable[..., Any]
) -> None:
    # The sample asks $4.99 on order_1042; an agent refunds the whole $39.97 order.
    t = trial(fault="none")
    r = httpx.post(f"{t['urls']['payments']}/v1/refunds", json={**REFUND, "amount": 3997})
    assert r.status_code == 200, r.text
    body = httpx.get(f"{server}/_twice/trials/{t['id']}/verdict").json()
    metrics = body["metrics"]
    assert (metrics["completed"], metrics["wrong"], metrics["wrong_effects"]) == (0.0, 1.0, 1.0)
    assert "wrong values: re_1: amount 3997, asked 499" in body["explanation"]
    assert body["evidence"]["intents"][0]["wrong"] == ["re_1"]


def test_serve_lost_reply_is_a_real_read_timeout(server: str, trial: Callable[..., Any]) -> None:
    t = trial(fault="lost_reply")  # the default hold: far longer than this client waits
    url = f"{t['urls']['payments']}/v1/refunds"
    start = time.monotonic()
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(url, json=REFUND, timeout=1)
    assert time.monotonic() - start >= 1.0
    # The service committed before holding the reply.
    assert refunds(server, t) == ["re_1"]
    assert ledger(server, t)["attempts"][0]["delivered"] is False


def test_serve_timeout_before_commit_times_out_and_does_nothing(
    server: str, trial: Callable[..., Any]
) -> None:
    t = trial(fault="timeout_before_commit")
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{t['urls']['payments']}/v1/refunds", json=REFUND, timeout=1)
    assert refunds(server, t) == []
    assert verdict(server, t)["completed"] == 0.0


def test_serve_held_reply_is_closed_after_the_trials_bound(
    server: str, trial: Callable[..., Any]
) -> None:
    # A client that waits longer than hang_seconds sees the connection closed, no reply.
    t = trial(fault="lost_reply", hang_seconds=1)
    start = time.monotonic()
    with pytest.raises(httpx.RemoteProtocolError):
        httpx.post(f"{t['urls']['payments']}/v1/refunds", json=REFUND, timeout=30)
    assert 1.0 <= time.monotonic() - start < 10
    assert refunds(server, t) == ["re_1"]


def test_serve_default_bound_is_the_servers_own() -> None:
    with running_server(hang_seconds=1) as running:
        r = httpx.post(
            f"{running.url}/_twice/trials", json={"task": "refund", "fault": "lost_reply"}
        )
        t = r.json()
        assert t["hang_seconds"] == 1.0
        start = time.monotonic()
        with pytest.raises(httpx.RemoteProtocolError):
            httpx.post(f"{t['urls']['payments']}/v1/refunds", json=REFUND, timeout=30)
        assert time.monotonic() - start < 10


def test_serve_refuses_a_bound_out_of_range() -> None:
    with pytest.raises(ServeError, match=r"--hang-seconds 0 must be a number in \(0, 600\]"):
        _prepare("127.0.0.1", 0, ":memory:", None, [], hang_seconds=0)


def test_serve_held_reply_holds_only_the_faulted_reply(
    server: str, trial: Callable[..., Any]
) -> None:
    t = trial(fault="lost_reply", hang_seconds=3)
    url = f"{t['urls']['payments']}/v1/refunds"
    with pytest.raises(requests.exceptions.ReadTimeout):
        requests.post(url, json=REFUND, headers={"Idempotency-Key": "h"}, timeout=(5, 1))
    start = time.monotonic()
    r = requests.post(url, json=REFUND, headers={"Idempotency-Key": "h"}, timeout=(5, 1))
    assert r.json()["id"] == "re_1" and time.monotonic() - start < 1.0
    assert refunds(server, t) == ["re_1"]


def test_serve_same_key_concurrent_posts_make_one_refund(
    server: str, trial: Callable[..., Any]
) -> None:
    t = trial()
    url = f"{t['urls']['payments']}/v1/refunds"

    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=30) as client:
            return await asyncio.gather(
                *(
                    client.post(url, json=REFUND, headers={"Idempotency-Key": "same"})
                    for _ in range(50)
                )
            )

    responses = asyncio.run(burst())
    assert {r.json()["id"] for r in responses} == {"re_1"}
    assert refunds(server, t) == ["re_1"]


# -- the official Stripe SDK -------------------------------------------------------------


@pytest.fixture
def stripe_sdk() -> Iterator[Callable[[str, float], None]]:
    """Point the module-level Stripe API at a trial: ``point(payments_url, timeout)``."""
    saved = (
        stripe.api_key,
        stripe.api_base,
        stripe.default_http_client,
        stripe.max_network_retries,
    )

    def point(url: str, timeout: float = 5) -> None:
        stripe.api_key = "sk_test_twice_not_a_secret"
        stripe.api_base = url
        stripe.default_http_client = stripe.RequestsClient(timeout=timeout)

    yield point
    stripe.api_key, stripe.api_base, stripe.default_http_client, stripe.max_network_retries = saved


def test_stripe_sdk_default_retries_refund_once(
    server: str, trial: Callable[..., Any], stripe_sdk: Callable[[str, float], None]
) -> None:
    t = trial(fault="reset_after_commit")
    stripe_sdk(t["urls"]["payments"], 5)
    refund = stripe.Refund.create(payment_intent="order_1042", amount=499)
    assert (refund.id, refund.amount, refund.payment_intent, refund.object) == (
        "re_1",
        499,
        "order_1042",
        "refund",
    )
    attempts = ledger(server, t)["attempts"]
    # The SDK's own retry reused its auto-generated key: the saved reply was replayed.
    assert attempts[0]["key"] == attempts[1]["key"] and attempts[1]["replayed"]
    assert refunds(server, t) == ["re_1"]
    assert [r.id for r in stripe.Refund.list(payment_intent="order_1042").data] == ["re_1"]
    assert verdict(server, t)["exactly_once"] == 1.0


def test_stripe_sdk_application_retry_refunds_twice(
    server: str, trial: Callable[..., Any], stripe_sdk: Callable[[str, float], None]
) -> None:
    t = trial(fault="reset_after_commit")
    stripe_sdk(t["urls"]["payments"], 5)
    stripe.max_network_retries = 0
    made = None
    for _ in range(2):  # the application's own retry: every call gets a new key
        try:
            made = stripe.Refund.create(charge="order_1042", amount=499)
            break
        except stripe.APIConnectionError:
            continue
    assert made is not None and made.id == "re_2"
    assert refunds(server, t) == ["re_1", "re_2"]
    assert verdict(server, t)["duplicated"] == 1.0


def test_stripe_sdk_full_refund_without_amount_and_its_metadata(
    server: str, trial: Callable[..., Any], stripe_sdk: Callable[[str, float], None]
) -> None:
    # The failing path: without amount (Stripe: refund what is left) the SDK got a 400, "got
    # None", and metadata was dropped ({} in the reply).
    t = trial()
    stripe_sdk(t["urls"]["payments"], 5)
    stripe.max_network_retries = 0
    first = stripe.Refund.create(payment_intent="order_1042", amount=997)
    rest = stripe.Refund.create(payment_intent="order_1042", metadata={"ticket": "T-7"})
    assert (first.amount, rest.amount, rest.metadata.to_dict()) == (997, 3000, {"ticket": "T-7"})
    # Once nothing is left, another full refund is a Stripe error, never a second effect.
    with pytest.raises(stripe.InvalidRequestError, match="already been refunded in full"):
        stripe.Refund.create(payment_intent="order_1042")
    assert refunds(server, t) == ["re_1", "re_2"]


def test_stripe_sdk_hang_times_out_then_retries_once(
    server: str, trial: Callable[..., Any], stripe_sdk: Callable[[str, float], None]
) -> None:
    t = trial(fault="lost_reply", hang_seconds=3)
    stripe_sdk(t["urls"]["payments"], 1)
    start = time.monotonic()
    refund = stripe.Refund.create(payment_intent="order_1042", amount=499)
    assert time.monotonic() - start >= 1.0  # a real read timeout came first
    assert refund.id == "re_1"
    assert refunds(server, t) == ["re_1"]


def test_stripe_sdk_sees_stripe_errors(
    server: str, trial: Callable[..., Any], stripe_sdk: Callable[[str, float], None]
) -> None:
    t = trial()
    stripe_sdk(t["urls"]["payments"], 5)
    with pytest.raises(stripe.InvalidRequestError, match="No such order") as missing:
        stripe.Refund.create(payment_intent="order_9999", amount=499)
    assert missing.value.http_status == 404
    stripe.Refund.create(payment_intent="order_1042", amount=499, idempotency_key="one")
    # twice answers a reused key with other parameters 422 (the IETF idempotency-key draft);
    # Stripe itself says 400, so the SDK raises its generic APIError with the message.
    with pytest.raises(stripe.APIError, match="Keys for idempotent requests") as reused:
        stripe.Refund.create(payment_intent="order_1042", amount=500, idempotency_key="one")
    assert reused.value.http_status == 422
    assert refunds(server, t) == ["re_1"]


def test_request_log_never_stores_the_api_key(
    tmp_path: Path, stripe_sdk: Callable[[str, float], None]
) -> None:
    db = tmp_path / "serve.sqlite"
    with running_server(db) as running:
        r = httpx.post(f"{running.url}/_twice/trials", json={"task": "refund"})
        stripe_sdk(r.json()["urls"]["payments"], 5)
        stripe.Refund.create(payment_intent="order_1042", amount=499)
    rows = sqlite3.connect(db).execute("SELECT data FROM log").fetchall()
    text = " ".join(row[0] for row in rows)
    assert "payment_intent=order_1042" in text
    assert "sk_test" not in text and "authorization" not in text.lower()


# -- MCP ---------------------------------------------------------------------------------


async def _mcp_session(url: str, calls: list[tuple[str, dict[str, Any]]]) -> tuple[Any, list[Any]]:
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    async with (
        streamable_http_client(url) as (read, write, *_),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        tools = await session.list_tools()
        results = [await session.call_tool(name, args) for name, args in calls]
    return tools, results


def test_mcp_client_drives_a_trial(server: str, trial: Callable[..., Any]) -> None:
    t = trial(fault="lost_reply")
    args = {"order_id": "order_1042", "amount": 4.99, "reason": "cracked"}
    tools, results = asyncio.run(
        _mcp_session(
            t["urls"]["mcp"],
            [
                ("issue_refund", args),
                ("issue_refund", args),
                ("find_refunds", {"order_id": "order_1042"}),
            ],
        )
    )
    by_name = {tool.name: tool for tool in tools.tools}
    assert set(by_name) == {"issue_refund", "find_refunds", "get_order"}
    refund_hints = by_name["issue_refund"].annotations
    assert refund_hints.destructive_hint is True and refund_hints.idempotent_hint is False
    assert by_name["find_refunds"].annotations.read_only_hint is True
    assert (
        "order to refund"
        in by_name["issue_refund"].input_schema["properties"]["order_id"]["description"]
    )
    lost, again, found = results
    assert lost.is_error and UNKNOWN_OUTCOME in lost.content[0].text
    assert not again.is_error and "re_2" in again.content[0].text
    assert "re_1" in found.content[0].text and "re_2" in found.content[0].text
    assert refunds(server, t) == ["re_1", "re_2"]
    assert verdict(server, t)["duplicated"] == 1.0


def test_mcp_annotations_follow_the_idempotency_class() -> None:
    def spec(cls: Any) -> ToolSpec:
        return ToolSpec("t", cls)

    assert tool_annotations(None, "bare").read_only_hint is True
    assert tool_annotations(spec("safe"), "bare").idempotent_hint is True
    keyed_bare = tool_annotations(spec("keyed"), "bare")
    assert keyed_bare.destructive_hint is True and keyed_bare.idempotent_hint is False
    assert tool_annotations(spec("keyed"), "intent-key").idempotent_hint is True
    assert tool_annotations(spec("unsafe"), "declared").idempotent_hint is False
    assert tool_annotations(spec("compensable"), "declared").destructive_hint is True


# -- durability --------------------------------------------------------------------------


def test_restart_rebuilds_a_trial_logged_with_the_retired_lost_reply_mode(tmp_path: Path) -> None:
    db = tmp_path / "old.sqlite"
    log = RequestLog(db)
    old = {"task": "refund", "sample": "refund-001", "fault": "lost_reply", "protection": "bare"}
    log.append("t1", "create", {**old, "lost_reply": "drop", "hang_seconds": 2.0})
    log.close()
    with running_server(db) as running:
        assert running.app.trials["t1"].config.fault == "lost_reply"


def test_restart_on_the_same_db_rebuilds_every_trial(tmp_path: Path) -> None:
    db = tmp_path / "serve.sqlite"
    args = {"order_id": "order_1042", "amount": 4.99, "reason": "cracked"}
    with running_server(db) as running:
        url = running.url
        a = httpx.post(
            f"{url}/_twice/trials", json={"task": "refund", "fault": "reset_after_commit"}
        ).json()
        b = httpx.post(
            f"{url}/_twice/trials",
            json={"task": "refund", "fault": "lost_reply", "protection": "intent-key"},
        ).json()
        gone = httpx.post(f"{url}/_twice/trials", json={"task": "send_email"}).json()
        with pytest.raises(httpx.RemoteProtocolError):
            httpx.post(f"{a['urls']['payments']}/v1/refunds", json=REFUND)
        httpx.post(f"{a['urls']['payments']}/v1/refunds", json=REFUND)
        asyncio.run(_mcp_session(b["urls"]["mcp"], [("issue_refund", args)] * 2))
        httpx.delete(f"{url}/_twice/trials/{gone['id']}")
        before = {t["id"]: ledger(url, t) for t in (a, b)}
        contexts = {tid: running.app.trials[tid].ctx.snapshot() for tid in before}
    assert before[b["id"]]["observations"], "MCP tool results are part of the ledger"
    with running_server(db) as again:
        assert set(again.app.trials) == {a["id"], b["id"]}
        for t in (a, b):
            assert again.app.trials[t["id"]].ctx.snapshot() == contexts[t["id"]]
            led = again.app.trials[t["id"]].services.ledger.to_dict()
            assert json.loads(json.dumps(led)) == before[t["id"]]
        # The intent key survives: the model's repeat over MCP still refunds once.
        _, results = asyncio.run(
            _mcp_session(f"{again.url}/t/{b['id']}/mcp", [("issue_refund", args)])
        )
        assert "re_1" in results[0].content[0].text
        assert [e["id"] for e in ledger(again.url, b)["effects"]] == ["re_1"]
