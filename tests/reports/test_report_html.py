"""The HTML report: content, escaping, self-containment, bounded size, drill-down."""

from __future__ import annotations

import dataclasses
import datetime as dt
import inspect
import re
from pathlib import Path

import markupsafe
import pandas as pd
import pytest
from inspect_ai.event import InfoEvent
from inspect_ai.log import read_eval_log, write_eval_log
from pydantic import JsonValue
from synthetic_logs import write_synthetic_logs
from twice import reports
from twice.mocks import Effect, Ledger
from twice.reports import (
    WORST_N,
    drill_down,
    report_data,
    trial_detail,
    trials_frame,
    worst_trials,
    write_report,
)
from twice.reports._frame import local_path


def test_write_report_signature_is_the_shared_contract() -> None:
    params = list(inspect.signature(write_report).parameters)
    # A fifth, optional argument (status) came later; the four callers rely on stay first.
    assert params == ["trials", "path", "run", "baseline", "status"]


@pytest.mark.parametrize(
    ("status", "said"),
    [
        ({"complete": False, "status": "running"}, "The run is still going"),
        (
            {"complete": False, "status": "incomplete", "interrupted": "SIGTERM",
             "missing": [{"model": "m"}]},
            "The run was interrupted (SIGTERM): 1 planned cell(s) have no finished log",
        ),
        ({"complete": False, "missing_logs": ["shard-1-of-2/x.eval"]}, "The run is incomplete: 1"),
        ({"complete": True, "status": "complete"}, None),
        ({}, None),
    ],
)  # fmt: skip
def test_a_report_of_part_of_a_run_says_so_first(
    refund_frame: pd.DataFrame, tmp_path: Path, status: dict[str, object], said: str | None
) -> None:
    page = write_report(refund_frame, tmp_path / "r.html", status=status).read_text()
    if said is None:
        assert "Partial results" not in page
    else:
        assert f"<b>Partial results.</b> {said}" in page
        assert page.index("Partial results") < page.index("Safe success</b> =")


def test_reports_all_is_sorted_and_public() -> None:
    assert reports.__all__ == sorted(reports.__all__, key=lambda n: (not n.isupper(), n))
    assert all(hasattr(reports, name) for name in reports.__all__)


def test_write_report_has_every_section(refund_frame: pd.DataFrame, tmp_path: Path) -> None:
    page = write_report(refund_frame, tmp_path / "r.html").read_text(encoding="utf-8")
    for anchor in (
        "headline",
        "run",
        "grids",
        "useful",
        "prompts",
        "breakdowns",
        "sources",
        "worst",
    ):
        assert f'id="{anchor}"' in page, anchor
    for model in ("stub/retry", "stub/no-retry", "stub/verify"):
        assert model in page
    assert '<svg class="scatter"' in page and '<svg class="timeline"' in page
    assert 'id="baseline"' not in page  # no baseline given


def test_write_report_drill_down_says_how_to_open_the_trial(
    refund_frame: pd.DataFrame, refund_logs: Path, tmp_path: Path
) -> None:
    page = write_report(refund_frame, tmp_path / "r.html").read_text(encoding="utf-8")
    assert f"inspect view start --log-dir {refund_logs.resolve()}" in page
    log_names = {Path(p).name for p in refund_frame["log"]}
    shown = set(re.findall(r"log <code>([^<]+)</code>", page))
    assert shown and shown <= log_names
    assert "http://127.0.0.1:7575/#/logs/" in page


def test_report_data_reads_prompt_texts_from_logs_without_run(
    refund_frame: pd.DataFrame,
) -> None:
    data = report_data(refund_frame, worst=0)
    prompts = data["run"]["prompts"]
    assert set(prompts) == {"baseline", "cautious"}
    assert "exactly once" in prompts["cautious"]["text"]
    assert data["run"]["versions"]["inspect_ai"]
    assert data["drill"] == []


