"""Mutation testing of the modules that decide a number: ``make mutation``.

mutmut 3 mutates one function at a time and runs, against each mutant, the configured tests
that call that function (``modules.toml``). A mutant the tests do not notice *survives*; each
survivor is either killed by a new test or listed in ``equivalent.toml`` with the reason no
test can kill it. The run fails on any other survivor.

Why a staging directory: twice's packages are folders mapped to ``twice.*`` by setuptools'
``package-dir`` (an editable install's import hook), so mutmut, which imports what it
mutated from its own ``mutants/`` copy, would never run a mutant: every test imports the
working tree. Here the packages are copied under ``build/mutation/twice/`` and put first on
``PYTHONPATH``; Python's path finder runs before the editable hook, so the tests import the
copy, and mutmut's mutants in it.

Usage::

    python tests/mutation/mutate.py                      # every configured module
    python tests/mutation/mutate.py mocks/_idempotency.py  # some of them
    python tests/mutation/mutate.py --changed            # those changed since their last
                                                         # clean run (checked.json)

Exit status: 0 when every survivor is a listed equivalent, 1 otherwise (or when a run did
not finish), 2 for bad usage.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
PACKAGES = ("mocks", "assertions", "tasks", "evals", "reports")
MODULES_FILE = HERE / "modules.toml"
EQUIVALENT_FILE = HERE / "equivalent.toml"
CHECKED_FILE = HERE / "checked.json"
STAGE = ROOT / "build" / "mutation"

KILLED = frozenset({"killed", "timeout", "segfault", "caught by type check"})
"""mutmut statuses of a mutant the tests noticed (a hang or a crash is noticed too)."""
SURVIVED = frozenset({"survived", "no tests", "suspicious"})
"""Statuses of a mutant no test noticed (``no tests``: no configured test calls it)."""


class UsageError(Exception):
    """Bad arguments or configuration: names the bad value and what is accepted."""


@dataclass(frozen=True)
class Module:
    """One module under mutation and the tests that cover it."""

    path: str
    """Its path in the repository: ``assertions/_metrics.py``."""
    tests: tuple[str, ...]
    why: str = ""
    open: bool = False
    """Its survivors are not triaged yet: reported, not failing, and left out of CI's
    ``--changed`` run until they are."""

    @property
    def staged(self) -> str:
        """Its path in the staging directory: ``twice/assertions/_metrics.py``."""
        return f"twice/{self.path}"

    @property
    def dotted(self) -> str:
        """Its import name: ``twice.assertions._metrics``."""
        return "twice." + self.path.removesuffix(".py").replace("/", ".")

    def digest(self, root: Path = ROOT) -> str:
        """sha256 of its source: a change makes ``--changed`` run it again."""
        return hashlib.sha256((root / self.path).read_bytes()).hexdigest()


@dataclass(frozen=True)
class Equivalent:
    """A surviving mutant that no test can kill, and why."""

    module: str
    diff: str
    reason: str

    def key(self) -> tuple[str, tuple[str, ...]]:
        return (self.module, changed_lines(self.diff))


@dataclass
class Mutant:
    """One mutant's outcome."""

    name: str
    module: str
    status: str
    diff: str = ""

    def key(self) -> tuple[str, tuple[str, ...]]:
        return (self.module, changed_lines(self.diff))


@dataclass
class Outcome:
    """What a run found, per module."""

    mutants: list[Mutant] = field(default_factory=list)
    seconds: float = 0.0
    log: str = ""
    """What ``mutmut run`` printed (stdout and stderr): why a run that stopped early stopped."""

    def of(self, module: str) -> list[Mutant]:
        return [m for m in self.mutants if m.module == module]


def load_modules(path: Path = MODULES_FILE) -> list[Module]:
    """The ``[[module]]`` entries of ``modules.toml``."""
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    modules = []
    for i, entry in enumerate(data.get("module", []), start=1):
        if not isinstance(entry.get("path"), str) or not entry.get("tests"):
            raise UsageError(f"{path} [[module]] #{i}: needs 'path' and a non-empty 'tests'")
        modules.append(
            Module(
                entry["path"],
                tuple(entry["tests"]),
                entry.get("why", ""),
                bool(entry.get("open", False)),
            )
        )
    return modules


