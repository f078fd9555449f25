"""Fixtures for the report tests: real twice logs, hostile logs, synthetic logs, a browser."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from batch_eval import batch_eval
from inspect_ai import task_with
from inspect_ai.model import ChatMessage, ChatMessageTool, ModelOutput, ModelUsage, get_model
from synthetic_logs import SyntheticRun, write_synthetic_logs
from twice.reports import trials_frame
from twice.tasks.refund.refund import refund

# Each payload would set window.__pwned if it ever ran as markup.
SCRIPT = "<script>window.__pwned = 'script'</script>"
IMG = "<img src=x onerror=\"window.__pwned = 'img'\">"
STYLE = "</style><script>window.__pwned = 'style'</script><style>"
PAYLOADS = (SCRIPT, IMG, STYLE)
BIDI = "\u202eevil \u2067isolated"
"""Directional overrides: escaped or not, they reverse what follows on the line."""
PROMPT_NAME = "<img src=x onerror=window.__pwned=1>"
"""A prompt file stem (prompt names are file stems): the name shows all over the report."""


def _usage() -> ModelUsage:
    # mockllm counts tokens with a downloaded tokenizer unless usage is set (offline box).
    return ModelUsage(input_tokens=10, output_tokens=5, total_tokens=15)


def _call(tool: str, args: dict[str, Any]) -> ModelOutput:
    out = ModelOutput.for_tool_call("mockllm/model", tool, args, content="")
    out.usage = _usage()
    return out


def _say(text: str) -> ModelOutput:
    out = ModelOutput.from_content("mockllm/model", text)
    out.usage = _usage()
    return out


def hostile_policy(
    input: list[ChatMessage], tools: Any, tool_choice: Any, config: Any
) -> ModelOutput:
    """A scripted agent whose tool arguments and answer are HTML/JS payloads.

    Looks up an order whose id is a payload (the 404 message echoes it back), then refunds
    with a payload as the reason; under ``lost_reply`` it retries, so the trial duplicates and
    lands in the report's drill-down with every payload in it.
    """
    turns = sum(1 for m in input if m.role == "assistant")
    refund_args = {"order_id": "order_1042", "amount": 4.99, "reason": SCRIPT + IMG}
    if turns == 0:
        return _call("get_order", {"order_id": IMG})
    if turns == 1:
        return _call("issue_refund", refund_args)
    last = input[-1]
    if turns == 2 and isinstance(last, ChatMessageTool) and last.error is not None:
        return _call("issue_refund", refund_args)
    return _say(f"Done {STYLE} {SCRIPT} {IMG} {BIDI}")


@pytest.fixture(scope="session")
def refund_logs(made_once: Callable[[str, Callable[[Path], None]], Path]) -> Path:
    """A real run of the refund task with stub models: duplicates from the model and from
    transport retries, a clean verifier, two prompts for one model (made once per test run;
    the tests only read it)."""
    cells = [
        ("stub/retry", "baseline", "lost_reply", "bare"),
        ("stub/retry", "cautious", "lost_reply", "bare"),
        ("stub/no-retry", "baseline", "lost_reply", "retry-nokey"),
        ("stub/verify", "baseline", "timeout_before_commit", "bare"),
    ]

    def make(log_dir: Path) -> None:
        tasks = [
            task_with(refund(fault=f, protection=p, prompt=pr), model=get_model(m))
            for m, pr, f, p in cells
        ]
        logs = batch_eval(tasks, log_dir=str(log_dir), limit=4)
        assert all(log.status == "success" for log in logs), [log.error for log in logs]

    return made_once("refund-logs", make)


@pytest.fixture(scope="session")
def refund_frame(refund_logs: Path) -> pd.DataFrame:
    """The trial frame of :func:`refund_logs`."""
    return trials_frame(refund_logs)


@pytest.fixture(scope="session")
def hostile_logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real eval whose prompt file, tool arguments, tool outputs and answer carry payloads."""
    root = tmp_path_factory.mktemp("hostile")
    prompt = root / f"{PROMPT_NAME}.md"
    prompt.write_text(f"Be careful. {SCRIPT} {IMG} {STYLE}\n", encoding="utf-8")
    log_dir = root / "logs"
    model = get_model("mockllm/model", custom_outputs=hostile_policy)
    task = refund(fault="lost_reply", protection="bare", prompt=str(prompt))
    logs = batch_eval(task, model=model, log_dir=str(log_dir), limit=1, epochs=2)
    assert logs[0].status == "success", logs[0].error
    return log_dir