def test_report_data_prefers_run_metadata(refund_frame: pd.DataFrame) -> None:
    run = {"models": ["stub/verify", "stub/retry"], "created": "2030-01-01T00:00:00+00:00"}
    info = report_data(refund_frame, run=run, worst=0)["run"]
    assert info["models"][:2] == ["stub/verify", "stub/retry"]
    assert "stub/no-retry" in info["models"]  # present in the logs, so never dropped
    # ...except the date: the header shows when the trials ran (the logs), not when a
    # rerun that reused them wrote its metadata.
    assert "2030" not in info["created"]
    started = min(
        str(read_eval_log(local_path(p), header_only=True).eval.created)
        for p in refund_frame["log"].unique()
    )
    assert info["created"].startswith(dt.datetime.fromisoformat(started).strftime("%Y-%m-%d %H:%M"))


def test_report_headline_ranks_the_safe_model_first(refund_frame: pd.DataFrame) -> None:
    data = report_data(refund_frame, worst=0)
    assert data["headline"][0]["model"] == "stub/verify"
    assert data["takeaway"]["best"]["model"] == "stub/verify"
    assert "stub/retry" in data["takeaway"]["duplicators"]


def test_report_retry_sources_name_who_duplicated(refund_frame: pd.DataFrame) -> None:
    sources = report_data(refund_frame, worst=0)["sources"]
    by_model = {g["label"]: {r["source"]: r for r in g["rows"]} for g in sources["groups"]}
    assert by_model["stub/retry"]["model"]["excess"] == 8  # 2 prompts × 4 trials
    assert by_model["stub/no-retry"]["transport"]["excess"] == 4
    assert "model" not in by_model["stub/no-retry"]


def test_report_retry_sources_show_the_frameworks_duplicates(refund_frame: pd.DataFrame) -> None:
    framed = refund_frame.copy()
    retry = framed["model"] == "stub/retry"
    # As an agent under test's trials read: the repeat was the framework's, not the model's.
    framed.loc[retry, "attempts_framework"] = framed.loc[retry, "attempts_model"]
    framed.loc[retry, "excess_framework"] = framed.loc[retry, "excess_model"]
    framed.loc[retry, ["attempts_model", "excess_model"]] = 0.0
    sources = report_data(framed, worst=0)["sources"]
    by_model = {g["label"]: {r["source"]: r for r in g["rows"]} for g in sources["groups"]}
    row = by_model["stub/retry"]["framework"]
    assert row["excess"] == 8 and row["dup"]["rate"] == 1.0
    assert "re-sending a tool call the model made once" in row["note"]
    assert "model" not in by_model["stub/retry"]


def test_write_report_escapes_model_controlled_text(
    hostile_logs: Path, payloads: dict[str, str], tmp_path: Path
) -> None:
    frame = trials_frame(hostile_logs)
    page = write_report(frame, tmp_path / "r.html").read_text(encoding="utf-8")
    for payload in payloads.values():
        assert payload not in page
    # ...and they are all there, as text: the drill-down shows the hostile trial.
    for payload in payloads.values():
        assert str(markupsafe.escape(payload)) in page, payload
    assert page.count("<script") == 0
    assert page.count("<style") == 1


def test_write_report_shows_directional_overrides_instead_of_obeying_them(
    hostile_logs: Path, tmp_path: Path
) -> None:
    # A U+202E in a model's answer rendered the rest of its line right to left: escaping
    # leaves it in place, and twice's own "(N more characters)" read backwards after it.
    page = write_report(trials_frame(hostile_logs), tmp_path / "r.html").read_text("utf-8")
    assert "[U+202E]evil [U+2067]isolated" in page
    assert not re.search("[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]", page)


def test_write_report_is_self_contained(refund_frame: pd.DataFrame, tmp_path: Path) -> None:
    page = write_report(refund_frame, tmp_path / "r.html").read_text(encoding="utf-8")
    assert "Content-Security-Policy" in page and "default-src 'none'" in page
    assert not re.search(r"<(script|link|img|iframe)\b", page)
    assert not re.search(r"\bsrc\s*=", page)
    # The only URLs are links to a local `inspect view`.
    urls = set(re.findall(r"https?://[^\s\"'<>]+", page))
    assert urls and all(u.startswith("http://127.0.0.1:7575/") for u in urls)


