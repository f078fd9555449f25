"""Every kind of bad input is one line naming the value and exit 2: no traceback, no hang,
nothing written; and a credential in ``-M`` (at any depth, in a URL) is refused unseen."""

from __future__ import annotations

import importlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from twice.evals import SuiteError, check_model_args

Twice = Callable[..., Any]
SECRET = "S3CRET-value-42"


def _run(twice: Twice, log_dir: Path, *args: str | Path) -> Any:
    return twice("run", "--log-dir", log_dir, "--display", "none", "--limit", "1", *args)


def _one_line_exit_2(result: Any, expected: str) -> None:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert expected in " ".join(result.stderr.split()), result.stderr


ALIAS_BOMB = (
    f"[&a0 [{', '.join(['1'] * 9)}], "
    + ", ".join(f"&a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 7))
    + "]"
)  # no braces: the parametrized args are str.format-ed
"""A YAML value of a few hundred bytes that stands for 9**7 items."""


@pytest.fixture
def files(tmp_path: Path) -> Path:
    """Bad files: a directory, a FIFO, binary bytes, TOML of the wrong shapes."""
    (tmp_path / "adir").mkdir()
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "binary.toml").write_bytes(bytes(range(128, 256)) * 4)
    toml = {
        "matrix-ints.toml": "matrix = [1, 2]\n",
        "limit0.toml": "limit = 0\n[[matrix]]\nmodels = ['stub/retry']\n",
        "limit-1.toml": "limit = -1\n[[matrix]]\nmodels = ['stub/retry']\n",
        "epochs-bool.toml": "epochs = true\n[[matrix]]\nmodels = ['stub/retry']\n",
        "limit-bool.toml": "limit = false\n[[matrix]]\nmodels = ['stub/retry']\n",
        "limit-float.toml": "limit = 2.0\n[[matrix]]\nmodels = ['stub/retry']\n",
        "models-string.toml": "[[matrix]]\nmodels = 'stub/retry'\n",
    }
    for name, text in toml.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "has-dir-report" / "report.html").mkdir(parents=True)
    (tmp_path / "has-dir-listing" / "logs.json").mkdir(parents=True)
    (tmp_path / "cmd-agents.toml").write_text(
        "agent_cmd = 'true'\n[[matrix]]\nmodels = ['stub/no-retry']\nagents = ['react']\n"
    )
    (tmp_path / "cmd.toml").write_text(
        "agent_cmd = 'true'\n[[matrix]]\nmodels = ['stub/no-retry']\n"
    )
    (tmp_path / "has-dir-fifo").mkdir()
    os.mkfifo(tmp_path / "has-dir-fifo" / "summary.json")
    return tmp_path


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("--prompt", "{d}/adir"), "prompt file '{d}/adir' is a directory; expected a file"),
        (("--prompt", "{d}/fifo"), "prompt file '{d}/fifo' is not a regular file"),
        (("--config", "{d}/fifo"), "suite file '{d}/fifo' is not a regular file"),
        (("--config", "{d}/adir"), "'{d}/adir' is a directory"),
        (("--config", "{d}/binary.toml"), "suite file '{d}/binary.toml' is not UTF-8 text"),
        (("--config", "{d}/matrix-ints.toml"), "[[matrix]] #1: is 1; expected a table of axes"),
        (("--config", "{d}/limit0.toml"), "'limit' must be a positive integer, got 0"),
        (("--config", "{d}/limit-1.toml"), "'limit' must be a positive integer, got -1"),
        (("--config", "{d}/epochs-bool.toml"), "'epochs' must be a positive integer, got True"),
        (("--config", "{d}/limit-bool.toml"), "'limit' must be a positive integer, got False"),
        (("--config", "{d}/limit-float.toml"), "'limit' must be a positive integer, got 2.0"),
        (("--model", "stub/retry", "-M", "p=[1"), "the value of 'p' is not valid YAML"),
        (("--log-dir", "{d}/binary.toml/logs"), "cannot be created: Not a directory"),
        (("--log-dir", "/proc/twice-logs"), "log directory '/proc/twice-logs' cannot be created"),
        # Grew by ~6 KB a planned trial until the OOM killer ended it, ignoring Ctrl-C.
        (("--epochs", "99999999999999999999"), "before the first ran (inspect plans every"),
        # An empty CI variable ran into a new logs/run-<time> each time, never resuming.
        (("--log-dir", ""), "--log-dir: is empty"),
        # A URI with one slash is a legal local path: the run went into ./s3:/bucket/run.
        (("--log-dir", "s3:/bucket/run"), "'s3:/bucket/run' is a URI with one slash after its "
         "scheme, which would be a local directory of that name: write 's3://bucket/run'"),
        # Found after every trial had run, as a traceback.
        (("--log-dir", "{d}/has-dir-report"), "report.html' is a directory"),
        # inspect's listing of the logs: found after every trial, as a traceback.
        (("--log-dir", "{d}/has-dir-listing"), "logs.json' is a directory"),
        # Every trial ran, then the summary's write waited on the FIFO for ever.
        (("--log-dir", "{d}/has-dir-fifo"), "summary.json' is not a regular file (a FIFO"),
        # A second command silently replaced the first, which never ran.
        (("--model", "stub/no-retry", "--agent-cmd", "true", "--agent-cmd", "false"),
         "Invalid value for --agent-cmd: given 2 times ('true', 'false'); a run has one"),
        # Accepted, and the run used the command only.
        (("--model", "stub/no-retry", "--agent", "react", "--agent-cmd", "true"),
         "--agent-cmd runs its command as the agent of every trial; it does not combine "
         "with --agent 'react'"),
        # The same in a suite file, and a suite file's command beside --agent: accepted, and
        # only the command ran.
        (("--config", "{d}/cmd-agents.toml"),
         "cmd-agents.toml [[matrix]] #1: 'agents' does not combine with agent_cmd"),
        (("--config", "{d}/cmd.toml", "--agent", "react"),
         "it does not combine with --agent 'react'"),
        # Every trial errored once the eval had started (exit 1).
        (("--model", "stub/no-retry", "--fault", "crash_after_commit", "--agent-cmd", "true"),
         "fault 'crash_after_commit' restarts twice's own agent loop from its checkpoints"),
        # Each of these wrote logs, then every trial errored (exit 1; the port's cause was
        # hidden in an ExceptionGroup).
        (("--model", "openai/"), "model 'openai/' is not an inspect model string"),
        (("--model", "openai/gpt-4o", "-M", "base_url=not-a-url"),
         "-M base_url='not-a-url' is not a usable URL (its scheme is not http or https)"),
        (("--model", "openai/gpt-4o", "-M", "base_url=ftp://127.0.0.1/v1"),
         "its scheme is not http or https); expected an http(s) URL"),
        (("--model", "openai/gpt-4o", "-M", "base_url=http://127.0.0.1:99999/v1"),
         "-M base_url='http://127.0.0.1:99999/v1' is not a usable URL (Port out of range"),
        (("--model", "openai/gpt-4o", "-M", "base_url=http:///v1"), "(it has no host)"),
        # A directory name no listing shows plainly; or one too long to create, found as a
        # traceback.
        (("--log-dir", "{d}/a\nb"), "Invalid value for '--log-dir': '{d}/a\\nb' holds the "
         "control character '\\n'; give a path or URI without newlines"),
        (("--log-dir", "{d}/" + "x" * 256), "has a component of 256 bytes; a file or "
         "directory name may have at most 255"),
        # 9**7 items from a few hundred bytes of YAML aliases: 178 MB of logs.
        (("--model", "stub/retry", "-M", "x=" + ALIAS_BOMB), "Invalid value for -M: the "
         "value of 'x' is larger than 100,000 items and characters written out"),
        (("--model", "stub/retry", "-M", "x=" + "y" * 100_001), "the value of 'x' is larger"),
        # Accepted, and (with as many cells) as many interpreters started at once.
        (("--workers", "5000"), "Invalid value for --workers: 5000 is not in the range 1-"),
        # Taken as a list of one.
        (("--config", "{d}/models-string.toml"), "'models' must be a list of strings, e.g. "
         "models = ['stub/retry'], got a string 'stub/retry'"),
    ],
)  # fmt: skip
def test_bad_input_run_is_one_line_and_exit_2(
    twice: Twice, files: Path, args: tuple[str, ...], expected: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(files)  # a relative path wrongly taken, e.g. ./s3:/..., lands here
    args = tuple(a.format(d=files) for a in args)
    log_dir = files / "logs"
    if "--model" not in args:
        args = ("--model", "stub/retry", "--task", "refund", "--fault", "none", *args)
    result = _run(twice, log_dir, *args)  # the last --log-dir given wins
    _one_line_exit_2(result, expected.format(d=files))
    assert not log_dir.exists()
    assert not list(files.glob("has-dir-*/*.eval"))  # refused before any trial ran


@pytest.mark.parametrize("source", ["cgroup", "ulimit"])
def test_epochs_over_half_a_container_or_ulimit_limit_are_refused(
    twice: Twice, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str
) -> None:
    # The failing path: the check read the machine's physical memory only, so in a 2 GB
    # container on a 64 GB host the kernel's OOM killer, not twice, ended the run.
    import resource

    import twice.evals.run._memory as run_module

    limit = 10_000_000  # 1,000 planned trials (6 MB) are over half of it
    if source == "cgroup":
        (tmp_path / "memory.max").write_text(f"{limit}\n")
        monkeypatch.setattr(run_module, "CGROUP_MEMORY_FILES", (str(tmp_path / "memory.max"),))
        whose = "this container's (cgroup limit) memory, 10 MB"
    else:
        monkeypatch.setattr(run_module, "CGROUP_MEMORY_FILES", ())
        monkeypatch.setattr(resource, "getrlimit", lambda which: (limit, limit))
        whose = "this process's (ulimit -v) memory, 10 MB"
    args = ("--model", "stub/retry", "--task", "refund", "--fault", "none", "--epochs", "1000")
    result = _run(twice, tmp_path / "logs", *args)
    _one_line_exit_2(result, f"1,000 trials in one cell (refund: --epochs 1,000) would take "
                     f"about 6 MB before the first ran (inspect plans every trial up front), "
                     f"over half of {whose}")  # fmt: skip
    assert not (tmp_path / "logs").exists()
    # The machine's own memory, as before, with neither limit set.
    monkeypatch.setattr(run_module, "CGROUP_MEMORY_FILES", ("/nonexistent/memory.max",))
    monkeypatch.setattr(resource, "getrlimit", lambda which: (-1, -1))
    assert run_module.memory_limit()[1] == "this machine's"  # type: ignore[index]


@pytest.mark.parametrize("version", [1, 2])
def test_the_memory_limit_of_a_nested_cgroup_or_its_parent_counts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, version: int
) -> None:
    # The failing path: only the mount's root files were read, which without a cgroup
    # namespace are the host's (unlimited), not the container's.
    import twice.evals.run._memory as run_module

    monkeypatch.setattr(run_module, "CGROUP_MEMORY_FILES", ())
    monkeypatch.setattr(run_module, "CGROUP_ROOT", str(tmp_path))
    proc = tmp_path / "cgroup"
    monkeypatch.setattr(run_module, "PROC_SELF_CGROUP", str(proc))
    if version == 2:
        proc.write_text("0::/jobs/run-1\n")
        (tmp_path / "jobs" / "run-1").mkdir(parents=True)
        (tmp_path / "jobs" / "run-1" / "memory.max").write_text("max\n")
        (tmp_path / "jobs" / "memory.max").write_text("2000000000\n")  # the parent's binds
    else:
        proc.write_text("5:devices:/\n4:memory:/process_api/abc\n0::/\n")
        own = tmp_path / "memory" / "process_api" / "abc"
        own.mkdir(parents=True)
        (own / "memory.limit_in_bytes").write_text("2000000000\n")
    assert run_module.memory_limit() == (2_000_000_000, "this container's (cgroup limit)")


