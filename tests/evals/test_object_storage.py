"""Log directories in object storage: run, report and gate through moto's S3 server.

The server is moto's, on 127.0.0.1 (an ephemeral port), started and stopped by the fixture;
credentials are dummies. Nothing reaches a real cloud.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

pytest.importorskip("s3fs", reason="the s3 extra (pip install 'twice[s3]') is not installed")
moto_server = pytest.importorskip("moto.server", reason="moto[server] is not installed")

Twice = Callable[..., Any]

RUN = [
    "--model", "stub/retry", "--model", "stub/verify", "--task", "refund",
    "--fault", "lost_reply", "--limit", "2", "--display", "none",
]  # fmt: skip
GATE = '[[rule]]\nmetric = "duplication_rate"\nmax = 0.5\n'


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A moto S3 server on 127.0.0.1 with an empty bucket ``twice``; yields an s3fs filesystem.

    moto keeps its buckets in process memory, shared by every server it starts: the fixture
    empties them again when it stops.
    """
    import s3fs
    from moto.backends import get_backend

    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    for key, value in {
        "AWS_ENDPOINT_URL": f"http://{host}:{port}",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    # fsspec caches filesystem instances: one made for an earlier server would point there.
    s3fs.S3FileSystem.clear_instance_cache()
    fs = s3fs.S3FileSystem()
    fs.mkdir("twice")
    try:
        yield fs
    finally:
        s3fs.S3FileSystem.clear_instance_cache()
        server.stop()
        for backend in get_backend("s3").values():
            backend.reset()


def test_storage_helpers_keep_uris(s3: Any) -> None:
    from twice.reports import as_location, is_remote, join, name_of, parent_of, read_text
    from twice.reports import write_text as put

    assert as_location("s3://twice/run/") == "s3://twice/run"
    assert as_location("s3://") == "s3://" and is_remote(as_location("s3://"))
    assert join("s3://twice/run", "shard-1-of-2", "x.eval") == "s3://twice/run/shard-1-of-2/x.eval"
    assert is_remote("s3://twice/x") and not is_remote("file:///tmp/x")
    assert not is_remote("logs/run")
    put("s3://twice/a/b.json", "{}")
    assert read_text("s3://twice/a/b.json") == "{}"
    assert name_of("s3://twice/a/b.json") == "b.json"
    assert parent_of("s3://twice/a/b.json") == "s3://twice/a"


@pytest.mark.slow
def test_run_report_gate_round_trip_through_s3(s3: Any, twice: Twice, tmp_path: Any) -> None:
    uri = "s3://twice/runs/one"
    result = twice("run", *RUN, "--log-dir", uri)
    assert result.exit_code == 0, result.output
    names = {p.rsplit("/", 1)[-1] for p in s3.find("twice/runs/one")}
    assert {"summary.json", "report.html", "eval-set.json"} <= names
    assert sum(n.endswith(".eval") for n in names) == 2
    assert not (tmp_path / "s3:").exists()  # never mangled into a local s3:/twice/... path
    summary = json.loads(s3.cat("twice/runs/one/summary.json"))
    dup = {c["model"]: c["duplication_rate"] for c in summary["cells"]}
    assert dup == {"stub/retry": 1.0, "stub/verify": 0.0}

    s3.rm("twice/runs/one/report.html")
    report = twice("report", uri)
    assert report.exit_code == 0, report.output
    assert "stub/verify" in s3.cat("twice/runs/one/report.html").decode()

    (tmp_path / "gate.toml").write_text(GATE)
    junit = f"{uri}/gate.xml"
    gate = twice("gate", uri, "--config", tmp_path / "gate.toml", "--junit", junit)
    assert gate.exit_code == 1, gate.output  # stub/retry duplicates every time
    assert "2 log(s), 4 trial(s)" in gate.stdout
    # --junit to the bucket, as report -o does (it wrote ./s3:/twice/... on local disk)
    assert b"<testsuite" in s3.cat("twice/runs/one/gate.xml")
    assert f"junit:  {junit}" in gate.stdout and not (tmp_path / "s3:").exists()

    # Resuming into the bucket reuses the finished logs instead of running them again.
    again = twice("run", *RUN, "--log-dir", uri, "--no-report")
    assert again.exit_code == 0, again.output
    assert sum(p.endswith(".eval") for p in s3.find("twice/runs/one")) == 2


def test_storage_that_cannot_be_used_is_one_line_and_exit_2(
    s3: Any, twice: Twice, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A missing bucket or a dead endpoint ended in a 60-160-line traceback with exit 1,
    # which from `twice gate` reads as "the gate failed".
    import s3fs

    (tmp_path / "gate.toml").write_text(GATE)
    result = twice("run", *RUN, "--log-dir", "s3://nobucket/run")
    assert result.exit_code == 2, result.output
    assert "bucket 'nobucket' does not exist" in result.stderr
    assert "Traceback" not in result.output
    # With --workers it was every worker's usage error, wrapped in the run's.
    result = twice("run", *RUN, "--workers", "2", "--log-dir", "s3://nobucket/run")
    assert result.exit_code == 2, result.output
    assert "bucket 'nobucket' does not exist" in result.stderr
    assert "worker 1/2" not in result.stderr and "Usage: python" not in result.stderr
    # A URI with no bucket became the local path "s3:": the run wrote ./s3:/ and exited 0.
    monkeypatch.chdir(tmp_path)
    result = twice("run", *RUN, "--log-dir", "s3://")
    assert result.exit_code == 2, result.output
    assert "names no bucket" in result.stderr and not (tmp_path / "s3:").exists()
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        dead = sock.getsockname()[1]
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{dead}")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    s3fs.S3FileSystem.clear_instance_cache()
    for args in (
        ("gate", "s3://twice/run", "--config", tmp_path / "gate.toml"),
        ("report", "s3://twice/run"),
        ("run", *RUN, "--log-dir", "s3://twice/run"),
    ):
        result = twice(*args)
        assert result.exit_code == 2, (args, result.output)
        assert "s3://twice/run' cannot be used" in result.stderr, result.stderr
        assert "Traceback" not in result.output


@pytest.mark.slow
def test_shards_and_workers_through_s3(s3: Any, twice: Twice, tmp_path: Any) -> None:
    uri = "s3://twice/runs/sharded"
    (tmp_path / "gate.toml").write_text(GATE)
    assert twice("run", *RUN, "--no-report", "--shard", "1/2", "--log-dir", uri).exit_code == 0
    missing = twice("gate", uri, "--config", tmp_path / "gate.toml")
    assert missing.exit_code == 2
    assert "shard-2-of-2" in missing.output
    assert twice("run", *RUN, "--no-report", "--shard", "2/2", "--log-dir", uri).exit_code == 0
    gate = twice("gate", uri, "--config", tmp_path / "gate.toml")
    assert gate.exit_code == 1, gate.output
    merged = json.loads(s3.cat("twice/runs/sharded/summary.json"))
    assert merged["run"]["shards"] == {"count": 2, "dirs": ["shard-1-of-2", "shard-2-of-2"]}
    assert len(merged["cells"]) == 2

    # Workers are separate processes: they reach the bucket through the same environment.
    proc = subprocess.run(
        [sys.executable, "-m", "twice.evals.cli", "run", *RUN, "--workers", "2",
         "--log-dir", "s3://twice/runs/workers"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    workers = json.loads(s3.cat("twice/runs/workers/summary.json"))
    assert [c["duplication_rate"] for c in workers["cells"]] == [
        c["duplication_rate"] for c in merged["cells"]
    ]
    assert s3.exists("twice/runs/workers/report.html")


def test_a_runs_workers_fork_past_fsspecs_io_threads_but_not_past_another_thread(
    s3: Any,
) -> None:
    # A run into a bucket has started fsspec's IO thread (and its loop's resolver threads)
    # before its first worker: counted, they would make every worker a fresh interpreter.
    # A process of its own, as `twice run` is: this one has moto's server thread.
    script = "import s3fs\nfrom twice.evals.scale._processes import _can_fork\n"
    script += "s3fs.S3FileSystem().ls('twice')\nprint(_can_fork())\n"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.stdout.split() == ["True"], done.stderr[-2000:]
    import fsspec.asyn
    from twice.evals.scale._processes import _fsspec_io_threads, _threads_a_fork_could_break

    s3.ls("twice")
    fsspec_threads = _fsspec_io_threads()
    assert fsspec.asyn.iothread[0] is not None
    assert fsspec.asyn.iothread[0].ident in fsspec_threads
    assert len(fsspec_threads) >= 2, "the loop's executor threads are no longer found"
    blocking = {t.ident for t in _threads_a_fork_could_break()}
    assert not blocking & fsspec_threads
    # Where fsspec keeps its threads elsewhere, they count again, as any other thread does.
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fsspec.asyn, "iothread", None)
        assert _fsspec_io_threads() == set()
        assert fsspec.asyn.loop[0] is not None
    stop = threading.Event()
    other = threading.Thread(target=stop.wait, name="someone-elses")
    other.start()
    try:
        assert other in _threads_a_fork_could_break()
    finally:
        stop.set()
        other.join()


# -- the cluster recipe (docs/cluster), run here as far as one machine allows -------------------

CLUSTER = Path(__file__).parents[2] / "docs" / "cluster"
TINY_SUITE = """\
limit = 1
[[matrix]]
models = ["stub/retry", "stub/verify"]
tasks = ["refund"]
faults = ["lost_reply", "none"]
"""
TINY_GATE = '[[rule]]\nmetric = "completion_rate"\nmin = 0.0\n'
RUN_SHARDS = 2
"""Shards the recipe tests run: each is a process of its own, and two show the split."""


def _sh(script: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run a recipe's shell step with twice's own interpreter first on PATH."""
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    return subprocess.run(
        ["/bin/sh", "-c", script],
        env={**os.environ, **env, "PATH": path},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=900,
    )


def _recipe_env(tmp_path: Path, log_dir: str) -> dict[str, str]:
    (tmp_path / "suite.toml").write_text(TINY_SUITE)
    (tmp_path / "gate.toml").write_text(TINY_GATE)
    # The recipes' suite and gate, swapped for tiny ones; everything else as written.
    return {"SUITE": "suite.toml", "EPOCHS": "1", "GATE": "gate.toml", "LOG_DIR": log_dir}


def _merged_ok(s3: Any, prefix: str, shards: int) -> None:
    merged = json.loads(s3.cat(f"{prefix}/summary.json"))
    assert merged["run"]["shards"]["count"] == shards
    assert sorted((c["model"], c["fault"]) for c in merged["cells"]) == [
        ("stub/retry", "lost_reply"),
        ("stub/retry", "none"),
        ("stub/verify", "lost_reply"),
        ("stub/verify", "none"),
    ]


@pytest.mark.slow
def test_github_actions_recipe(s3: Any, tmp_path: Path) -> None:
    """The workflow's own steps, run as its jobs would be, with RUN_SHARDS shards.

    The workflow's SHARDS is checked against its matrix; the shard step then runs with
    RUN_SHARDS, since a step's script and the merge read the count from SHARDS alone: two
    shards prove the split and the merge as four do, in half the processes.
    """
    workflow = yaml.safe_load((CLUSTER / "github-actions.yml").read_text())
    declared = int(workflow["env"]["SHARDS"])
    job = workflow["jobs"]["shard"]
    assert job["strategy"]["matrix"]["shard"] == list(range(1, declared + 1))
    shards = min(declared, RUN_SHARDS)
    assert workflow["jobs"]["report-and-gate"]["needs"] == "shard"
    step = next(s for s in job["steps"] if "twice run" in s.get("run", ""))
    env = _recipe_env(tmp_path, "s3://twice/gha/run-1")
    assert workflow["env"]["LOG_DIR"].startswith("s3://")

    # The report job first: with no shard yet it must refuse, not pass on nothing.
    final = next(
        s["run"]
        for s in workflow["jobs"]["report-and-gate"]["steps"]
        if "twice report" in s.get("run", "")
    )
    assert _sh(final, env, tmp_path).returncode == 2
    for shard in range(1, shards + 1):
        script = step["run"].replace("${{ matrix.shard }}", str(shard))
        done = _sh(script, {**env, "SHARDS": str(shards)}, tmp_path)
        assert done.returncode == 0, done.stderr
    result = _sh(final, env, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "report.html").is_file() and (tmp_path / "gate.xml").is_file()
    _merged_ok(s3, "twice/gha/run-1", shards)


@pytest.mark.slow
def test_kubernetes_recipe(s3: Any, tmp_path: Path) -> None:
    """The Indexed Job's pod command, run once per index with RUN_SHARDS shards, then the
    final Job's (the manifest's completions are checked against its SHARDS, as in the
    GitHub Actions recipe)."""
    docs = list(yaml.safe_load_all((CLUSTER / "kubernetes.yaml").read_text()))
    shards_job, final_job = docs
    spec = shards_job["spec"]
    assert spec["completionMode"] == "Indexed"
    # One pod per index at a time: a replacement waits for the stopping pod to end.
    assert spec["podReplacementPolicy"] == "Failed"
    container = spec["template"]["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert spec["completions"] == int(env["SHARDS"])
    shards = min(int(env["SHARDS"]), RUN_SHARDS)
    run_env = _recipe_env(tmp_path, "s3://twice/k8s/run-1")
    # Kubernetes gives each pod its index in JOB_COMPLETION_INDEX, from 0.
    for index in range(shards):
        pod_env = {**run_env, "SHARDS": str(shards), "JOB_COMPLETION_INDEX": str(index)}
        done = _sh(container["args"][0], pod_env, tmp_path)
        assert done.returncode == 0, done.stderr
    final = final_job["spec"]["template"]["spec"]["containers"][0]["args"][0]
    result = _sh(final, run_env, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert s3.exists("twice/k8s/run-1/report.html")
    _merged_ok(s3, "twice/k8s/run-1", shards)


# -- one run per directory in object storage: the lease ---------------------------------------


@pytest.fixture
def quick_lease(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The lease's clock sped up: renewals every 0.2 s, a holder dead after 1.5 s unrenewed."""
    from twice.evals.locks import _lock

    monkeypatch.setattr(_lock, "LEASE_RENEW", 0.2)
    monkeypatch.setattr(_lock, "LEASE_POLL", 0.05)
    monkeypatch.setattr(_lock, "LEASE_TTL", 1.5)
    return _lock


def _leases(s3: Any, prefix: str) -> dict[str, dict[str, Any]]:
    return {
        p.rsplit("/", 1)[-1]: json.loads(s3.cat(p))
        for p in s3.find(prefix)
        if p.rsplit("/", 1)[-1].startswith(".twice-lease-")
    }


def _busy(holder: str) -> Exception:
    return RuntimeError(f"busy: {holder}")


def test_a_second_run_into_a_leased_directory_exits_2_naming_the_holder(
    s3: Any, twice: Twice, quick_lease: Any
) -> None:
    # Two runs into one bucket directory (a retried Kubernetes pod beside the one still
    # stopping) both ran every cell: the directory lock was a local fcntl lock only.
    uri = "s3://twice/runs/leased"
    s3.mkdir("twice/runs/leased")
    with quick_lease.hold_lease(uri, _busy, lost=lambda: None):
        held = _leases(s3, "twice/runs/leased")
        assert list(held) == [".twice-lease-1"] and held[".twice-lease-1"]["pid"] == os.getpid()
        second = twice("run", *RUN, "--log-dir", uri)
        assert second.exit_code == 2, second.output
        assert "is in use by another twice run" in second.stderr
        assert f"pid {os.getpid()} on {socket.gethostname()}" in second.stderr
        assert not any(p.endswith(".eval") for p in s3.find("twice/runs/leased"))
    # Released: the next run takes the lease at once, and leaves it released in turn.
    after = twice("run", *RUN, "--log-dir", uri, "--no-report")
    assert after.exit_code == 0, after.output
    assert "watching the lease" not in after.stderr
    assert sum(p.endswith(".eval") for p in s3.find("twice/runs/leased")) == 2
    leases = _leases(s3, "twice/runs/leased")
    assert list(leases) == [".twice-lease-2"] and leases[".twice-lease-2"]["released"] is True


@pytest.mark.slow
def test_two_twice_runs_into_one_bucket_directory_run_its_cells_once(s3: Any, twice: Twice) -> None:
    # Two processes, as a retried Kubernetes pod beside the one still stopping: before the
    # lease the second ran every cell again into the same directory (exit 0, 2 logs).
    uri = "s3://twice/runs/twice-at-once"
    slow = ["--model", "stub/retry", "--task", "refund", "--fault", "lost_reply", "--limit", "1"]
    slow += ["-M", "delay=5", "--display", "none", "--no-report"]
    first = subprocess.Popen(
        [sys.executable, "-m", "twice.evals.cli", "run", *slow, "--log-dir", uri],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not s3.find("twice/runs/twice-at-once"):  # started: the lease, or a first log
            assert first.poll() is None and time.monotonic() < deadline, first.communicate()
            time.sleep(0.1)
        second = twice("run", *slow, "--log-dir", uri)  # the lease's own timings
        assert second.exit_code == 2, second.output
        assert first.poll() is None, "the first run ended before the second was refused"
        assert f"pid {first.pid} on {socket.gethostname()}" in second.stderr
        assert "watching the lease for up to 30 s" in second.stderr
        _, err = first.communicate(timeout=120)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 0, err
    assert sum(p.endswith(".eval") for p in s3.find("twice/runs/twice-at-once")) == 1
    summary = json.loads(s3.cat("twice/runs/twice-at-once/summary.json"))
    assert summary["complete"] is True and summary["cells"][0]["trials"] == 1


@pytest.mark.slow
def test_a_workers_run_into_a_leased_shard_directory_exits_2_as_one_process_does(
    s3: Any, quick_lease: Any
) -> None:
    # A --workers run's leases are its workers', one per shard directory.
    uri = "s3://twice/runs/workers-leased"
    s3.mkdir("twice/runs/workers-leased/shard-1-of-2")
    with quick_lease.hold_lease(f"{uri}/shard-1-of-2", _busy, lost=lambda: None):
        proc = subprocess.run(
            [sys.executable, "-m", "twice.evals.cli", "run", *RUN, "--workers", "2",
             "--log-dir", uri],
            capture_output=True, text=True, timeout=600,
        )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "shard-1-of-2' is in use by another twice run" in proc.stderr
    assert f"pid {os.getpid()} on {socket.gethostname()}" in proc.stderr
    assert "refused the run" not in proc.stderr  # said as one process says it


def test_a_dead_runs_lease_is_taken_over_once_it_goes_unrenewed(
    s3: Any, twice: Twice, quick_lease: Any
) -> None:
    # A run killed outright (SIGKILL, the OOM killer, a lost node) leaves its lease behind and
    # never renews it again.
    uri = "s3://twice/runs/orphan"
    dead = {"pid": 4_000_000, "host": "gone", "started": "2026-12-05T00:00:00+00:00"}
    s3.pipe("twice/runs/orphan/.twice-lease-3", json.dumps(dead).encode())
    result = twice("run", *RUN, "--log-dir", uri, "--no-report")
    assert result.exit_code == 0, result.output
    assert "is leased to pid 4000000 on gone" in result.stderr
    assert list(_leases(s3, "twice/runs/orphan")) == [".twice-lease-4"]


def test_of_two_runs_taking_over_one_dead_lease_exactly_one_wins(s3: Any, quick_lease: Any) -> None:
    uri = "s3://twice/runs/race"
    s3.pipe("twice/runs/race/.twice-lease-1", b'{"pid": 1, "host": "gone", "started": "x"}')
    start = threading.Barrier(2)
    outcomes: list[str] = []

    def contender(name: str) -> None:
        start.wait()
        try:
            with quick_lease.hold_lease(uri, _busy, lost=lambda: outcomes.append("lost")):
                outcomes.append(f"held {name}")
                time.sleep(2.0)  # renewing, while the other watches
        except RuntimeError as ex:
            outcomes.append(str(ex).split(":")[0])

    threads = [threading.Thread(target=contender, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert sorted(o.split()[0] for o in outcomes) == ["busy", "held"], outcomes


def test_a_holder_whose_lease_lapsed_learns_it_at_its_next_renewal(
    s3: Any, quick_lease: Any
) -> None:
    uri = "s3://twice/runs/lapsed"
    s3.mkdir("twice/runs/lapsed")
    lost = threading.Event()
    with quick_lease.hold_lease(uri, _busy, lost=lost.set):
        assert not lost.wait(0.6)  # renewing its own lease is no loss
        # What a run that found this one unrenewed for the TTL (stalled: a paused VM) does.
        s3.pipe("twice/runs/lapsed/.twice-lease-2", b'{"pid": 2, "host": "h", "started": "x"}')
        assert lost.wait(5)
    # The new holder's lease is left alone, and the old one is not marked released over it.
    leases = _leases(s3, "twice/runs/lapsed")
    assert leases[".twice-lease-2"] == {"pid": 2, "host": "h", "started": "x"}
    assert "released" not in leases[".twice-lease-1"]


def test_a_store_without_atomic_create_runs_unleased_with_a_warning(
    quick_lease: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    # fsspec leaves mode "x" to each backend (checked up front, or not at all): a lease that
    # two runs could both create would be a promise twice does not keep.
    with quick_lease.hold_lease("memory://twice/plain", _busy, lost=lambda: None):
        pass
    warning = capsys.readouterr().err
    assert "warning: log directory 'memory://twice/plain' cannot be leased" in warning
    assert "memory:// has no atomic create-if-absent" in warning
