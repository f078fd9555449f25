"""The data and code the site's pages include are loaded, validated and run here."""

from __future__ import annotations

import json
import os
import re
import runpy
from pathlib import Path
from typing import Any

import httpx
import pytest
from twice.assertions import parse_assertion
from twice.evals import RunResult, load_gate, load_suite, running_server

ROOT = Path(__file__).parents[2]
SNIPPETS = ROOT / "docs" / "snippets"


def contained(shown: Any, actual: Any) -> bool:
    """Whether ``shown`` is ``actual`` with some dict keys left out (the page shortens a record)."""
    if isinstance(shown, dict):
        return isinstance(actual, dict) and all(
            k in actual and contained(v, actual[k]) for k, v in shown.items()
        )
    if isinstance(shown, list):
        return (
            isinstance(actual, list)
            and len(shown) == len(actual)
            and all(contained(s, a) for s, a in zip(shown, actual, strict=True))
        )
    return bool(shown == actual)


def test_assertion_lines_parse_and_round_trip() -> None:
    lines = (SNIPPETS / "assertions.jsonl").read_text(encoding="utf-8").splitlines()
    assert len(lines) == 2
    for line in lines:
        data = json.loads(line)
        assertion = parse_assertion(data)
        assert contained(data, assertion.to_dict()), (data, assertion.to_dict())


def test_every_gate_toml_shown_loads() -> None:
    for path in (SNIPPETS / "gate.toml", ROOT / "evals" / "gate.toml"):
        gate = load_gate(path)
        assert gate.rules, path


def test_every_shipped_suite_loads() -> None:
    suites = sorted((ROOT / "evals").glob("*.toml"))
    assert ROOT / "evals" / "default.toml" in suites
    for path in suites:
        if path.name == "gate.toml":
            continue
        assert list(load_suite(path).cells()), path


def test_the_refund_record_shown_is_the_datasets_first() -> None:
    shown = json.loads((SNIPPETS / "refund-record.json").read_text(encoding="utf-8"))
    first = (ROOT / "tasks" / "refund" / "dataset.jsonl").read_text(encoding="utf-8")
    actual = json.loads(first.splitlines()[0])
    assert contained(shown, actual), "docs/snippets/refund-record.json is not the first record"
    assert shown["plan"][0]["drift"] == {"amount": 4.98}


def test_the_containment_check_catches_a_changed_value() -> None:
    assert not contained({"a": {"b": 1}}, {"a": {"b": 2, "c": 3}})
    assert not contained({"a": [1]}, {"a": [1, 2]})
    assert contained({"a": {"b": 1}}, {"a": {"b": 1, "c": 3}})


def test_the_summary_shown_has_only_keys_a_run_writes(reference_summary: dict[str, Any]) -> None:
    shown = json.loads((SNIPPETS / "summary.json").read_text(encoding="utf-8"))
    real_cell = reference_summary["cells"][0]
    for cell in shown["cells"]:
        keys = set(cell) - {"..."}
        assert keys <= set(real_cell), keys - set(real_cell)
        for key, value in cell.items():
            if key.endswith("_ci"):
                lo, hi = value
                assert lo <= cell[key.replace("_ci", "_rate")] <= hi
    assert set(shown["run"]) - {"..."} <= set(reference_summary["run"])
    assert set(shown["run"]["prompts"]["baseline"]) <= set(
        reference_summary["run"]["prompts"]["baseline"]
    )


def test_the_report_api_snippet_writes_a_report(
    reference_run: RunResult, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    logs = Path(reference_run.summary_path).parent
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "demo").symlink_to(logs)
    (tmp_path / "logs" / "before").symlink_to(logs)
    monkeypatch.chdir(tmp_path)
    runpy.run_path(str(SNIPPETS / "report_api.py"), run_name="__main__")
    html = (tmp_path / "report.html").read_text(encoding="utf-8")
    assert "stub/retry" in html and "baseline" in html


def test_the_stripe_snippet_refunds_once_then_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    import stripe

    # The snippet sets the SDK's module-level settings; put them back afterwards.
    for name in ("api_key", "api_base", "max_network_retries"):
        monkeypatch.setattr(stripe, name, getattr(stripe, name))
    with running_server() as running:
        monkeypatch.setenv("TWICE_SERVE_URL", running.url)
        runpy.run_path(str(SNIPPETS / "stripe_retries.py"), run_name="__main__")
        trials = httpx.get(f"{running.url}/_twice/trials").json()["trials"]
        assert len(trials) == 2
        refunds = [
            len(httpx.get(f"{running.url}/_twice/trials/{t['id']}/ledger").json()["effects"])
            for t in trials
        ]
    # The SDK's own retry reuses its key: once. A retry around the SDK makes a new key: twice.
    assert sorted(refunds) == [1, 2], refunds
    assert os.environ["TWICE_SERVE_URL"] == running.url


