"""Bad input to ``twice run``: a message naming the bad value and what is accepted, exit 2,
and nothing already written is touched."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from twice.evals import SuiteError, check_model_args

Twice = Callable[..., Any]


def _run(twice: Twice, log_dir: Path, *args: str | Path) -> Any:
    return twice("run", "--log-dir", log_dir, "--display", "none", "--limit", "1", *args)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("--task", "refunds"), "unknown task 'refunds'; expected one of: refund"),
        (("--fault", "lost"), "unknown fault 'lost'; expected one of: none, lost_reply"),
        (("--protection", "keyed"), "unknown protection 'keyed'; expected one of: bare,"),
        (
            ("--prompt", "no/such/prompt.md"),
            "unknown prompt 'no/such/prompt.md': not a built-in prompt "
            "(baseline, cautious, persistent) and no such file",
        ),
        (("--model", "stub/nosuch"), "unknown stub model 'stub/nosuch'; expected one of: stub/"),
        (("--model", "gpt-5"), "model 'gpt-5' is not an inspect model string; expected '<pro"),
        (("--model", "nosuch/x"), "unknown model provider 'nosuch' in 'nosuch/x'; expected"),
        (("--model", "stub/retry", "-M", "oops"), "'oops' is not key=value"),
        (
            ("--model", "stub/retry", "-M", "temperature=1"),
            "unknown model args for stub/retry: temperature; stub/retry accepts attempts, delay.",
        ),
        (("--config", "nope.toml"), "suite file 'nope.toml' does not exist"),
    ],
)  # fmt: skip
def test_run_errors_bad_value_exits_2_and_writes_nothing(
    twice: Twice, tmp_path: Path, args: tuple[str, ...], expected: str
) -> None:
    log_dir = tmp_path / "logs"
    result = _run(twice, log_dir, *args)
    assert result.exit_code == 2, result.output
    assert expected in " ".join(result.stderr.split()), result.stderr
    assert "Traceback" not in result.output
    assert not log_dir.exists()
    if args[:2] == ("--model", "stub/retry"):  # a stub takes no key: no word about keys
        assert "API keys" not in result.stderr


@pytest.mark.parametrize(
    "args",
    [
        ("--model", "nosuch/x"),
        ("--model", "openai/gpt-5-mini", "-M", "base_url=not-a-url"),
        ("--model", "openai/gpt-5-mini", "-M", "base_url=http://127.0.0.1:99999/v1"),
    ],
)
def test_run_errors_a_bad_model_is_refused_before_any_worker_starts(
    twice: Twice, tmp_path: Path, args: tuple[str, ...]
) -> None:
    # 24 cells would take two workers here: each would have started, then failed alike.
    result = twice("run", "--log-dir", tmp_path / "logs", "--display", "none", *args)
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: "), result.stderr
    assert "running" not in result.stderr and "worker" not in result.stderr
    assert not (tmp_path / "logs").exists()


def test_run_errors_unknown_provider_lists_the_providers(twice: Twice, tmp_path: Path) -> None:
    result = _run(twice, tmp_path / "logs", "--model", "nosuch/x")
    message = " ".join(result.stderr.split())
    assert result.exit_code == 2
    for provider in ("anthropic", "openai", "openai-api", "ollama", "vllm", "stub"):
        assert f" {provider}," in message


def test_run_errors_missing_api_key_names_the_variable(
    twice: Twice, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for var in ("OPENAI_API_KEY", "AZUREAI_OPENAI_API_KEY", "AZURE_OPENAI_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    result = _run(twice, tmp_path / "logs", "--model", "openai/gpt-5-mini")
    assert result.exit_code == 2
    assert "could not load model 'openai/gpt-5-mini'" in result.stderr
    assert "OPENAI_API_KEY" in result.stderr
    assert "[bold]" not in result.stderr, "inspect's rich markup should be rendered to text"


def test_run_errors_credential_model_arg_is_refused(twice: Twice, tmp_path: Path) -> None:
    result = _run(twice, tmp_path / "logs", "--model", "stub/retry", "-M", "api_key=sk-live-XYZ")
    assert result.exit_code == 2
    assert "model arg 'api_key' looks like a credential" in " ".join(result.stderr.split())
    assert "OPENAI_API_KEY" in result.stderr
    assert "sk-live-XYZ" not in result.output
    assert not (tmp_path / "logs").exists()


@pytest.mark.parametrize(
    "key",
    [
        "api_key", "API_KEY", "apikey", "azure_ad_token", "client_secret", "aws_access_key_id",
        "password", "default_headers", "auth", "access_key",
    ],
)  # fmt: skip
def test_run_errors_check_model_args_names_credentials(key: str) -> None:
    with pytest.raises(SuiteError, match=f"model arg '{key}' looks like a credential"):
        check_model_args({key: "x"})


def test_run_errors_check_model_args_lets_settings_through() -> None:
    check_model_args(
        {
            "responses_api": True, "base_url": "http://localhost:8000/v1", "attempts": 3,
            "tokenizer": "x", "max_tokens": 10, "emulate_tools": True, "author": "me",
        }
    )  # fmt: skip


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[[matrix]\nmodels = ['stub/retry']\n", "is not valid TOML"),
        ("epochs = 1\n", "needs at least one [[matrix]] block"),
        (
            "[[matrix]]\nmodels = ['stub/retry']\nfault = ['none']\n",
            "unknown key(s) fault; expected: models, agents, prompts, tasks, faults, protections",
        ),
        ("[[matrix]]\nmodels = ['stub/retry']\nfaults = ['lost']\n", "unknown fault 'lost'"),
        ("[[matrix]]\nmodels = ['stub/retry']\nfaults = []\n", "has an empty 'faults' list"),
        (
            "seed = 1\n[[matrix]]\nmodels = ['stub/retry']\n",
            "unknown key(s) seed; expected: agent_cmd, agent_timeout, description, epochs, "
            "hang_seconds, limit, local_model, matrix, max_agent_cmds, outage_window",
        ),
    ],
)  # fmt: skip
def test_run_errors_bad_suite_file(twice: Twice, tmp_path: Path, text: str, expected: str) -> None:
    suite = tmp_path / "suite.toml"
    suite.write_text(text)
    result = _run(twice, tmp_path / "logs", "--config", suite)
    assert result.exit_code == 2
    assert expected in " ".join(result.stderr.split())
    assert not (tmp_path / "logs").exists()


def test_run_errors_two_prompts_with_one_name(twice: Twice, tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "terse.md").write_text("Be terse.")
    (tmp_path / "b" / "terse.md").write_text("Be very terse.")
    result = _run(
        twice, tmp_path / "logs", "--model", "stub/verify",
        "--prompt", tmp_path / "a" / "terse.md", "--prompt", tmp_path / "b" / "terse.md",
    )  # fmt: skip
    assert result.exit_code == 2
    assert "two different prompts are both named 'terse'" in " ".join(result.stderr.split())


def test_run_errors_corrupt_log_in_log_dir_is_refused_and_kept(
    twice: Twice, stub_logs: Path, tmp_path: Path
) -> None:
    log_dir = tmp_path / "logs"
    shutil.copytree(stub_logs, log_dir)
    corrupt = log_dir / "2026-01-01T00-00-00-00-00_refund_broken.eval"
    corrupt.write_bytes(b"half a zip")
    before = {p.name: p.read_bytes() for p in log_dir.iterdir()}
    result = _run(twice, log_dir, "--model", "stub/verify", "--fault", "lost_reply")
    assert result.exit_code == 2
    message = " ".join(result.stderr.split())
    assert f"cannot resume into '{log_dir}'" in message and corrupt.name in message
    assert "move it out of the directory" in message
    assert {p.name: p.read_bytes() for p in log_dir.iterdir()} == before


@pytest.mark.parametrize(
    ("error", "said"),
    [
        # Two runs into one S3 shard directory (which has no lock): a log the other run
        # replaced was gone when this one read its logs back: a LogReadError traceback.
        ("LogReadError", "is another run writing into this log directory?"),
        # A StorageError is a LogReadError too: expired credentials were blamed on a run.
        ("StorageError", "AccessDenied"),
    ],
)
def test_run_errors_a_log_that_cannot_be_read_back_is_one_line(
    twice: Twice, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: str, said: str
) -> None:
    from twice import reports
    from twice.evals.run import _run as run_module

    def fails(*args: Any, **kwargs: Any) -> Any:
        raise getattr(reports, error)("reading 's3://b/x.eval': AccessDenied")

    monkeypatch.setattr(run_module, "ran_trials", fails)
    result = _run(twice, tmp_path / "logs", "--model", "stub/retry", "--task", "refund",
                  "--fault", "none")  # fmt: skip
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    assert said in result.stderr and "to resume" in result.stderr
    if error == "StorageError":
        assert "another run" not in result.stderr


def test_only_trials_with_an_error_keep_a_run_incomplete() -> None:
    # `errors` also counts a trial never scored without an error; the rerun runs only the
    # trials with one (rerun_errored), so counting the other kind kept "complete": false
    # for ever, with a report saying a rerun would finish it.
    import pandas as pd
    from twice.evals.run import errored_trials

    frame = pd.DataFrame({"error": ["", "RuntimeError: boom", ""], "completed": [1.0, None, None]})
    assert errored_trials(frame) == 1
    assert errored_trials(pd.DataFrame()) == 0
