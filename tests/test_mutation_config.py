"""The mutation-testing setup (tests/mutation/): its configuration names what exists, its
equivalents list matches the code, its verdict fails on an unlisted survivor, and its staging
directory really is what the tests import."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("twice_mutate", ROOT / "tests/mutation/mutate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


mutate = _load()


def test_mutation_modules_and_their_tests_exist() -> None:
    modules = mutate.load_modules()
    assert modules, "tests/mutation/modules.toml configures no module"
    for m in modules:
        assert (ROOT / m.path).is_file(), f"{m.path} moved or was renamed: update modules.toml"
        for t in m.tests:
            assert (ROOT / t).is_file(), f"{m.path}: test file {t} does not exist"
    paths = [m.path for m in modules]
    assert len(paths) == len(set(paths)), "a module is configured twice"
    assert {"assertions/_metrics.py", "evals/gate/_gate.py", "mocks/_idempotency.py"} <= set(paths)


def test_mutation_equivalents_name_configured_modules_and_current_lines() -> None:
    configured = {m.path for m in mutate.load_modules()}
    for e in mutate.load_equivalents():
        assert e.module in configured, f"equivalent in {e.module}, which is not configured"
        source = {" ".join(line.split()) for line in (ROOT / e.module).read_text().splitlines()}
        removed = [line[1:] for line in mutate.changed_lines(e.diff) if line.startswith("-")]
        assert removed, f"{e.module}: an equivalent's diff removes no line"
        for line in removed:
            assert line in source, f"{e.module} no longer has {line!r}: the entry is stale"


def test_mutation_checked_stamps_name_configured_modules() -> None:
    configured = {m.path for m in mutate.load_modules()}
    assert set(mutate.read_checked()) <= configured


def test_mutation_changed_lines_ignore_headers_context_and_spacing() -> None:
    diff = "--- a.py\n+++ a.py\n@@ -1 +1 @@\n ctx\n-    x = f(a,  b)\n+    x = f(a, )\n"
    assert mutate.changed_lines(diff) == ("-x = f(a, b)", "+x = f(a, )")


def _outcome(*mutants: tuple[str, str, str]) -> object:
    return mutate.Outcome(
        [mutate.Mutant(name, "m/x.py", status, diff) for name, status, diff in mutants]
    )


def test_mutation_verdict_fails_on_an_unlisted_survivor_and_a_stale_entry() -> None:
    module = mutate.Module("m/x.py", ("tests/t.py",))
    equivalent = mutate.Equivalent("m/x.py", "-a = 1\n+a = 2\n", "same")
    survivor = ("twice.m.x.x_f__mutmut_2", "survived", "-b = 1\n+b = 2\n")
    listed = ("twice.m.x.x_f__mutmut_3", "survived", "- a = 1\n+ a = 2\n")
    killed = ("twice.m.x.x_f__mutmut_1", "killed", "")

    clean = mutate.judge([module], _outcome(killed, listed), [equivalent])
    assert clean.ok
    assert clean.lines == [
        "m/x.py: 2 mutants, 1 killed, 1 equivalent, 0 unlisted survivors; kill rate 100.0% "
        "of the non-equivalent"
    ]
    caught = mutate.judge([module], _outcome(killed, listed, survivor), [equivalent])
    assert not caught.ok and [m.name for m in caught.unlisted] == [survivor[0]]
    assert "kill rate 50.0%" in caught.lines[0]
    stale = mutate.judge([module], _outcome(killed), [equivalent])
    assert not stale.ok and stale.stale == [equivalent]
    untested = ("twice.m.x.x_g__mutmut_1", "no tests", "-c = 1\n+c = 2\n")
    assert not mutate.judge([module], _outcome(killed, untested), []).ok
    unfinished = ("twice.m.x.x_g__mutmut_1", "not checked", "")
    assert mutate.judge([module], _outcome(killed, unfinished), []).unfinished


def test_mutation_unknown_module_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert mutate.main(["mocks/_nothing.py"]) == 2
    err = capsys.readouterr().err
    assert "not a configured module: mocks/_nothing.py; configured: " in err
    assert "assertions/_metrics.py" in err


def test_mutation_stage_is_what_the_tests_import(tmp_path: Path) -> None:
    # The layout's trap: the editable install's import hook maps twice.* to the working
    # tree, so a mutant anywhere else is never run. The staged copy must win.
    modules = [m for m in mutate.load_modules() if m.path == "mocks/_idempotency.py"]
    stage = mutate.stage(modules, tmp_path / "stage")
    config = (stage / "pyproject.toml").read_text()
    assert 'only_mutate = ["twice/mocks/_idempotency.py"]' in config
    assert "tests/mocks/test_mocks_service.py" in config
    env = dict(os.environ, PYTHONPATH=str(stage))
    code = "import importlib.util as u; print(u.find_spec('twice.mocks').origin)"
    found = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout.strip()
    assert Path(found) == stage / "twice" / "mocks" / "__init__.py"
    installed = [p for p in stage.rglob("*") if p.name in (".venv", "node_modules")]
    assert not installed, f"the stage copied installed agent environments: {installed[:3]}"


def test_mutation_open_module_reports_without_failing_and_is_not_run_by_ci() -> None:
    module = mutate.Module("m/x.py", ("tests/t.py",), open=True)
    survivor = ("twice.m.x.x_f__mutmut_2", "survived", "-b = 1\n+b = 2\n")
    verdict = mutate.judge([module], _outcome(survivor), [])
    assert verdict.ok and [m.name for m in verdict.pending] == [survivor[0]]
    assert verdict.lines[0].endswith("(open: survivors not triaged yet)")
    assert mutate.select([module], [], changed=True) == []


def test_mutation_stage_leaves_out_installed_agent_environments(tmp_path: Path) -> None:
    # An agent command's venv or node_modules sits beside its source inside tasks/: a stage
    # that copied them (following their links) filled the disk with tens of gigabytes.
    agent = tmp_path / "tasks" / "agents" / "commands" / "x"
    (agent / ".venv" / "lib").mkdir(parents=True)
    (agent / "node_modules" / "ai").mkdir(parents=True)
    (agent / "agent.py").write_text("print('agent')\n")
    (agent / ".venv" / "lib64").symlink_to("lib", target_is_directory=True)
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "big.bin").write_bytes(b"0" * 1024)
    (agent / "linked").symlink_to(tmp_path / "outside", target_is_directory=True)
    copy = tmp_path / "copy"
    shutil.copytree(tmp_path / "tasks", copy, ignore=mutate.STAGE_IGNORES, symlinks=True)
    staged = copy / "agents" / "commands" / "x"
    assert (staged / "agent.py").exists()
    assert not (staged / ".venv").exists() and not (staged / "node_modules").exists()
    assert (staged / "linked").is_symlink()  # a link stays a link, not a copy of its target


STOPPED_RUN = (
    "    done in 5910ms (1 files mutated, 180 ignored, 0 unmodified)\n\n    done\n"
    "Running mutation testing\n"
    "⠋ 1/1163  🎉 1 🫥 0  ⏰ 0  🤔 0  🙁 0  🔇 0  🧙 0\r⠙ 2/1163  🎉 2 🫥 0  ⏰ 0  🤔 0  🙁 0  🔇 0"
    "  🧙 0\r⠹ 398/1163  🎉 390 🫥 0  ⏰ 0  🤔 0  🙁 8  🔇 0  🧙 0\nStopping...\n"
    "398/1163  🎉 390 🫥 0  ⏰ 0  🤔 0  🙁 8  🔇 0  🧙 0\n\n1.20 mutations/second\n\n"
    "Mutant results\n--------------\n🎉 twice.evals.gate._gate.x_f__mutmut_1\n"
)
"""What ``mutmut run`` prints when it is interrupted: it exits 0 all the same."""


def test_mutation_run_that_stopped_early_shows_the_end_of_mutmuts_output(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The failing path: mutmut stopped at 398 of 1,163 mutants and the run listed the rest as
    # "not checked" with nothing to say why.
    assert mutate.last_output(STOPPED_RUN) == [
        "done in 5910ms (1 files mutated, 180 ignored, 0 unmodified)",
        "done",
        "Running mutation testing",
        "⠹ 398/1163  🎉 390 🫥 0  ⏰ 0  🤔 0  🙁 8  🔇 0  🧙 0",
        "Stopping...",
        "398/1163  🎉 390 🫥 0  ⏰ 0  🤔 0  🙁 8  🔇 0  🧙 0",
        "1.20 mutations/second",
    ]
    assert mutate.last_output(STOPPED_RUN, lines=2)[0].startswith("398/1163  🎉 390")
    stopped = mutate.Outcome(
        [
            mutate.Mutant("twice.evals.gate._gate.x_f__mutmut_1", "evals/gate/_gate.py", "killed"),
            mutate.Mutant(
                "twice.evals.gate._gate.x_f__mutmut_2", "evals/gate/_gate.py", "not checked"
            ),
        ],
        log=STOPPED_RUN,
    )
    monkeypatch.setattr(mutate, "run", lambda modules, jobs, timeout: stopped)
    assert mutate.main(["evals/gate/_gate.py"]) == 1
    out = capsys.readouterr().out
    assert out.endswith(
        "NOT FINISHED (not checked) twice.evals.gate._gate.x_f__mutmut_2\n\n"
        "mutation: 1 mutant(s) were never run: mutmut stopped early. The end of its output:\n"
        "  done in 5910ms (1 files mutated, 180 ignored, 0 unmodified)\n  done\n"
        "  Running mutation testing\n  ⠹ 398/1163  🎉 390 🫥 0  ⏰ 0  🤔 0  🙁 8  🔇 0  🧙 0\n"
        "  Stopping...\n  398/1163  🎉 390 🫥 0  ⏰ 0  🤔 0  🙁 8  🔇 0  🧙 0\n"
        "  1.20 mutations/second\n"
    )


def test_mutation_names_the_signal_that_killed_mutmut() -> None:
    assert mutate.ended(1) == "exited 1"
    assert mutate.ended(-24) == "was killed by SIGXCPU"
    assert mutate.ended(-2) == "was killed by SIGINT"
    assert mutate.ended(-200) == "was killed by signal 200"
