"""``python -m twice.evals.cli``: the ``twice`` command."""

from ._main import main

main()