def test_write_report_with_baseline_flags_regressions(tmp_path: Path) -> None:
    common = {
        "models": ("m/a",),
        "prompts": ("baseline",),
        "faults": ("lost_reply",),
        "protections": ("bare",),
    }
    good = write_synthetic_logs(tmp_path / "good", trials=60, seed=1, **common)
    now = trials_frame(good.log_dir)
    # The same cell with every trial duplicated: a regression in the run against itself.
    worse = now.assign(duplicated=1.0, safe_success=0.0, exactly_once=0.0)
    page = write_report(worse, tmp_path / "r.html", baseline=now).read_text(encoding="utf-8")
    assert 'id="baseline"' in page
    assert "1 regression" in page
    assert "cell(s) regressed" in page  # called out in the headline too
    # Beside a cell only the baseline has, the regressed cell's trials read "60.0 / 60.0":
    # the gone cell's NaN counts made the column float.
    gone = now.assign(model="m/gone")
    page = write_report(worse, tmp_path / "r2.html", baseline=pd.concat([now, gone]))
    assert '<td class="num">60 / 60</td>' in page.read_text(encoding="utf-8")


def test_write_report_against_a_baseline_sharing_some_cells(tmp_path: Path) -> None:
    # The usual comparison: a prompt added since the baseline, another dropped. The new and
    # gone cells' placeholder rows (metric NaN, which is truthy) were rendered as metrics:
    # TypeError in pts_ci, no report.
    common = {"models": ("m/a",), "faults": ("lost_reply",), "protections": ("bare",)}
    before = write_synthetic_logs(tmp_path / "b", trials=40, prompts=("p1", "p2"), **common)
    after = write_synthetic_logs(tmp_path / "a", trials=40, prompts=("p1", "p3"), **common)
    now, base = trials_frame(after.log_dir), trials_frame(before.log_dir)
    page = write_report(now, tmp_path / "r.html", baseline=base).read_text(encoding="utf-8")
    assert 'id="baseline"' in page
    assert "1 new" in page and "1 gone" in page


def test_report_size_stays_bounded_as_trials_grow(tmp_path: Path) -> None:
    axes = {"models": ("m/a", "m/b"), "prompts": ("baseline",), "faults": ("lost_reply",)}
    sizes = []
    for n in (80, 640):
        run = write_synthetic_logs(tmp_path / str(n), trials=n, **axes)
        out = write_report(trials_frame(run.log_dir), tmp_path / f"{n}.html")
        sizes.append(out.stat().st_size)
    assert sizes[1] < 1.1 * sizes[0], sizes


def test_worst_trials_visit_every_cell_before_any_second(refund_frame: pd.DataFrame) -> None:
    picked = worst_trials(refund_frame, 3)
    assert len(picked) == 3
    assert picked[["model", "prompt", "fault", "protection"]].drop_duplicates().shape[0] == 3
    assert (picked["severity"] > 0).all()
    assert (picked["severity"].diff().dropna() <= 0).all()


def test_worst_trials_never_picks_a_safe_success(refund_frame: pd.DataFrame) -> None:
    safe = refund_frame[refund_frame["model"] == "stub/verify"]
    assert (safe["safe_success"] == 1).all()
    assert worst_trials(safe, WORST_N).empty


def test_trial_detail_pairs_attempts_with_effects(refund_frame: pd.DataFrame) -> None:
    row = refund_frame[refund_frame["model"] == "stub/retry"].iloc[0].to_dict()
    detail = trial_detail(row)
    assert [a["source"] for a in detail["attempts"]] == ["initial", "model"]
    assert [a["outcome"] for a in detail["attempts"]] == ["unknown", "ok"]
    assert [e["excess"] for e in detail["effects"]] == [False, True]
    assert [e["seen"] for e in detail["effects"]] == [False, True]
    kinds = [s["kind"] for s in detail["agent"]]
    assert kinds[:4] == ["call", "result", "call", "result"]
    assert detail["timeline"].attempts[0]["lost"] is True


def test_trial_detail_of_a_missing_log_says_so(refund_frame: pd.DataFrame, tmp_path: Path) -> None:
    row = refund_frame.iloc[0].to_dict() | {"log": str(tmp_path / "gone.eval")}
    detail = trial_detail(row)
    assert "could not read this sample back from gone.eval" in detail["read_error"]
    assert detail["attempts"] == []