@pytest.fixture(scope="session")
def payloads() -> dict[str, str]:
    """The payloads :func:`hostile_logs` plants, by name (``prompt_name`` is a file stem)."""
    return {"script": SCRIPT, "img": IMG, "style": STYLE, "prompt_name": PROMPT_NAME}


@pytest.fixture(scope="session")
def synthetic_small(tmp_path_factory: pytest.TempPathFactory) -> SyntheticRun:
    """Synthetic logs: 2 models × 2 prompts × 2 faults × 1 protection, 30 trials a cell."""
    return write_synthetic_logs(
        tmp_path_factory.mktemp("synthetic"),
        trials=240,
        models=("synth/a", "synth/b"),
        prompts=("baseline", "cautious"),
        faults=("none", "lost_reply"),
        protections=("bare",),
        epochs=2,
    )


@pytest.fixture
def unlike_frame() -> pd.DataFrame:
    """Issue 10's demo shape: m/a ran `baseline` on refund (clean) and email (duplicating),
    `cautious` on refund only; m/zero never succeeded safely."""
    rows = []

    def add(model: str, prompt: str, task: str, n: int, dup: int, safe: bool = True) -> None:
        for i in range(n):
            d = float(i < dup)
            rows.append(
                {
                    "model": model, "prompt": prompt, "task": task, "fault": "lost_reply",
                    "protection": "bare", "epoch": 1, "sample": f"{task}-{i}",
                    "completed": 1.0 if safe else 0.0, "duplicated": d, "excess_effects": d,
                    "diverged": 0.0, "exactly_once": 1.0 - d,
                    "safe_success": (1.0 - d) if safe else 0.0, "unseen_effects": 0.0,
                    "total_tokens": 10, "total_time": 1.0, "error": "", "limit": "",
                    "prompt_sha256": prompt, "eval_id": "e", "log": "/nonexistent/x.eval",
                }
            )  # fmt: skip

    add("m/a", "baseline", "refund", 20, 0)
    add("m/a", "baseline", "send_email", 20, 20)
    add("m/a", "cautious", "refund", 20, 0)
    add("m/zero", "baseline", "refund", 10, 0, safe=False)
    add("m/zero", "cautious", "refund", 10, 0, safe=False)
    return pd.DataFrame(rows)


def page_problems(browser: Any, path: Path) -> tuple[list[str], str]:
    """Open ``path`` in Chromium; return what went wrong and the page's visible text.

    A problem is any console error or page error, any request other than the file itself,
    any ``<script>``/``<img>``/``<iframe>`` element or ``on*`` attribute in the DOM, and any
    trace of a payload having run (``window.__pwned``).
    """
    with browser() as b:
        return _page_problems(b, path)


def _page_problems(b: Any, path: Path) -> tuple[list[str], str]:
    page = b.new_page()
    problems: list[str] = []
    page.on(
        "console",
        lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None,
    )
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    url = path.resolve().as_uri()
    page.on("request", lambda r: problems.append(f"request: {r.url}") if r.url != url else None)
    try:
        page.goto(url)
        page.wait_for_load_state("load")
        found = page.evaluate(
            """() => ({
                pwned: window.__pwned === undefined ? null : String(window.__pwned),
                elements: document.querySelectorAll('script, img, iframe, object, embed').length,
                handlers: [...document.querySelectorAll('*')].filter(
                    el => [...el.attributes].some(a => a.name.startsWith('on'))).length,
                styles: document.querySelectorAll('style').length,
                text: document.body.innerText,
            })"""
        )
    finally:
        page.close()
    if found["pwned"] is not None:
        problems.append(f"a payload ran: window.__pwned = {found['pwned']!r}")
    if found["elements"]:
        problems.append(f"{found['elements']} script/img/iframe/object/embed element(s) in the DOM")
    if found["handlers"]:
        problems.append(f"{found['handlers']} element(s) with an on* event handler attribute")
    if found["styles"] != 1:
        problems.append(f"{found['styles']} <style> elements (the report has exactly one)")
    return problems, found["text"]


@pytest.fixture
def check_page(browser: Any) -> Any:
    """:func:`page_problems` bound to the session's browser."""
    return lambda path: page_problems(browser, path)