@pytest.mark.parametrize("page", ["README.md", "docs/getting-started.md"])
def test_the_extras_table_names_every_extra_of_the_package(page: str) -> None:
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"][
        "optional-dependencies"
    ]
    text = (ROOT / page).read_text(encoding="utf-8")
    shown = set(re.findall(r"^\| `([\w-]+)` \| ", text.split("| extra | for |")[1], re.M))
    assert shown == set(extras), f"{page}: {shown ^ set(extras)}"


def test_the_serve_api_page_is_what_a_server_answers() -> None:
    page = (ROOT / "docs" / "reference" / "serve-api.md").read_text(encoding="utf-8")
    shown = re.findall(r"^\| `(GET|POST|DELETE) (/_twice/trials[^`]*)`", page, re.M)
    assert len(shown) == 6, shown
    with running_server() as running:
        made = httpx.post(f"{running.url}/_twice/trials", json={"task": "refund"})
        assert made.status_code == 201
        trial = made.json()
        assert {"id", "task", "sample", "fault", "protection", "hang_seconds", "urls"} <= set(trial)
        assert {"payments", "mcp"} <= set(trial["urls"])
        bad = httpx.post(f"{running.url}/_twice/trials", json={"task": "refund", "x": 1})
        assert bad.status_code == 400 and "'x'" in bad.text
        for method, path in shown:
            if method == "POST":
                continue
            url = running.url + path.split(" ")[0].replace("<id>", trial["id"])
            r = httpx.request(method, url)
            assert r.status_code == 200, (method, path, r.text)
            body = r.json()
            if path.endswith("/ledger"):
                assert {"attempts", "effects"} <= set(body)
            elif path.endswith("/verdict"):
                assert {"metrics", "explanation"} <= set(body)
            elif method == "DELETE":
                assert body == {"id": trial["id"], "deleted": True}
        gone = httpx.get(f"{running.url}/_twice/trials/{trial['id']}")
        assert gone.status_code == 404
        assert httpx.put(f"{running.url}/_twice/trials").status_code == 405


def test_the_suite_toml_page_names_every_key_the_loader_takes(tmp_path: Path) -> None:
    from twice.evals.suite import AXES, SuiteError

    page = (ROOT / "docs" / "reference" / "suite-toml.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| (.+?) \| (top|`\[\[matrix\]\]`) \|", page, re.M)
    top = {k for keys, where in rows if where == "top" for k in re.findall(r"`\[?(\w+)", keys)}
    axes = {k for keys, where in rows if where != "top" for k in re.findall(r"`(\w+)`", keys)}
    # The loader names every key it takes when it meets one it does not.
    probe = tmp_path / "suite.toml"
    probe.write_text('not_a_key = 1\n[[matrix]]\nmodels = ["stub/retry"]\n', encoding="utf-8")
    with pytest.raises(SuiteError) as refused:
        load_suite(probe)
    taken = set(str(refused.value).split("expected: ")[1].split(", "))
    assert top == taken - {"matrix"}, top ^ (taken - {"matrix"})
    assert axes == set(AXES)


@pytest.mark.parametrize(
    ("where", "toml"),
    [
        ("top", "not_a_key = 1\n"),
        (
            "`[[rule]]`",
            '[[rule]]\nname = "r"\nmetric = "duplication_rate"\nmax = 0.1\nnot_a_key = 1\n',
        ),
        ("`[baseline]`", "[baseline]\nnot_a_key = 1\n"),
    ],
)
def test_the_gate_toml_page_names_every_key_the_loader_takes(
    tmp_path: Path, where: str, toml: str
) -> None:
    from twice.evals import GateError

    page = (ROOT / "docs" / "reference" / "gate-toml.md").read_text(encoding="utf-8")
    rows = re.findall(rf"^\| (.+?) \| {re.escape(where)} \|", page, re.M)
    shown = {k for keys in rows for k in re.findall(r"`(\w+)`", keys)}
    probe = tmp_path / "gate.toml"
    probe.write_text(toml, encoding="utf-8")
    # The loader names every key it takes when it meets one it does not.
    with pytest.raises(GateError) as refused:
        load_gate(probe)
    taken = set(str(refused.value).split("expected: ")[1].split(", ")) - {"rule", "baseline"}
    assert shown == taken, shown ^ taken
