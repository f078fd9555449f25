"""The report in a real headless Chromium: hostile logs render as text, nothing runs."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from twice.reports import trials_frame, write_report

pytestmark = pytest.mark.browser


def test_report_in_chromium_runs_no_payload(
    hostile_logs: Path, payloads: dict[str, str], check_page: Any, tmp_path: Path
) -> None:
    out = write_report(trials_frame(hostile_logs), tmp_path / "report.html")
    problems, text = check_page(out)
    assert problems == []
    # The payloads reached the page, as visible text (so the check above meant something).
    for name, payload in payloads.items():
        assert payload in text, name


def test_report_in_chromium_loads_cleanly(
    refund_frame: pd.DataFrame, check_page: Any, tmp_path: Path
) -> None:
    problems, text = check_page(write_report(refund_frame, tmp_path / "report.html"))
    assert problems == []
    assert "Headline: did the job get done, once?" in text


def test_page_check_catches_an_unescaped_payload(
    refund_frame: pd.DataFrame, payloads: dict[str, str], check_page: Any, tmp_path: Path
) -> None:
    # The failing path of the checker: splice raw payloads into a real report.
    page = write_report(refund_frame, tmp_path / "report.html").read_text(encoding="utf-8")
    raw = page.replace(
        "<h1>twice report</h1>", "<h1>twice report</h1>" + "".join(payloads.values())
    )
    bad = tmp_path / "bad.html"
    bad.write_text(raw, encoding="utf-8")
    problems, _ = check_page(bad)
    assert any("script/img" in p for p in problems), problems
    assert any("<style> elements" in p for p in problems), problems


def test_report_prints_every_metric_tab(
    refund_frame: pd.DataFrame, browser: Any, tmp_path: Path
) -> None:
    out = write_report(refund_frame, tmp_path / "report.html")
    with browser() as b:
        page = b.new_page()
        page.goto(out.resolve().as_uri())
        shown = "id => getComputedStyle(document.getElementById(id)).display"
        # On screen, only the checked tab's panel shows (no JavaScript involved)...
        assert page.evaluate(shown, "panel-duplication") == "block"
        assert page.evaluate(shown, "panel-completion") == "none"
        page.click("label[for=tab-completion]")
        assert page.evaluate(shown, "panel-completion") == "block"
        # ...and printed, every panel does.
        page.emulate_media(media="print")
        assert all(
            page.evaluate(shown, p) == "block"
            for p in ("panel-duplication", "panel-completion", "panel-safe_success")
        )


def test_report_first_screen_shows_prompts_and_marks_unmatched_rows(
    unlike_frame: pd.DataFrame, browser: Any, tmp_path: Path
) -> None:
    # Issue 10 item 3: the headline pools every condition; the prompt dimension must be on
    # the first screen, and the grid must mark a row whose prompts ran different tasks.
    out = write_report(unlike_frame, tmp_path / "report.html")
    with browser() as b:
        page = b.new_page(viewport={"width": 1280, "height": 900})
        page.goto(out.resolve().as_uri())
        by_prompt = page.locator("th", has_text="safe success by prompt")
        box = by_prompt.bounding_box()
        assert box is not None and box["y"] + box["height"] < 900, box
        assert page.locator("text=pools 2 prompts · 2 tasks").first.is_visible()
        chip = page.locator(".chip.warn", has_text="matched on refund").first
        chip.scroll_into_view_if_needed()
        assert chip.is_visible()
        page.screenshot(path=str(tmp_path / "first-screen.png"))
        shot = os.environ.get("TWICE_SCREENSHOT_DIR")
        if shot:  # to look at it: TWICE_SCREENSHOT_DIR=/tmp/shots pytest -m browser
            page.goto(out.resolve().as_uri())
            page.screenshot(path=str(Path(shot) / "report-first-screen.png"))
            chip.scroll_into_view_if_needed()
            page.screenshot(path=str(Path(shot) / "report-grid.png"))
        page.close()


def test_a_long_prompt_or_model_name_does_not_widen_the_page(
    unlike_frame: pd.DataFrame, browser: Any, tmp_path: Path
) -> None:
    # A 51-character prompt name pushed the headline table past a 1366 px laptop screen;
    # names are the user's (file stems, model strings) and any length.
    long_prompt = "a_very_long_prompt_file_name_from_a_team_that_names_things_in_full_v2"
    long_model = "openai-api/internal-gateway/a-model-name-with-many-parts-and-a-date-2026-11"
    frame = unlike_frame.assign(
        prompt=unlike_frame["prompt"].replace({"cautious": long_prompt}),
        model=unlike_frame["model"].replace({"m/zero": long_model}),
    )
    out = write_report(frame, tmp_path / "report.html")
    with browser() as b:
        page = b.new_page(viewport={"width": 1366, "height": 768})
        page.goto(out.resolve().as_uri())
        width = page.evaluate("document.documentElement.scrollWidth")
        assert width <= 1366, width
        page.close()
