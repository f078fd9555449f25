"""Fixtures for the documentation site's tests: the site built once, a browser, a server."""

from __future__ import annotations

import functools
import http.server
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).parents[2]


@pytest.fixture(scope="session")
def built_site(made_once: Callable[[str, Callable[[Path], None]], Path]) -> Path:
    """The site as ``make docs`` builds it (``mkdocs build --strict``), in a folder of its own
    (built once per test run, whichever worker asks first)."""

    def build(site: Path) -> None:
        env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
        done = subprocess.run(
            [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
            cwd=ROOT, capture_output=True, text=True, env=env,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-4000:]

    return made_once("site", build)


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def site_server(built_site: Path) -> Iterator[str]:
    """The built site over HTTP on 127.0.0.1 (an ephemeral port): its base URL."""
    handler = functools.partial(_Quiet, directory=str(built_site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