@pytest.mark.parametrize("bad", [{"error": "RuntimeError('boom')", "completed": float("nan")}])
def test_report_lists_crashed_trials(
    refund_frame: pd.DataFrame, tmp_path: Path, bad: dict[str, object]
) -> None:
    frame = refund_frame.copy()
    for key, value in bad.items():
        frame.loc[frame.index[0], key] = value
    data = report_data(frame, worst=0)
    assert data["errors"] and data["errors"][0]["count"] == 1
    assert data["errors"][0]["messages"][0]["text"] == "RuntimeError('boom')"
    page = write_report(frame, tmp_path / "r.html").read_text(encoding="utf-8")
    assert 'id="errors"' in page and "RuntimeError(&#39;boom&#39;)" in page


def test_write_report_of_no_trials_says_so(refund_frame: pd.DataFrame, tmp_path: Path) -> None:
    page = write_report(refund_frame.iloc[0:0], tmp_path / "r.html").read_text(encoding="utf-8")
    assert "No trials were found in these logs." in page


def test_drill_down_seen_is_the_scorers_whole_word_rule(tmp_path: Path) -> None:
    # The agent was shown re_10 only. A substring test called re_1 "seen" too; the scorer's
    # whole-word rule does not, and the drill-down now shows the scorer's facts.
    def re_1_and_re_10(ledger: Ledger) -> None:
        first = dataclasses.replace(
            ledger.attempts[0], effect_ids=["re_1"], delivered=False, outcome="unknown"
        )
        second = dataclasses.replace(
            first, n=2, source="model", delivered=True, outcome="ok", effect_ids=["re_10"]
        )
        fields = {"order_id": "order_1042", "amount": 499}
        ledger.attempts[:] = [first, second]
        ledger.effects[:] = [
            Effect("re_1", "payments.refund.create", 1, fields),
            Effect("re_10", "payments.refund.create", 2, fields),
        ]
        ledger.observations[:] = ["Timed out.", "Created refund re_10 of $4.99."]

    run = write_synthetic_logs(
        tmp_path / "logs", trials=8, models=("synth/a",), prompts=("baseline",),
        faults=("lost_reply",), protections=("bare",), edit=re_1_and_re_10,
    )  # fmt: skip
    frame = trials_frame(run.log_dir)
    drill = drill_down(frame, 8)
    assert len(drill) == 8
    for detail in drill:
        seen = {e["id"]: e["seen"] for e in detail["effects"]}
        assert seen == {"re_1": False, "re_10": True}
        assert [e["excess"] for e in detail["effects"]] == [False, True]
    led = Ledger(
        effects=[Effect("re_1", "x", 1, {}), Effect("re_10", "x", 2, {})],
        observations=["Created refund re_10 of $4.99."],
    )
    assert [led.seen(e) for e in led.effects] == [False, True]  # the scorer's rule
    assert (frame["unseen_effects"] == 1).all() and (frame["excess_model"] == 1).all()


def test_write_report_survives_worst_trials_that_cannot_be_read_back(
    refund_frame: pd.DataFrame, tmp_path: Path
) -> None:
    # Issue 10 item 8: the page died with `UndefinedError: hidden_attempts`.
    frame = refund_frame.assign(log=(tmp_path / "gone.eval").as_uri())
    page = write_report(frame, tmp_path / "r.html").read_text(encoding="utf-8")
    assert "could not read this sample back from gone.eval" in page
    assert page.count('class="callout warn"') >= len(worst_trials(frame))


def test_report_grid_compares_prompts_over_matched_tasks(unlike_frame: pd.DataFrame) -> None:
    data = report_data(unlike_frame, worst=0)
    dup = next(g for g in data["grids"] if g["id"] == "duplication")
    (facet,) = dup["faults"][0]["facets"]
    row = next(r for r in facet["rows"] if r["model"] == "m/a")
    by_prompt = dict(zip(facet["prompts"], row["cells"], strict=True))
    # Pooled over both tasks, baseline would show 50% duplication beside cautious's 0%.
    assert by_prompt["baseline"]["rate"] == 0.0 and by_prompt["baseline"]["n"] == 20
    assert by_prompt["cautious"]["rate"] == 0.0
    assert "matched on refund" in row["note"] and "left out send_email" in row["note"]
    zero = next(r for r in facet["rows"] if r["model"] == "m/zero")
    assert zero["note"] == ""


