"""The twice CLI: list, run, and bad input (exit 2, a message naming the value)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from twice.evals.cli import cli


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.output


def test_cli_list_shows_everything() -> None:
    code, out = invoke("list")
    assert code == 0
    for name in ("refund", "baseline", "cautious", "persistent", "lost_reply", "rate_limited",
                 "reset_after_commit", "retry-stepkey", "intent-key", "stub/noisy",
                 "stub/parallel"):  # fmt: skip
        assert name in out
    assert "path.py:function         your own task" in out  # tasks and agents alike
    assert "openapi:PATH[:DATA.jsonl] a task from an OpenAPI document and a dataset" in out
    assert "path.py:function         your own agent" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--task", "refnd"], "unknown task 'refnd'; expected one of: refund"),
        (["--fault", "lost"], "unknown fault 'lost'"),
        (["--protection", "stepkey"], "unknown protection 'stepkey'"),
        (["--prompt", "nope/missing.md"], "unknown prompt 'nope/missing.md'"),
        (["--model", "stub/rety"], "unknown stub model 'stub/rety'"),
        (["--model", "gpt-5"], "model 'gpt-5' is not an inspect model string"),
        (
            ["--model", "nosuchprovider/x", "--limit", "1"],
            "unknown model provider 'nosuchprovider'",
        ),
        (["--config", "missing.toml"], "suite file 'missing.toml' does not exist"),
    ],
)
def test_cli_run_bad_input_exits_2(args: list[str], message: str, tmp_path: Path) -> None:
    code, out = invoke("run", "--log-dir", str(tmp_path / "logs"), *args)
    assert code == 2, out
    assert message in out


def test_cli_run_malformed_toml_exits_2(tmp_path: Path) -> None:
    bad = tmp_path / "suite.toml"
    bad.write_text("[[matrix]\nmodels = [")
    code, out = invoke("run", "--config", str(bad))
    assert code == 2 and "is not valid TOML" in out


def test_cli_run_unknown_suite_key_exits_2(tmp_path: Path) -> None:
    bad = tmp_path / "suite.toml"
    bad.write_text('[[matrix]]\nmodels = ["stub/retry"]\nfault = ["lost_reply"]\n')
    code, out = invoke("run", "--config", str(bad))
    assert code == 2 and "unknown key(s) fault" in out


def test_cli_run_writes_summary_and_report(tmp_path: Path) -> None:
    out_dir = tmp_path / "run"
    code, out = invoke(
        "run", "--model", "stub/retry", "--model", "stub/verify", "--fault", "lost_reply",
        "--limit", "2", "--log-dir", str(out_dir),
    )  # fmt: skip
    assert code == 0, out
    summary = json.loads((out_dir / "summary.json").read_text())
    rates = {c["model"]: c["duplication_rate"] for c in summary["cells"]}
    assert rates == {"stub/retry": 1.0, "stub/verify": 0.0}
    assert summary["run"]["prompts"]["baseline"]["sha256"]
    assert (out_dir / "report.html").is_file()
    assert "stub/retry" in out and "summary:" in out


def test_cli_run_prompt_file_named_by_stem(tmp_path: Path) -> None:
    prompt = tmp_path / "my_prompt.md"
    prompt.write_text("You are careful. Check before retrying anything that changes state.")
    code, out = invoke(
        "run", "--model", "stub/no-retry", "--prompt", str(prompt), "--fault", "none",
        "--limit", "1", "--log-dir", str(tmp_path / "run"), "--no-report",
    )  # fmt: skip
    assert code == 0, out
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["cells"][0]["prompt"] == "my_prompt"
    assert summary["run"]["prompts"]["my_prompt"]["text"].startswith("You are careful.")


def test_a_log_dir_with_a_tilde_is_the_home_directory_for_twice_and_inspect_alike(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The failing path: --log-dir '~/t1' (quoted, or from a suite file or CI variable) put
    # the logs and summary in ./~/t1 and inspect's eval-set.json and logs.json in $HOME/t1;
    # every rerun and gate then exited 2.
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    args = ["--model", "stub/retry", "--task", "refund", "--fault", "none", "--limit", "1"]
    for _ in range(2):  # the rerun resumes the same directory
        code, out = invoke("run", *args, "--log-dir", "~/t1", "--display", "none")
        assert code == 0, out
    run = home / "t1"
    for name in ("summary.json", "eval-set.json", "logs.json", "report.html"):
        assert (run / name).is_file(), name
    assert len(list(run.glob("*.eval"))) == 1
    gate = tmp_path / "gate.toml"
    gate.write_text('[[rule]]\nmetric = "completion_rate"\nmin = 0.0\n')
    code, out = invoke("gate", "~/t1", "--config", str(gate), "--junit", "~/junit.xml")
    assert code == 0, out
    code, out = invoke("report", "~/t1", "-o", "~/out/report.html", "--baseline", "~/t1")
    assert code == 0, out
    assert (home / "junit.xml").is_file() and (home / "out" / "report.html").is_file()
    assert list(work.iterdir()) == []  # nothing under a directory literally named ~
