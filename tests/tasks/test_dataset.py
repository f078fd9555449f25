"""Datasets are JSONL validated by a typed loader; bad records name file, line and problem."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from twice.tasks import TASKS, load_records
from twice.tasks.refund.refund import DATASET


def test_refund_dataset_is_varied_and_carries_intents() -> None:
    records = load_records(DATASET)
    assert len(records) >= 20
    orders = {r.intents[0].identity["order_id"] for r in records}
    assert len(orders) == len(records)
    assert len({r.input for r in records}) == len(records)
    assert any(r.intents[0].identity["order_id"] == "order_1042" for r in records)
    for r in records:
        assert r.plan and r.plan[0].verify is not None and r.plan[0].found_pattern


def test_every_task_builds(tmp_path: Path) -> None:
    for name, fn in TASKS.items():
        task = fn(fault="lost_reply", protection="bare", prompt="baseline")
        assert len(task.dataset) >= 20, name


def test_bad_record_names_line(tmp_path: Path) -> None:
    good = DATASET.read_text().splitlines()[0]
    bad = json.loads(good)
    del bad["intents"]
    path = tmp_path / "d.jsonl"
    path.write_text(good + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(ValueError, match=r"(?s)d\.jsonl:2: invalid dataset record.*intents"):
        load_records(path)


def test_duplicate_id_is_rejected(tmp_path: Path) -> None:
    good = DATASET.read_text().splitlines()[0]
    path = tmp_path / "d.jsonl"
    path.write_text(good + "\n" + good + "\n")
    with pytest.raises(ValueError, match="duplicate sample id 'refund-001'"):
        load_records(path)


def test_verify_step_needs_found_pattern(tmp_path: Path) -> None:
    rec = json.loads(DATASET.read_text().splitlines()[0])
    del rec["plan"][0]["found_pattern"]
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps(rec) + "\n")
    with pytest.raises(ValueError, match="needs 'found_pattern'"):
        load_records(path)


def test_assertions_in_a_twice_datasets_metadata_are_refused_not_ignored(tmp_path: Path) -> None:
    # The failing path: they went into every sample's metadata, unread by the side_effects
    # scorer, so an agent that did what they forbade still counted as safe.
    rec = json.loads(DATASET.read_text().splitlines()[0])
    rec["metadata"] = {"assertions": [{"assert": "never", "effect": "payments.refund.create"}]}
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps(rec) + "\n")
    with pytest.raises(ValueError, match=r"d\.jsonl:1: .*metadata\.assertions is read only by "):
        load_records(path)


def test_assertions_in_samples_of_a_dataset_built_elsewhere_are_refused_too() -> None:
    # The failing path: the check was in load_records only, so a twice_task given inspect's
    # own dataset (MemoryDataset, json_dataset) with metadata["assertions"] built and
    # ignored them.
    import importlib

    from inspect_ai.dataset import MemoryDataset, Sample
    from twice.tasks import load_dataset, twice_task

    refund = importlib.import_module("twice.tasks.refund.refund")
    never = [{"assert": "never", "effect": "payments.refund.create"}]
    samples = [
        Sample(id=s.id, input=s.input, metadata={**(s.metadata or {}), "assertions": never})
        for s in load_dataset(DATASET, "refund")
    ]
    with pytest.raises(ValueError, match=r"sample 'refund-001': metadata\.assertions is read"):
        twice_task(
            name="mine_refund", dataset=MemoryDataset(samples, name="x"),
            services=refund._services, tools=refund.refund_tools,
            fault="none", protection="bare", prompt="baseline",
        )  # fmt: skip


def _with_intent(tmp_path: Path, **changes: object) -> Path:
    rec = json.loads(DATASET.read_text().splitlines()[0])
    rec["intents"][0].update(changes)
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps(rec) + "\n")
    return path


def test_refund_intents_state_the_amount_asked_in_cents() -> None:
    records = {r.id: r for r in load_records(DATASET)}
    assert records["refund-001"].intents[0].values == {"amount": 499}  # "$4.99"
    for r in records.values():
        for intent in r.intents:
            step = next(s for s in r.plan if s.call.args["order_id"] == intent.identity["order_id"])
            assert intent.values == {"amount": round(step.call.args["amount"] * 100)}, r.id


def test_every_builtin_intent_states_its_values() -> None:
    # "values": {} says the identity is all the request fixes (an email's recipient and
    # subject); an intent expected 0 times states none.
    for name in TASKS:
        path = Path(__file__).resolve().parents[2] / "tasks" / name / "dataset.jsonl"
        for line in path.read_text(encoding="utf-8").splitlines():
            for intent in json.loads(line)["intents"]:
                assert ("values" in intent) == (intent["expected"] >= 1), (name, intent)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"values": {"order_id": "order_1042"}}, "order_id is both in identity and in values"),
        ({"values": {"amount": 499}, "expected": 0}, "values {'amount': 499} on an intent "),
        ({"values": {"amount": [499]}}, r"value 'amount' is \[499\]; a value is a JSON string"),
        ({"values": ["amount"]}, r"intents\.0\.values: Input should be a valid dictionary"),
    ],
)
def test_bad_intent_values_name_the_problem(
    tmp_path: Path, changes: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=rf"d\.jsonl:1: invalid dataset record.*{message}"):
        load_records(_with_intent(tmp_path, **changes))