def test_report_headline_says_what_it_pools_and_shows_prompts(
    unlike_frame: pd.DataFrame,
) -> None:
    data = report_data(unlike_frame, worst=0)
    a = next(r for r in data["headline"] if r["model"] == "m/a")
    assert a["pooled"] == {"prompt": 2, "task": 2, "fault": 1, "protection": 1}
    assert a["dup"]["rate"] == pytest.approx(20 / 60)  # the pooled rate, as labelled
    rows = {r["prompt"]: r for r in a["by_prompt"]["rows"]}
    assert a["by_prompt"]["conditions"] == 1
    assert rows["baseline"]["n"] == rows["cautious"]["n"] == 20
    assert rows["baseline"]["safe"]["rate"] == rows["cautious"]["safe"]["rate"] == 1.0


def test_report_never_calls_a_zero_model_the_highest_safe_success(
    unlike_frame: pd.DataFrame, tmp_path: Path
) -> None:
    frame = unlike_frame[unlike_frame["model"] == "m/zero"]
    data = report_data(frame, worst=0)
    assert data["takeaway"]["best"] is None
    page = write_report(frame, tmp_path / "r.html").read_text(encoding="utf-8")
    assert "Highest safe success" not in page
    assert "No model got a job done safely" in page


def test_the_callout_keeps_a_per_fault_difference_its_pooled_row_does_not_say() -> None:
    # The failing path: once a (model, prompt) pair's pooled row had any highlight, every
    # per-fault one was dropped: "duplication better" hid "safe success worse" under a fault.
    from twice.reports._html import callout

    def h(fault: str, metric: str, verdict: str) -> dict[str, str]:
        return {"model": "m", "prompt": "p", "fault": fault, "metric": metric, "verdict": verdict}

    pooled = h("all", "duplicated", "better")
    said = h("lost_reply", "duplicated", "better")
    unsaid = h("timeout_before_commit", "safe_success", "worse")
    flipped = h("lost_reply", "duplicated", "worse")
    assert callout([pooled, said, unsaid, flipped]) == [pooled, unsaid, flipped]
    assert callout([said]) == [said]  # no pooled row said anything: the detail stays


def test_report_headline_does_not_call_a_crashing_agent_never_duplicated_alone(
    unlike_frame: pd.DataFrame, tmp_path: Path
) -> None:
    # The failing path: an agent that crashed in every trial (so it never got the chance to
    # duplicate) was listed under "Never duplicated", read as safe, with no word of crashes.
    frame = unlike_frame[unlike_frame["model"] == "m/zero"].copy()
    crashes = frame["prompt"] == "baseline"  # half of its trials
    frame["crashed"] = crashes.astype(float)
    frame["agent_error"] = crashes.map({True: "RuntimeError: tool not found", False: ""})
    takeaway = report_data(frame, worst=0)["takeaway"]
    assert takeaway["clean"] == []
    assert takeaway["crashed"] == [{"model": "m/zero", "rate": 0.5}]
    page = write_report(frame, tmp_path / "r.html").read_text(encoding="utf-8")
    assert "Never duplicated, but the agent crashed" in page and "m/zero (50% of trials)" in page
    # Without crashes the same model is plainly clean.
    frame["crashed"] = 0.0
    assert report_data(frame, worst=0)["takeaway"]["clean"] == ["m/zero"]


def test_two_rates_side_by_side_read_differently_when_they_differ() -> None:
    # 22.5% and 21.5% both read "22%" beside a "-1 pts" difference.
    from twice.reports._html import pct, pct_pair

    assert pct_pair((0.225, 0.215)) == ("22.5%", "21.5%")
    assert pct_pair((0.30, 0.10)) == ("30%", "10%")
    assert pct_pair((0.2, 0.2)) == ("20%", "20%")
    assert pct_pair((0.50001, 0.5)) == ("50.00%", "50.00%")  # 2 decimals at most
    assert pct_pair((0.0004, 0.0)) == ("<1%", "0%")
    assert pct(0.0004, 1) == "<0.1%" and pct(0.9996, 1) == ">99.9%" and pct(0.5) == "50%"


