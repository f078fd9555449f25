"""Every suite file twice ships loads and names only things that exist."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from twice import evals
from twice.evals import SuiteError, load_suite
from twice.evals.suite._suite import AXES

SUITES = sorted(p for p in Path(evals.__file__).parent.glob("*.toml") if p.name != "gate.toml")


@pytest.mark.parametrize("path", SUITES, ids=lambda p: p.name)
def test_shipped_suite_is_valid(path: Path) -> None:
    suite = load_suite(path)
    suite.validate()
    assert sum(1 for _ in suite.cells()) > 0


def test_full_suite_covers_every_task_fault_and_protection() -> None:
    from twice.mocks import FAULTS
    from twice.tasks import PROTECTIONS, TASKS

    cells = list(load_suite(Path(evals.__file__).parent / "full.toml").cells())
    assert {c.task for c in cells} == set(TASKS)
    assert {c.fault for c in cells} == set(FAULTS)
    assert {c.protection for c in cells} == set(PROTECTIONS)


def test_one_prompt_file_under_two_spellings_is_one_prompt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `--prompt p/my.md --prompt ./p/my.md` planned two cells of one prompt: the same trials
    # ran twice, counted twice (narrower intervals), and the run never finished resuming.
    from twice.evals import suite_from_flags

    monkeypatch.chdir(tmp_path)
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "my.md").write_text("You are careful.\n")
    spellings = ["p/my.md", "./p/my.md", str(tmp_path / "p/my.md")]
    suite = suite_from_flags(
        config=None, models=["stub/retry"], prompts=spellings,
        tasks=["refund"], faults=["none"], protections=[], epochs=None, limit=1,
    )  # fmt: skip
    assert [c.prompt for c in suite.cells()] == ["p/my.md"]
    other = tmp_path / "q" / "my.md"  # the same name, another text: still refused
    other.parent.mkdir()
    other.write_text("Another text.\n")
    with pytest.raises(evals.SuiteError, match="two different prompts are both named 'my'"):
        suite_from_flags(
            config=None, models=["stub/retry"], prompts=["p/my.md", str(other)],
            tasks=["refund"], faults=["none"], protections=[], epochs=None, limit=1,
        )  # fmt: skip


def test_shipped_files_are_found_by_their_repository_path_outside_a_checkout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The README and the cluster recipes say `--config evals/default.toml` and
    # `--config evals/gate.toml`: outside a twice checkout those paths named nothing.
    from twice.evals import load_gate

    monkeypatch.chdir(tmp_path)
    for name in ("evals/default.toml", "default.toml", "evals/full.toml"):
        assert sum(1 for _ in load_suite(name).cells()) > 0, name
    assert load_gate("evals/gate.toml").rules
    with pytest.raises(evals.SuiteError, match=r"suite file 'evals/nope\.toml' does not exist"):
        load_suite("evals/nope.toml")
    (tmp_path / "evals").mkdir()  # a file of the user's own wins
    (tmp_path / "evals" / "default.toml").write_text('[[matrix]]\nmodels = ["stub/retry"]\n')
    assert {c.model for c in load_suite("evals/default.toml").cells()} == {"stub/retry"}


def test_one_agent_file_under_two_spellings_is_one_agent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `--agent ./docs/examples/my_agent.py:agent` named another agent than the same file
    # without `./`: its logs were not reused, and a baseline run under the other spelling
    # paired with nothing.
    from twice.evals import suite_from_flags

    monkeypatch.chdir(Path(__file__).parents[2])
    suite = suite_from_flags(
        config=None, models=["stub/retry"], prompts=[], tasks=["refund"], faults=["none"],
        agents=["./docs/examples/my_agent.py:agent", "docs//examples/my_agent.py:agent"],
        mocks={"payments": "https://api.example.com"}, protections=[], epochs=None, limit=1,
    )  # fmt: skip
    assert [c.agent for c in suite.cells()] == ["docs/examples/my_agent.py:agent"]


@pytest.mark.parametrize("axis", AXES)
@pytest.mark.parametrize(("value", "shown"), [('"x"', "a string 'x'"), ("3", "an integer 3")])
def test_an_axis_given_as_anything_but_a_list_of_strings_is_refused(
    tmp_path: Path, axis: str, value: str, shown: str
) -> None:
    # The failing path: `models = "x"` was taken as a list of one.
    path = tmp_path / "suite.toml"
    models = "" if axis == "models" else "models = ['stub/retry']\n"
    path.write_text(f"[[matrix]]\n{models}{axis} = {value}\n")
    with pytest.raises(SuiteError, match=re.escape(f"{axis!r} must be a list of strings, e.g.")):
        load_suite(path)
    with pytest.raises(SuiteError, match=re.escape(f"got {shown}") + "$"):
        load_suite(path)


def test_suite_plans_its_cells_once_reading_each_prompt_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A run asks for its cells at every step (tasks, resume, summary, shards): each ask
    # re-read and re-hashed every prompt file.
    import twice.evals.suite._suite as suite_module
    from twice.evals import Matrix, Suite

    reads: list[str] = []
    real = suite_module.load_prompt

    def counting(spec: str) -> object:
        reads.append(spec)
        return real(spec)

    monkeypatch.setattr(suite_module, "load_prompt", counting)
    suite = Suite((Matrix(models=("stub/retry", "stub/verify"), prompts=("baseline", "cautious")),))
    first = suite.cells()
    assert suite.cells() is first and isinstance(first, tuple)
    assert suite.models() == ["stub/retry", "stub/verify"] and suite.agents() == ["react"]
    assert sorted(reads) == ["baseline", "cautious"]