def test_bad_input_unreadable_prompt_file(
    twice: Twice, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Tests may run as root, which reads any file: make the read itself fail.
    prompt = tmp_path / "locked.md"
    prompt.write_text("Be careful.")
    real = Path.read_bytes

    def read_bytes(self: Path) -> bytes:
        if self.name == "locked.md":
            raise PermissionError(13, "Permission denied", str(self))
        return real(self)

    monkeypatch.setattr(Path, "read_bytes", read_bytes)
    result = _run(twice, tmp_path / "logs", "--model", "stub/retry", "--prompt", prompt)
    _one_line_exit_2(result, f"prompt file '{prompt}' cannot be read: Permission denied")


def test_bad_input_unwritable_log_dir(
    twice: Twice, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    real_open = os.open

    def deny(path: Any, *args: Any, **kwargs: Any) -> int:
        if str(path).startswith(str(log_dir)):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", deny)
    result = _run(twice, log_dir, "--model", "stub/retry", "--task", "refund", "--fault", "none")
    _one_line_exit_2(result, f"log directory '{log_dir}' cannot be written: Permission denied")
    assert list(log_dir.iterdir()) == []


def test_bad_input_dataset_record_of_wrong_types(
    twice: Twice, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    refund_module = importlib.import_module("twice.tasks.refund.refund")
    lines = refund_module.DATASET.read_text().splitlines()
    record = json.loads(lines[0])
    record["intents"][0]["expected"] = True  # a boolean where a count belongs
    bad = tmp_path / "dataset.jsonl"
    bad.write_text(json.dumps(record) + "\n")
    monkeypatch.setattr(refund_module, "DATASET", bad)
    result = _run(twice, tmp_path / "logs", "--model", "stub/retry", "--task", "refund")
    _one_line_exit_2(
        result,
        f"task 'refund' cannot be built: {bad}:1: invalid dataset record: "
        "intents.0.expected: Input should be a valid integer (got True)",
    )


@pytest.mark.parametrize(
    ("body", "error"),
    [
        ("open('no_such_dataset.jsonl')", "FileNotFoundError: [Errno 2] No such file or"),
        ("raise RuntimeError('boom from my task')", "RuntimeError: boom from my task"),
        ("{}['contacts']", "KeyError: 'contacts'"),
        # A SystemExit is no Exception: the run ended with its code, and no word.
        ("import sys; sys.exit(3)", "it called sys.exit(3)"),
    ],
)
def test_bad_input_own_task_that_raises_as_it_is_built(
    twice: Twice, tmp_path: Path, body: str, error: str
) -> None:
    # The failing path: only a ValueError was one line; anything else a user's task raised
    # as it was built (a dataset path with a typo) was a traceback and exit 1.
    task = tmp_path / "mine.py"
    task.write_text(
        f"from inspect_ai import task\n\n@task\ndef mine(fault, protection, prompt):\n    {body}\n"
    )
    result = _run(twice, tmp_path / "logs", "--model", "stub/retry", "--task", f"{task}:mine")
    _one_line_exit_2(result, f"task '{task}:mine' cannot be built: {error}")


def test_bad_input_own_task_file_that_exits_as_it_is_imported(twice: Twice, tmp_path: Path) -> None:
    # The failing path: `sys.exit(3)` in a task file ended `twice run` with exit 3, no output.
    task = tmp_path / "mine.py"
    task.write_text("import sys\n\nsys.exit(3)\n")
    result = _run(twice, tmp_path / "logs", "--model", "stub/retry", "--task", f"{task}:mine")
    _one_line_exit_2(
        result,
        f"task file '{task}' (from '{task}:mine') called sys.exit(3) as it was imported; a "
        "task file defines the task, it must not end the process",
    )


@pytest.mark.parametrize("workers", [None, "1", "2"])
@pytest.mark.parametrize(
    "left", ["old/summary.json", "old/shard-1-of-2/x.eval", "a/b/eval-set.json"]
)
def test_bad_input_a_log_dir_above_another_runs_logs(
    twice: Twice, tmp_path: Path, left: str, workers: str | None
) -> None:
    # The failing path: inspect lists a log directory recursively, so a run into logs/ took
    # logs/old's logs for its own and deleted them as stale (exit 0), or never finished.
    log_dir = tmp_path / "logs"
    other = log_dir / left
    other.parent.mkdir(parents=True)
    other.write_text("{}")
    extra = ("--workers", workers) if workers else ()
    result = _run(twice, log_dir, "--model", "stub/retry", "--task", "refund", *extra)
    _one_line_exit_2(result, f"holds another run's logs in '{other.parent}'")
    assert other.read_text() == "{}"
    assert sorted(p.name for p in log_dir.iterdir()) == [left.split("/")[0]]


@pytest.mark.parametrize("spelling", ["./logs", "logs/.", "logs/", "file://{d}/logs", "{d}/logs"])
def test_a_run_is_not_refused_for_its_own_shards_however_its_dir_is_spelt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spelling: str
) -> None:
    # The failing path: the check cut len(--log-dir) characters off each listed path, which
    # the listing spells its own way ("./logs" lists as "logs/..."): the run's own
    # shard-1-of-2 became "hard-1-of-2", and rerunning a --workers run into ./logs (the
    # default for 16 cells or more) was refused, exit 2, naming a directory that is not there.
    from twice.evals.run import refuse_runs_inside

    monkeypatch.chdir(tmp_path)
    for shard in ("shard-1-of-2", "shard-2-of-2"):
        (tmp_path / "logs" / shard).mkdir(parents=True)
        (tmp_path / "logs" / shard / "x.eval").write_text("{}")
        (tmp_path / "logs" / shard / "summary.json").write_text("{}")
    (tmp_path / "logs" / "summary.json").write_text("{}")
    refuse_runs_inside(spelling.format(d=tmp_path))  # its own: not refused
    (tmp_path / "logs" / "old").mkdir()
    (tmp_path / "logs" / "old" / "y.eval").write_text("{}")
    with pytest.raises(SuiteError, match=r"holds another run's logs in '.*logs/old'"):
        refuse_runs_inside(spelling.format(d=tmp_path))


def test_a_run_in_object_storage_is_not_refused_for_its_own_shards() -> None:
    import fsspec
    from twice.evals.run import refuse_runs_inside

    fs = fsspec.filesystem("memory")
    fs.pipe("/twice-own/shard-1-of-2/x.eval", b"{}")
    fs.pipe("/twice-own/summary.json", b"{}")
    try:
        refuse_runs_inside("memory://twice-own")
        fs.pipe("/twice-own/old/y.eval", b"{}")
        with pytest.raises(
            SuiteError, match="holds another run's logs in 'memory://twice-own/old'"
        ):
            refuse_runs_inside("memory://twice-own")
    finally:
        fs.rm("/twice-own", recursive=True)


@pytest.mark.parametrize("rate", ["nan", "NaN", "0", "1", "-0.1"])
def test_bad_input_trials_rate(twice: Twice, rate: str) -> None:
    result = twice("trials", "--rate", rate)
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "--rate" in result.stderr


def test_bad_input_report_and_gate_to_unwritable_paths(
    twice: Twice, stub_logs: Path, tmp_path: Path
) -> None:
    log_dir = tmp_path / "logs"
    shutil.copytree(stub_logs, log_dir)
    afile = tmp_path / "afile"
    afile.write_text("x")
    gate = Path(__file__).parents[2] / "evals" / "gate.toml"
    for args, hint in [
        (("report", log_dir, "-o", afile / "r.html"), "-o"),
        (("report", log_dir, "-o", "/proc/twice/r.html"), "-o"),
        (("report", log_dir, "-o", tmp_path), "-o"),
        (("gate", log_dir, "--config", gate, "--junit", afile / "j.xml"), "--junit"),
        (("gate", log_dir, "--config", gate, "--junit", "/proc/twice/j.xml"), "--junit"),
    ]:
        result = twice(*args)
        assert result.exit_code == 2, (args, result.output)
        assert "Traceback" not in result.output
        errors = [line for line in result.stderr.splitlines() if line.startswith("Error")]
        assert len(errors) == 1 and hint in errors[0], result.stderr


def test_bad_input_uris_with_one_slash_are_refused_everywhere(
    twice: Twice, stub_logs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each of these is a legal local path, so report and gate read or wrote ./s3:/... and
    # ./gs:/... (or said "does not exist") where the user meant a bucket.
    monkeypatch.chdir(tmp_path)
    gate = Path(__file__).parents[2] / "evals" / "gate.toml"
    for args, hint, meant in [
        (("report", "s3:/bucket/run"), "LOG_DIR", "s3://bucket/run"),
        (("report", stub_logs, "-o", "gs:/b/r.html"), "-o", "gs://b/r.html"),
        (("report", stub_logs, "--baseline", "S3:/b/base"), "--baseline", "s3://b/base"),
        (("gate", "memory:/run", "--config", gate), "LOG_DIR", "memory://run"),
        (("gate", stub_logs, "--config", gate, "--junit", "s3:/b/j.xml"), "--junit", "s3://b"),
        (("report", "file:/tmp/run"), "LOG_DIR", "write '/tmp/run'"),
    ]:
        result = twice(*args)
        assert result.exit_code == 2, (args, result.output)
        assert "Traceback" not in result.output
        assert hint in result.stderr and meant in result.stderr, result.stderr
    assert list(tmp_path.iterdir()) == []  # nothing made in the current directory


def test_only_known_schemes_with_one_slash_count_as_misspelt() -> None:
    from twice.reports import misspelt_uri

    assert misspelt_uri("s3:/b/run") == "s3://b/run"
    assert misspelt_uri("s3://b/run") is None
    assert misspelt_uri("runs/s3:/x") is None  # a colon further along the path
    assert misspelt_uri("notafs:/x") is None  # not a filesystem fsspec knows: a local name
    assert misspelt_uri("./s3:/x") is None  # how the error says to name the local directory
    assert misspelt_uri("/abs/path") is None


@pytest.mark.parametrize(
    ("arg", "where"),
    [
        (f"default_query={{api-key: {SECRET}}}", "default_query.api-key"),
        (f"default_headers={{X-Trace: {SECRET}}}", "default_headers"),
        (f"base_url=http://u:{SECRET}@127.0.0.1:9/v1", "base_url"),
        (f"base_url=http://{SECRET}@127.0.0.1:9/v1", "base_url"),
        (f"base_url=http://127.0.0.1:9/v1?key={SECRET}", "base_url"),
        (f"extra={{nested: [{{token: {SECRET}}}]}}", "extra.nested[0].token"),
    ],
)
def test_bad_input_credentials_in_model_args_are_refused_unseen(
    twice: Twice, tmp_path: Path, arg: str, where: str
) -> None:
    log_dir = tmp_path / "logs"
    result = _run(twice, log_dir, "--model", "stub/retry", "-M", arg)
    _one_line_exit_2(result, f"model arg '{where}'")
    assert SECRET not in result.output
    assert not log_dir.exists()


def test_bad_input_model_arg_holding_an_env_key_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    with pytest.raises(SuiteError, match="'organization' holds the value of an API key"):
        check_model_args({"organization": SECRET})
    check_model_args({"base_url": "http://127.0.0.1:9/v1?x=1", "default_query": {"v": "2"}})


def test_bad_input_prompt_holding_an_env_key_is_refused_unseen(
    twice: Twice, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # It was sent to every model as the system message and kept verbatim in every log
    # header's prompt excerpt and in inspect's logs.json (summary.json alone scrubbed it).
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    prompt = tmp_path / "leaky.md"
    prompt.write_text(f"Use key {SECRET} when asked.\n")
    log_dir = tmp_path / "logs"
    result = _run(twice, log_dir, "--model", "stub/verify", "--task", "refund", "--prompt", prompt)
    _one_line_exit_2(result, f"prompt '{prompt}' contains the value of $OPENAI_API_KEY")
    assert SECRET not in result.output
    assert not log_dir.exists()


def test_bad_input_keys_come_from_a_dotenv_file_as_in_inspect(
    twice: Twice, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The failing path: `twice run` read no .env (the README says inspect's loading applies),
    # so a key kept there was "not defined", and was not among the values scrubbed.
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)  # restored (or removed) after
    (tmp_path / ".env").write_text(f"OPENAI_API_KEY={SECRET}\n")
    prompt = tmp_path / "leaky.md"
    prompt.write_text(f"Use key {SECRET} when asked.\n")
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "sub")  # found from the working directory up
    result = _run(twice, tmp_path / "logs", "--model", "stub/verify", "--task", "refund",
                  "--prompt", prompt)  # fmt: skip
    _one_line_exit_2(result, f"prompt '{prompt}' contains the value of $OPENAI_API_KEY")