def _with_agent_output(log_dir: Path, data: JsonValue) -> None:
    """Give every trial of ``log_dir`` the info event ``twice run --agent-cmd`` logs."""
    for path in log_dir.glob("*.eval"):
        log = read_eval_log(str(path))
        for sample in log.samples or []:
            sample.events.append(InfoEvent(source="twice:agent_cmd", data=data))
        write_eval_log(log, str(path))


def test_trial_detail_shows_what_an_agent_command_wrote_as_text(tmp_path: Path) -> None:
    # What an agent command printed is the agent's own word on why it did what it did; it
    # is untrusted text (it may echo a model's output), shown escaped, its lines wrapped.
    def refunded_twice(ledger: Ledger) -> None:
        first = dataclasses.replace(
            ledger.attempts[0], effect_ids=["re_1"], delivered=False, outcome="unknown"
        )
        second = dataclasses.replace(first, n=2, source="model", delivered=True, outcome="ok")
        fields = {"order_id": "order_1042", "amount": 499}
        ledger.attempts[:] = [first, dataclasses.replace(second, effect_ids=["re_2"])]
        ledger.effects[:] = [
            Effect("re_1", "payments.refund.create", 1, fields),
            Effect("re_2", "payments.refund.create", 2, fields),
        ]

    run = write_synthetic_logs(
        tmp_path / "logs", trials=2, models=("synth/a",), prompts=("baseline",),
        faults=("lost_reply",), protections=("bare",), edit=refunded_twice,
    )  # fmt: skip
    stderr = (
        "agent: the refund timed out, retrying once\n"
        "\x1b[31m<script>window.__pwned = 'stderr'</script>\x1b[0m\r\n" + "x" * 3000
    )
    _with_agent_output(
        run.log_dir,
        {
            "agent_cmd": "python my_agent.py",
            "returncode": 0,
            "timed_out": False,
            "tail_bytes": 65536,
            "stdout": "",
            "stdout_bytes": 0,
            "stdout_truncated": False,
            "stderr": stderr,
            "stderr_bytes": 200_000,
            "stderr_truncated": True,
        },
    )
    frame = trials_frame(run.log_dir)
    row = worst_trials(frame, 1).iloc[0].to_dict()
    (output,) = trial_detail(row)["agent_output"]  # stdout wrote nothing: not shown
    assert output["stream"] == "stderr" and output["truncated"] and output["bytes"] == 200_000
    assert output["text"].startswith("agent: the refund timed out, retrying once\n<script>")
    assert "\x1b" not in output["text"] and "\r" not in output["text"]
    page = write_report(frame, tmp_path / "r.html").read_text(encoding="utf-8")
    assert "<script" not in page
    assert "&lt;script&gt;window.__pwned = &#39;stderr&#39;&lt;/script&gt;" in page
    assert "What the agent command wrote to stderr" in page
    assert "(last 64 KiB) · 200,000 bytes written" in page
    assert '<pre class="output">agent: the refund timed out, retrying once\n' in page
    assert "x" * 3000 in page  # shown whole, not clipped as other texts are


def test_report_headline_shows_wrong_values_only_when_some_model_committed_them(
    refund_frame: pd.DataFrame, tmp_path: Path
) -> None:
    # The stubs refund the amount asked for: the headline says so in a line, not a column.
    page = write_report(refund_frame, tmp_path / "clean.html").read_text()
    headline = page.split('<section id="headline">')[1].split("</section>")[0]
    assert "<th>wrong values</th>" not in headline
    assert "No effect carried values other than the ones asked for" in headline
    # One trial refunds another amount: its model's wrong-values rate is in the headline.
    one = refund_frame.copy()
    one.loc[one.index[0], ["wrong", "wrong_effects"]] = 1.0
    page = write_report(one, tmp_path / "wrong.html").read_text()
    headline = page.split('<section id="headline">')[1].split("</section>")[0]
    assert "<th>wrong values</th>" in headline
    assert "No effect carried values" not in headline