def load_equivalents(path: Path = EQUIVALENT_FILE) -> list[Equivalent]:
    """The ``[[equivalent]]`` entries of ``equivalent.toml``."""
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    out = []
    for i, entry in enumerate(data.get("equivalent", []), start=1):
        missing = [k for k in ("module", "diff", "reason") if not entry.get(k)]
        if missing:
            raise UsageError(f"{path} [[equivalent]] #{i}: missing {', '.join(missing)}")
        out.append(Equivalent(entry["module"], entry["diff"], entry["reason"]))
    return out


def changed_lines(diff: str) -> tuple[str, ...]:
    """The removed and added lines of a unified diff, whitespace collapsed: what identifies a
    mutant across renumbering (mutmut numbers mutants within their function)."""
    out = []
    for line in diff.splitlines():
        if line.startswith(("---", "+++")) or not line.startswith(("-", "+")):
            continue
        out.append(line[0] + " ".join(line[1:].split()))
    return tuple(out)


def select(modules: Sequence[Module], names: Sequence[str], changed: bool) -> list[Module]:
    """The modules named (all when none), or with ``changed`` those whose source differs
    from its last clean run."""
    by_path = {m.path: m for m in modules}
    if unknown := [n for n in names if n not in by_path]:
        raise UsageError(
            f"not a configured module: {', '.join(unknown)}; configured: "
            f"{', '.join(by_path)} (tests/mutation/modules.toml)"
        )
    chosen = [by_path[n] for n in names] if names else list(modules)
    if changed:
        checked = read_checked()
        chosen = [m for m in chosen if not m.open and checked.get(m.path) != m.digest()]
    return chosen


def read_checked(path: Path = CHECKED_FILE) -> dict[str, str]:
    """Module path → sha256 of its source at its last run without an unlisted survivor."""
    if not path.exists():
        return {}
    data: dict[str, str] = json.loads(path.read_text(encoding="utf-8"))
    return data


def record_checked(modules: Iterable[Module], path: Path = CHECKED_FILE) -> None:
    checked = read_checked(path)
    checked.update({m.path: m.digest() for m in modules})
    path.write_text(json.dumps(dict(sorted(checked.items())), indent=2) + "\n", encoding="utf-8")


STAGE_IGNORES = shutil.ignore_patterns(
    "__pycache__", "*.pyc", "node_modules", ".venv", ".installed", "build"
)
"""What a stage leaves out: caches, and the agent commands' installed environments (a venv
or node_modules beside each agent's source, gigabytes) that no mutated test imports. Links
are copied as links, never followed."""


def stage_dir_of(modules: Sequence[Module]) -> Path:
    """One staging directory per set of modules, so runs of different modules can overlap."""
    names = sorted(m.path for m in modules)
    digest = hashlib.sha256("\n".join(names).encode()).hexdigest()[:10]
    label = names[0].removesuffix(".py").replace("/", ".") if len(names) == 1 else "set"
    return STAGE / f"{label}-{digest}"


def stage(modules: Sequence[Module], stage_dir: Path) -> Path:
    """Copy the packages (as ``twice/``), the tests and a mutmut configuration into
    ``stage_dir``, dropping the results of an earlier run."""
    if stage_dir.exists():
        shutil.rmtree(stage_dir)
    ignore = STAGE_IGNORES
    for package in PACKAGES:
        shutil.copytree(ROOT / package, stage_dir / "twice" / package, ignore=ignore, symlinks=True)
    shutil.copytree(ROOT / "tests", stage_dir / "tests", ignore=ignore, symlinks=True)
    # Tests read shipped files by their repository path (evals/gate.toml, docs/...): the
    # packages are also there, as links, for reading only (imports resolve to twice/).
    for package in PACKAGES:
        (stage_dir / package).symlink_to(Path("twice") / package, target_is_directory=True)
    shutil.copytree(ROOT / "docs", stage_dir / "docs", ignore=ignore, symlinks=True)
    shutil.copy2(ROOT / "README.md", stage_dir / "README.md")
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    pytest_options = pyproject["tool"]["pytest"]["ini_options"]
    tests = sorted({t for m in modules for t in m.tests})
    config = {
        "source_paths": ["twice/"],
        "only_mutate": [m.staged for m in modules],
        "pytest_add_cli_args": ["-p", "no:randomly", "-p", "no:cacheprovider", "-n", "0"],
        "pytest_add_cli_args_test_selection": tests,
        "also_copy": [*PACKAGES, "docs", "README.md"],
    }
    lines = ["[tool.pytest.ini_options]"]
    lines += [f"{k} = {json.dumps(v)}" for k, v in pytest_options.items()]
    lines += ["", "[tool.mutmut]"]
    lines += [f"{k} = {json.dumps(v)}" for k, v in config.items()]
    (stage_dir / "pyproject.toml").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return stage_dir


