"""The one cell type: its field order, label, and the mappings it is read from."""

from __future__ import annotations

import dataclasses

import pandas as pd
import pytest
from twice import evals, reports
from twice.evals import suite as suite_api
from twice.reports import CELL, Cell

KEYS = {
    "model": "stub/retry",
    "agent": "react",
    "prompt": "baseline",
    "task": "refund",
    "fault": "lost_reply",
    "protection": "bare",
}


def test_cell_is_one_type_everywhere_with_the_frame_column_order() -> None:
    assert evals.Cell is suite_api.Cell is reports.Cell
    assert CELL == ("model", "agent", "prompt", "task", "fault", "protection")
    assert tuple(f.name for f in dataclasses.fields(Cell)) == CELL


def test_cell_takes_keywords_only_and_defaults_to_react() -> None:
    with pytest.raises(TypeError):
        Cell("stub/retry", "baseline", "refund", "lost_reply", "bare")  # type: ignore[misc]
    cell = Cell(
        model="stub/retry", prompt="baseline", task="refund", fault="none", protection="bare"
    )
    assert cell.agent == "react"


def test_cell_label_leaves_out_react_and_names_any_other_agent_after_the_model() -> None:
    assert Cell(**KEYS).label == "stub/retry / baseline / refund / lost_reply / bare"
    other = Cell(**{**KEYS, "agent": "langgraph"})
    assert other.label == "stub/retry / langgraph / baseline / refund / lost_reply / bare"


@pytest.mark.parametrize(
    "row",
    [
        KEYS,
        pd.Series({**KEYS, "trials": 4, "duplication_rate": 0.5}),
        {k: v for k, v in KEYS.items() if k != "agent"},  # a summary from before agents
        {**KEYS, "agent": None},
        # A frame of logs from before agents beside newer ones: pandas fills the gap with NaN.
        pd.concat([pd.DataFrame([KEYS]), pd.DataFrame([{**KEYS}]).drop(columns="agent")]).iloc[1],
        pd.Series({**KEYS, "agent": pd.NA}),
    ],
    ids=["dict", "series", "no-agent", "agent-none", "agent-nan", "agent-na"],
)
def test_cell_from_mapping_reads_a_dict_a_frame_row_or_a_summary_entry(row: object) -> None:
    cell = Cell.from_mapping(row)  # type: ignore[arg-type]
    assert cell == Cell(**KEYS)
    assert cell.as_dict() == KEYS and list(cell.as_dict()) == list(CELL)


def test_cell_from_mapping_names_a_missing_key() -> None:
    with pytest.raises(KeyError, match="fault"):
        Cell.from_mapping({k: v for k, v in KEYS.items() if k != "fault"})


def test_cell_label_of_the_gate_is_the_cell_label() -> None:
    from twice.evals.gate import cell_label

    langgraph = {**KEYS, "agent": "langgraph"}
    assert cell_label(langgraph) == Cell.from_mapping(langgraph).label
