"""``twice trials``: how many trials a bound like "duplication ≤ 1%" needs."""

from __future__ import annotations

import click

from ._common import finite_values


@click.command()
@click.option(
    "--rate",
    "rates",
    multiple=True,
    type=click.FloatRange(0, 1, min_open=True, max_open=True),
    callback=lambda ctx, param, value: finite_values(value, "--rate"),
    help="Bound to prove, e.g. 0.01 (repeatable). Default: 10%, 5%, 2%, 1%, 0.5%, 0.1%.",
)
@click.option(
    "--confidence",
    default=0.95,
    show_default=True,
    type=click.FloatRange(0, 1, min_open=True, max_open=True),
    callback=lambda ctx, param, value: finite_values((value,), "--confidence", "0.95")[0],
    help="Level of the Wilson interval.",
)
def trials(rates: tuple[float, ...], confidence: float) -> None:
    """How many trials a bound like "duplication ≤ 1% at 95%" needs (Wilson upper bound)."""
    from ..gate import DEFAULT_RATES, trials_table

    try:
        table = trials_table(rates or DEFAULT_RATES, confidence)
    except ValueError as ex:
        raise click.BadParameter(str(ex), param_hint="--rate") from None
    click.echo(table)