def _mutmut(
    stage_dir: Path, *args: str, timeout: float | None = None, merge_stderr: bool = False
) -> str:
    env = dict(os.environ, PYTHONPATH=str(stage_dir), PYTHONDONTWRITEBYTECODE="1")
    mutmut = Path(sys.executable).with_name("mutmut")
    # A session of its own: on a timeout the whole group goes, mutmut's forked workers too.
    with subprocess.Popen(
        [str(mutmut), *args],
        cwd=stage_dir,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE,
        text=True,
        start_new_session=True,
    ) as proc:
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise
    if proc.returncode != 0:
        raise RuntimeError(
            f"mutmut {' '.join(args)} {ended(proc.returncode)}:\n{stdout[-3000:]}\n"
            f"{(stderr or '')[-3000:]}"
        )
    return stdout


def ended(returncode: int) -> str:
    """How a process ended, a signal by its name: ``exited 1``, ``was killed by SIGXCPU``.

    mutmut's wall-clock timeout sends SIGXCPU to a mutant's pid when its deadline passes, even
    after that mutant finished: on a busy machine the pid may belong to another process by
    then (pids wrap at ``/proc/sys/kernel/pid_max``)."""
    if returncode >= 0:
        return f"exited {returncode}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = f"signal {-returncode}"
    return f"was killed by {name}"


_RESULT = re.compile(r"^\s*(twice\.\S+): (.+?)\s*$")


def run(modules: Sequence[Module], jobs: int, timeout: float | None) -> Outcome:
    """Stage, run mutmut on ``modules`` and collect every mutant's status (and the diff of
    each survivor)."""
    stage_dir = stage(modules, stage_dir_of(modules))
    started = time.monotonic()
    patterns = [f"{m.dotted}.*" for m in modules]
    log = _mutmut(
        stage_dir, "run", "--max-children", str(jobs), *patterns, timeout=timeout, merge_stderr=True
    )
    listing = _mutmut(stage_dir, "results", "--all", "true")
    owner = {m.dotted: m.path for m in modules}
    outcome = Outcome(seconds=time.monotonic() - started, log=log)
    for line in listing.splitlines():
        match = _RESULT.match(line)
        if not match:
            continue
        name, status = match.groups()
        module = _module_of(name, owner)
        if module is None:
            continue
        mutant = Mutant(name, module, status)
        if status not in KILLED:
            mutant.diff = _mutmut(stage_dir, "show", name)
        outcome.mutants.append(mutant)
    return outcome


_PROGRESS = re.compile(r"^\W*\d+/\d+\s")


def last_output(log: str, lines: int = 12) -> list[str]:
    """The end of what ``mutmut run`` printed, its progress counter redrawn with carriage
    returns reduced to the last count, and without the list of every mutant's result it ends
    with: where and why a run stopped early (mutmut exits 0 after an interrupt, leaving the
    rest of the mutants "not checked")."""
    out: list[str] = []
    for part in re.split(r"[\r\n]+", log.split("\nMutant results\n", 1)[0]):
        text = part.strip()
        if not text:
            continue
        if out and _PROGRESS.match(text) and _PROGRESS.match(out[-1]):
            out[-1] = text
        else:
            out.append(text)
    return out[-lines:]


def _module_of(name: str, owner: dict[str, str]) -> str | None:
    """``twice.assertions._metrics.x_trial_metrics__mutmut_3`` → its module's path."""
    for dotted, path in owner.items():
        if name.startswith(dotted + ".x"):
            return path
    return None


@dataclass
class Verdict:
    """The run judged against the equivalents list."""

    unlisted: list[Mutant]
    stale: list[Equivalent]
    unfinished: list[Mutant]
    lines: list[str]
    pending: list[Mutant] = field(default_factory=list)
    """Survivors of modules still open (``open = true`` in modules.toml): reported only."""

    @property
    def ok(self) -> bool:
        return not (self.unlisted or self.stale or self.unfinished)


