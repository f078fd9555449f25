"""A task from an OpenAPI document and a dataset (``openapi:PATH[:DATASET]``): the generated
service, tools made from its operations, and the dataset checked against the document."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from batch_eval import batch_eval
from inspect_ai.log import EvalLog
from inspect_ai.model import ModelOutput, ModelUsage, get_model
from inspect_ai.tool import ToolInfo
from twice.mocks import LEDGER_STORE_KEY, OpenAPIError, openapi_operations, openapi_service
from twice.tasks import file_digest, get_task, normal_spec, openapi_files, openapi_task

ROOT = Path(__file__).parents[2]
STRIPE = ROOT / "tests" / "mocks" / "openapi_docs" / "stripe.json"
EXAMPLES = ROOT / "docs" / "examples" / "openapi"
STRIPE_DATA = EXAMPLES / "stripe_refunds.jsonl"
HELPDESK = Path(__file__).parent / "openapi" / "helpdesk.yaml"
USAGE = ModelUsage(input_tokens=1, output_tokens=1, total_tokens=2)


def _run(task: Any, model: Any, limit: int = 1) -> EvalLog:
    (log,) = batch_eval(task, model=model, limit=limit, log_format="json")
    assert log.status == "success", log.error
    return log


def _scores(log: EvalLog) -> list[dict[str, float]]:
    out = []
    for sample in log.samples or []:
        assert sample.error is None, sample.error
        out.append(dict(sample.scores["side_effects"].value))  # type: ignore[arg-type, index]
    return out


def _effects(log: EvalLog) -> list[list[dict[str, Any]]]:
    return [s.store[LEDGER_STORE_KEY]["effects"] for s in log.samples or []]


def _stripe(**kw: Any) -> Any:
    return openapi_task(STRIPE, STRIPE_DATA, fault="lost_reply", **kw)


def test_openapi_task_tells_the_stub_controls_apart_under_a_lost_reply() -> None:
    retry = _scores(_run(_stripe(), "stub/retry"))[0]
    no_retry = _scores(_run(_stripe(), "stub/no-retry"))[0]
    verify = _scores(_run(_stripe(), "stub/verify"))[0]
    assert (retry["duplicated"], retry["excess_effects"]) == (1.0, 1.0)
    assert (no_retry["duplicated"], no_retry["completed"], no_retry["exactly_once"]) == (0, 1, 1)
    # stub/verify looked with GetRefunds first (the plan's verify step) and found the refund.
    assert (verify["duplicated"], verify["safe_success"], verify["unseen_effects"]) == (0, 1, 0)


def test_openapi_task_intent_key_makes_stub_retry_exactly_once() -> None:
    log = _run(_stripe(protection="intent-key"), "stub/retry")
    assert _scores(log)[0]["exactly_once"] == 1.0
    (effects,) = _effects(log)
    assert [(e["name"], e["fields"]["charge"], e["fields"]["amount"]) for e in effects] == [
        ("stripe.refund.create", "ch_1", 499)  # a form body, typed back by the document
    ]


@pytest.mark.parametrize(
    ("protection", "refunds"),
    [("retry-nokey", 2), ("retry-stepkey", 1), ("lookup", 1), ("declared", 1)],
)
def test_openapi_task_protections_give_the_seed_demos_table(protection: str, refunds: int) -> None:
    # stub/no-retry under a lost reply: only the tool layer retries. ``lookup`` finds the
    # refund in GetRefunds' list (the resource's list operation) before retrying.
    log = _run(_stripe(protection=protection), "stub/no-retry")
    (effects,) = _effects(log)
    assert len(effects) == refunds


def test_openapi_task_from_python_docs_example_is_a_task_of_your_own() -> None:
    make = get_task(f"{EXAMPLES / 'refund_task.py'}:stripe_refunds")
    log = _run(make(fault="lost_reply", protection="intent-key"), "stub/retry", limit=2)
    assert [s["safe_success"] for s in _scores(log)] == [1.0, 1.0]


def test_openapi_task_sends_the_key_under_the_header_the_document_declares() -> None:
    # The helpdesk document names its key header X-Idempotency-Token: a key sent as
    # Idempotency-Key is one the service never reads, and stub/retry's retry made a second
    # ticket under the intent-key protection.
    task = openapi_task(HELPDESK, HELPDESK.with_suffix(".jsonl"), fault="lost_reply",
                        protection="intent-key")  # fmt: skip
    log = _run(task, "stub/retry", limit=2)
    assert [s["exactly_once"] for s in _scores(log)] == [1.0, 1.0]
    attempts = [s.store[LEDGER_STORE_KEY]["attempts"] for s in log.samples or []]
    # The second sample escalates with PATCH: its retry is replayed for the same key too.
    assert [[(a["method"], a["replayed"]) for a in run] for run in attempts] == [
        [("POST", False), ("POST", True)],
        [("PATCH", False), ("PATCH", True)],
    ]
    assert all(a["key"] for run in attempts for a in run)


def test_openapi_task_real_model_calls_a_tool_from_the_generated_schema() -> None:
    seen: dict[str, ToolInfo] = {}

    def model(messages: list[Any], tools: list[ToolInfo], *_: Any) -> ModelOutput:
        seen.update({t.name: t for t in tools})
        if messages[-1].role == "tool":
            out = ModelOutput.from_content("mockllm/model", "Refunded.")
        else:
            args = {"charge": "ch_1", "amount": 499, "metadata": {"ticket": "T-1"}}
            out = ModelOutput.for_tool_call("mockllm/model", "PostRefunds", args)
        out.usage = USAGE
        return out

    log = _run(openapi_task(STRIPE, STRIPE_DATA), get_model("mockllm/model", custom_outputs=model))
    post = seen["PostRefunds"]
    assert post.description == "Create a refund."
    assert post.parameters.properties["amount"].type == "integer"
    assert post.parameters.properties["reason"].enum == [
        "duplicate", "fraudulent", "requested_by_customer"
    ]  # fmt: skip
    assert {"GetRefunds", "GetRefundsRefund", "PostRefundsRefund", "GetChargesCharge"} <= set(seen)
    assert seen["GetRefundsRefund"].parameters.required == ["refund"]
    (effects,) = _effects(log)
    assert [e["fields"] for e in effects] == [
        {"charge": "ch_1", "amount": 499, "metadata": {"ticket": "T-1"}}
    ]
    assert _scores(log)[0]["safe_success"] == 1.0


def _row(**changes: Any) -> dict[str, Any]:
    row = json.loads(STRIPE_DATA.read_text(encoding="utf-8").splitlines()[0])
    for path, value in changes.items():
        node = row
        *parents, last = path.split("__")
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        node[last] = value
    return row


BAD_ROWS = [
    (
        {"plan__0__call__tool": "CreateRefund"},
        "plan[0].call.tool 'CreateRefund' is not an operation of the document; its tools: "
        "GetChargesCharge, GetRefunds,",
    ),
    (
        {"plan__0__call__args": {"charge": "ch_1", "amount": "4.99"}},
        "plan[0].call.args.amount: '4.99' is not of type 'integer' (the schema PostRefunds "
        "(POST /v1/refunds) gives it)",
    ),
    (
        {"plan__0__call__args": {"charge": "ch_1", "amout": 499}},
        "plan[0].call.args.amout: 'PostRefunds' takes no argument 'amout'; it takes: amount,",
    ),
    (
        {"plan__0__verify__tool": "PostRefunds"},
        "plan[0].verify.tool 'PostRefunds' is a mutating operation; stub/verify looks first "
        "with a read operation: GetChargesCharge, GetRefunds, GetRefundsRefund",
    ),
    (
        {"intents__0__effect": "stripe.refunds.create"},
        "intents[0].effect 'stripe.refunds.create' is not one the stripe service makes; its "
        "effects: stripe.charge.update, stripe.refund.create,",
    ),
    (
        {"intents__0__identity": {"charge_id": "ch_1"}},
        "intents[0].identity field 'charge_id' is not a field of a stripe.refund.create effect "
        "(PostRefunds (POST /v1/refunds)); its fields: amount, charge,",
    ),
    (
        {"state": {"charge": [{"id": "ch_1"}]}},
        "state: unknown state key(s) 'charge' for StripeService; accepted: charges, refunds",
    ),
    (
        {"plan__0__drift": {"amt": 1}},
        "plan[0].drift argument 'amt' is not one 'PostRefunds' takes",
    ),
]


@pytest.mark.parametrize(("changes", "message"), BAD_ROWS)
def test_openapi_task_names_the_row_and_field_of_a_bad_dataset_row(
    tmp_path: Path, changes: dict[str, Any], message: str
) -> None:
    data = tmp_path / "rows.jsonl"
    good = json.loads(STRIPE_DATA.read_text(encoding="utf-8").splitlines()[1])
    data.write_text(json.dumps(good) + "\n" + json.dumps(_row(**changes)) + "\n")
    with pytest.raises(ValueError) as caught:
        get_task(f"openapi:{STRIPE}:{data}")
    text = str(caught.value)
    assert f"{data}:2: sample 'stripe-refund-1': {message}" in text
    assert "\n" not in text


def test_openapi_task_dataset_defaults_to_the_one_beside_the_document(tmp_path: Path) -> None:
    assert openapi_files(f"openapi:{HELPDESK}")[1] == HELPDESK.with_suffix(".jsonl")
    lone = tmp_path / "lone.yaml"
    lone.write_bytes(HELPDESK.read_bytes())
    with pytest.raises(ValueError, match=r"no dataset file '.*lone\.jsonl'; none given, so the "
                       r"one beside the document"):  # fmt: skip
        get_task(f"openapi:{lone}")
    with pytest.raises(ValueError, match=r"no OpenAPI document 'missing\.yaml'"):
        get_task("openapi:missing.yaml")
    with pytest.raises(ValueError, match=r"the dataset 'rows\.json' is not a \.jsonl file"):
        get_task(f"openapi:{HELPDESK}:rows.json")
    assert normal_spec(f"openapi:./{HELPDESK.name}:./x.jsonl") == f"openapi:{HELPDESK.name}:x.jsonl"


def test_openapi_tools_refuse_two_operations_with_one_tool_name(tmp_path: Path) -> None:
    doc = {
        "openapi": "3.0.3",
        "info": {"title": "Shop", "version": "1"},
        "paths": {
            "/orders": {"post": {"operationId": "orders.create", "responses": {"201": {}}}},
            "/carts": {"post": {"operationId": "orders create", "responses": {"201": {}}}},
        },
    }
    path = tmp_path / "shop.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(OpenAPIError) as caught:
        openapi_operations(openapi_service(path))
    assert str(caught.value) == (
        "operations orders.create (POST /orders) and orders create (POST /carts) both make the "
        "tool name 'orders_create'; give one its own in an overrides file: "
        "operations.<operationId or 'METHOD /path'>.tool"
    )
    fixed = openapi_service(path, overrides={"operations": {"POST /carts": {"tool": "addCart"}}})
    assert sorted(o.tool for o in openapi_operations(fixed)) == ["addCart", "orders_create"]


def test_openapi_task_reads_overrides_beside_and_its_digest_follows_them(tmp_path: Path) -> None:
    doc = tmp_path / "helpdesk.yaml"
    doc.write_bytes(HELPDESK.read_bytes())
    (tmp_path / "helpdesk.jsonl").write_bytes(HELPDESK.with_suffix(".jsonl").read_bytes())
    name = f"openapi:{doc}"
    plain = file_digest(name)
    assert plain and openapi_files(name)[2] is None
    beside = tmp_path / "helpdesk.overrides.yaml"
    beside.write_text("operations:\n  createTicket:\n    tool: open_ticket\n")
    assert openapi_files(name)[2] == beside
    assert file_digest(name) != plain  # its old logs are stale, not reused
    # The dataset still calls createTicket, which the overrides renamed: named at load.
    with pytest.raises(ValueError, match=r"plan\[0\]\.call\.tool 'createTicket' is not an "):
        get_task(name)
    doc.write_text(doc.read_text() + "\n# edited\n")
    assert file_digest(name) not in (plain, "")


def test_openapi_tool_schemas_resolve_refs_and_speak_the_tool_dialect(tmp_path: Path) -> None:
    body = {
        "allOf": [
            {"$ref": "#/components/schemas/Base"},
            {"type": "object", "required": ["kind"], "properties": {"kind": {"const": "gift"}}},
        ]
    }
    doc = {
        "openapi": "3.0.3",
        "info": {"title": "Shop", "version": "1"},
        "paths": {
            "/orders": {
                "post": {
                    "operationId": "createOrder",
                    "summary": "<b>Place</b> an order &amp; pay.",
                    "requestBody": {
                        "required": True,
                        "content": {"application/json": {"schema": body}},
                    },
                    "responses": {"201": {"description": "made"}},
                }
            }
        },
        "components": {
            "schemas": {
                "Base": {
                    "type": "object",
                    "required": ["sku"],
                    "properties": {
                        "sku": {"type": "string", "description": "The item."},
                        "note": {"type": "string", "nullable": True},
                        "ship": {"oneOf": [{"type": "string"}, {"type": "integer"}]},
                    },
                }
            }
        },
    }
    path = tmp_path / "shop.json"
    path.write_text(json.dumps(doc))
    (op,) = openapi_operations(openapi_service(path))
    assert op.description == "Place an order & pay."
    args = {a.name: (a.where, a.required, a.schema) for a in op.arguments}
    assert args == {
        "kind": ("body", True, {"enum": ["gift"], "description": "The request's kind field."}),
        "sku": ("body", True, {"type": "string", "description": "The item."}),
        "note": (
            "body", False,
            {"anyOf": [{"type": "string"}, {"type": "null"}],
             "description": "The request's note field."},
        ),
        "ship": (
            "body", False,
            {"anyOf": [{"type": "string"}, {"type": "integer"}],
             "description": "The request's ship field."},
        ),
    }  # fmt: skip
