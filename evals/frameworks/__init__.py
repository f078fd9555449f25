"""The framework analysis (``twice frameworks``): every row of the frameworks registry under
the stub controls, faults and tasks, run as ordinary suites, then one documentation page
(the finding of each row, citing its framework's behaviour) and one HTML report."""

from ._analysis import (
    CONTROLS,
    FAULTS,
    PAGE,
    TASKS,
    FrameworksPlan,
    FrameworksResult,
    row_suite,
    run_frameworks,
    select_rows,
)
from ._findings import BASELINE, NO_RETRY, RETRY, VERIFY, Pooled, finding, pooled, retried_by_itself
from ._installed import RowStatus, row_status
from ._page import (
    HEADINGS,
    MARKER,
    TITLE,
    PageSettings,
    RowMeasure,
    frameworks_page,
    page_structure,
    summary_cells,
)

__all__ = [
    "BASELINE",
    "CONTROLS",
    "FAULTS",
    "HEADINGS",
    "MARKER",
    "NO_RETRY",
    "PAGE",
    "RETRY",
    "TASKS",
    "TITLE",
    "VERIFY",
    "FrameworksPlan",
    "FrameworksResult",
    "PageSettings",
    "Pooled",
    "RowMeasure",
    "RowStatus",
    "finding",
    "frameworks_page",
    "page_structure",
    "pooled",
    "retried_by_itself",
    "row_status",
    "row_suite",
    "run_frameworks",
    "select_rows",
    "summary_cells",
]