def judge(
    modules: Sequence[Module], outcome: Outcome, equivalents: Sequence[Equivalent]
) -> Verdict:
    """Per module: mutants, killed, the kill rate, equivalents; every unlisted survivor."""
    listed = {e.key(): e for e in equivalents if e.module in {m.path for m in modules}}
    unlisted: list[Mutant] = []
    pending: list[Mutant] = []
    unfinished: list[Mutant] = []
    found: set[tuple[str, tuple[str, ...]]] = set()
    lines = []
    for module in modules:
        mutants = outcome.of(module.path)
        killed = [m for m in mutants if m.status in KILLED]
        survived = [m for m in mutants if m.status in SURVIVED]
        unfinished += [m for m in mutants if m.status not in KILLED | SURVIVED]
        equivalent = [m for m in survived if m.key() in listed]
        found.update(m.key() for m in equivalent)
        (pending if module.open else unlisted).extend(m for m in survived if m.key() not in listed)
        real = len(mutants) - len(equivalent)
        rate = f"{len(killed) / real:.1%}" if real else "n/a"
        lines.append(
            f"{module.path}: {len(mutants)} mutants, {len(killed)} killed, "
            f"{len(equivalent)} equivalent, {len(survived) - len(equivalent)} unlisted "
            f"survivors; kill rate {rate} of the non-equivalent"
            + (" (open: survivors not triaged yet)" if module.open else "")
        )
    stale = [e for key, e in listed.items() if key not in found]
    return Verdict(unlisted, stale, unfinished, lines, pending)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("modules", nargs="*", help="module paths from modules.toml (all)")
    parser.add_argument(
        "--changed",
        action="store_true",
        help="only modules changed since their last clean run (checked.json)",
    )
    parser.add_argument(
        "--always",
        action="append",
        default=[],
        metavar="MODULE",
        help="with --changed, run this module even when unchanged (a smoke)",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=int(os.environ.get("MUTATION_JOBS", "2")),
        help="mutants tested at once (MUTATION_JOBS, default 2)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="stop the run after this long and fail (default: no limit)",
    )
    parser.add_argument(
        "--record",
        action="store_true",
        help="on success, record the modules' sources in checked.json",
    )
    args = parser.parse_args(argv)
    try:
        if args.jobs < 1:
            raise UsageError(f"--jobs must be an integer >= 1, got {args.jobs}")
        modules = load_modules()
        chosen = select(modules, args.modules, args.changed)
        for extra in select(modules, args.always, changed=False) if args.always else []:
            if extra not in chosen:
                chosen.append(extra)
        equivalents = load_equivalents()
    except UsageError as ex:
        print(f"mutation: {ex}", file=sys.stderr)
        return 2
    if not chosen:
        print("mutation: no configured module changed since its last clean run")
        return 0
    print(f"mutation: {', '.join(m.path for m in chosen)} (jobs {args.jobs})", flush=True)
    try:
        outcome = run(chosen, args.jobs, args.timeout)
    except subprocess.TimeoutExpired:
        print(f"mutation: did not finish within {args.timeout:g} s", file=sys.stderr)
        return 1
    verdict = judge(chosen, outcome, equivalents)
    print("\n".join(verdict.lines))
    print(f"mutation: {len(outcome.mutants)} mutants in {outcome.seconds:.0f} s")
    for m in verdict.unlisted:
        print(f"\nSURVIVED ({m.status}) {m.name}\n{m.diff.rstrip()}")
    for m in verdict.pending:
        print(f"\nOPEN ({m.status}) {m.name}\n{m.diff.rstrip()}")
    for e in verdict.stale:
        print(f"\nSTALE equivalent in {e.module} (no such survivor now; delete it):\n{e.diff}")
    for m in verdict.unfinished:
        print(f"\nNOT FINISHED ({m.status}) {m.name}")
    if verdict.unfinished:
        print(
            f"\nmutation: {len(verdict.unfinished)} mutant(s) were never run: mutmut stopped "
            "early. The end of its output:"
        )
        print("\n".join(f"  {line}" for line in last_output(outcome.log)))
    if verdict.unlisted:
        print(
            f"\nmutation: {len(verdict.unlisted)} survivor(s): kill each with a test, or list "
            "it in tests/mutation/equivalent.toml with the reason no test can"
        )
    if verdict.ok and args.record:
        record_checked(m for m in chosen if not m.open)  # an open module is not clean yet
    return 0 if verdict.ok else 1


if __name__ == "__main__":
    sys.exit(main())
