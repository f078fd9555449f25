"""The ``twice`` command line: ``run``, ``list``, ``gate``, ``report``, ``trials``, ``serve``,
``local-model``, ``frameworks``; one module per command (parse, one call, print).

Exit codes (docs/architecture.md): ``run`` exits 0 when every planned trial ran (whatever
the rates), 1 when an eval errored, a trial errored or a model could not be reached, 2 on bad
usage (or a log directory locked by another run), 130/143 when interrupted by SIGINT/SIGTERM.
``gate`` exits 0 pass, 1 fail, 2 bad usage or unreadable/errored logs. ``report`` exits 2 when
the logs cannot be read or the output cannot be written. Bad input is one line, never a
traceback.
"""

from ._common import default_display
from ._main import cli, main, release_worker_threads

__all__ = ["cli", "default_display", "main", "release_worker_threads"]
