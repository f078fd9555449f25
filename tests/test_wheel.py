"""The wheel installs one top-level package, ``twice``, and works beside a user's own ``tasks/``.

Built from this checkout and installed into a fresh virtualenv whose only other packages are
borrowed (by a ``.pth`` line) from the test's own environment, so nothing is downloaded. The
user's project holds packages named ``tasks``, ``mocks`` and ``reports``: with the old top-level
install they shadowed twice's.
"""

from __future__ import annotations

import os
import site
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

USER_TEST = """
import httpx
import pytest

from importlib import import_module

from twice.assertions import assert_side_effects, exactly


def test_own_packages_are_the_users():
    # The user's own top-level mocks/, reports/, tasks/: twice installs none of these names.
    owners = {import_module(name).OWNER for name in ("mocks", "reports", "tasks")}
    assert owners == {"user"}


@pytest.mark.twice_mock(fault="lost_reply")
def test_twice_catches_a_naive_retry(ledger):
    for _ in range(2):
        try:
            httpx.post("https://payments.example.com/v1/refunds",
                       json={"order_id": "order_1042", "amount": 499})
            break
        except httpx.TimeoutException:
            continue
    with pytest.raises(AssertionError):
        assert_side_effects(ledger, exactly(1, "payments.refund.create"))
"""

USER_CONFTEST = """
import pytest
from twice.mocks import PaymentsService

@pytest.fixture
def twice_services():
    order = {"order_id": "order_1042", "customer": "Dana Ortiz", "amount": 3997}
    return [PaymentsService(orders=[order], base_url="https://payments.example.com")]
"""


def run(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run(
        [str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


@pytest.mark.slow
def test_wheel_installs_only_twice_and_survives_a_users_own_tasks(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    built = run(
        sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
        "-w", dist, ROOT, cwd=tmp_path,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    (wheel,) = dist.glob("twice-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        tops = {name.split("/")[0] for name in archive.namelist()}
        names = set(archive.namelist())
    assert {t for t in tops if not t.endswith(".dist-info")} == {"twice"}
    assert "twice/tasks/prompts/baseline.md" in names
    assert "twice/reports/templates/report.html.j2" in names
    assert "twice/reports/stats/__init__.py" in names
    assert "twice/tasks/refund/dataset.jsonl" in names
    assert "twice/evals/local_model/server.mjs" in names
    assert "twice/tasks/agents/frameworks/langgraph-retry.toml" in names  # twice frameworks
    assert "twice/evals/frameworks/__init__.py" in names

    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    purelib = run(
        python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", cwd=tmp_path
    ).stdout.strip()
    # Borrow the dependencies (and pip) without the editable install of this checkout: a path
    # line in a .pth adds the directory but does not run the .pth files inside it.
    ours = sysconfig.get_paths()["purelib"]
    assert ours in site.getsitepackages() or ours in sys.path
    Path(purelib, "borrowed.pth").write_text(ours + "\n")
    installed = run(python, "-m", "pip", "install", "--no-deps", "-q", wheel, cwd=tmp_path)
    assert installed.returncode == 0, installed.stderr

    project = tmp_path / "project"
    for name in ("tasks", "mocks", "reports"):
        (project / name).mkdir(parents=True)
        (project / name / "__init__.py").write_text('OWNER = "user"\n')
    (project / "conftest.py").write_text(USER_CONFTEST)
    (project / "test_user.py").write_text(USER_TEST)

    imported = run(
        python, "-c",
        "import twice.mocks, twice.tasks, twice.assertions, twice.evals, twice.reports, tasks\n"
        "assert tasks.OWNER == 'user'\n"
        "print(twice.tasks.__file__)",
        cwd=project,
    )  # fmt: skip
    assert imported.returncode == 0, imported.stderr
    assert imported.stdout.strip().startswith(purelib)

    listed = run(env_dir / "bin" / "twice", "list", cwd=project)
    assert listed.returncode == 0, listed.stderr
    assert "refund" in listed.stdout and "lost_reply" in listed.stdout

    tested = run(
        python, "-m", "pytest", "-q", "-p", "no:cacheprovider",
        "-p", "twice.assertions.pytest_plugin", "test_user.py", cwd=project,
    )  # fmt: skip
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "2 passed" in tested.stdout
