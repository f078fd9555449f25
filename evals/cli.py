"""The ``twice`` command line: ``run``, ``list`` (``gate`` and ``report`` build on them).

Exit codes (DESIGN.md): ``run`` exits 0 when the evals ran (whatever the rates), 1 when an
eval errored or a trial crashed, 2 on bad usage.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from ._suite import SuiteError, suite_from_flags


def _model_args(values: tuple[str, ...]) -> dict[str, Any]:
    import yaml

    args: dict[str, Any] = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{item!r} is not key=value", param_hint="-M")
        args[key] = yaml.safe_load(value)  # same typing as inspect's -M
    return args


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="twice")
def cli() -> None:
    """twice: catch AI agents doing a mutating action twice."""


@cli.command()
@click.option("--model", "models", multiple=True, help="Inspect model string (repeatable). Default: every stub model.")
@click.option("--prompt", "prompts", multiple=True, help="Built-in prompt name or prompt file (repeatable).")
@click.option("--task", "tasks", multiple=True, help="Task name (repeatable). Default: every task.")
@click.option("--fault", "faults", multiple=True, help="Fault name (repeatable).")
@click.option("--protection", "protections", multiple=True, help="Protection name (repeatable).")
@click.option("--config", type=click.Path(dir_okay=False), help="Suite TOML file; flags replace its axes.")
@click.option("--epochs", type=click.IntRange(min=1), help="Epochs per sample.")
@click.option("--limit", type=click.IntRange(min=1), help="Samples per task (first N).")
@click.option("--log-dir", type=click.Path(file_okay=False, path_type=Path), help="Where logs, summary.json and report.html go; rerun with the same directory to resume.")
@click.option("-M", "model_arg", multiple=True, metavar="KEY=VALUE", help="Model argument (repeatable).")
@click.option("--max-connections", type=click.IntRange(min=1), help="Concurrent model connections.")
@click.option("--display", default="none", show_default=True, type=click.Choice(["full", "rich", "plain", "log", "none"]), help="Inspect's progress display.")
@click.option("--no-report", is_flag=True, help="Skip report.html.")
def run(
    models: tuple[str, ...],
    prompts: tuple[str, ...],
    tasks: tuple[str, ...],
    faults: tuple[str, ...],
    protections: tuple[str, ...],
    config: str | None,
    epochs: int | None,
    limit: int | None,
    log_dir: Path | None,
    model_arg: tuple[str, ...],
    max_connections: int | None,
    display: str,
    no_report: bool,
) -> None:
    """Run the suite: models × prompts × tasks × faults × protections × epochs.

    With no flags, runs the default offline suite of stub models.
    """
    from ._run import default_log_dir, format_table, run_suite

    try:
        suite = suite_from_flags(
            config=config,
            models=models,
            prompts=prompts,
            tasks=tasks,
            faults=faults,
            protections=protections,
            epochs=epochs,
            limit=limit,
        )
        out = log_dir or default_log_dir()
        n_cells = sum(1 for _ in suite.cells())
        click.echo(f"twice: running {n_cells} cell(s), logs in {out}", err=True)
        result = run_suite(
            suite,
            out,
            model_args=_model_args(model_arg),
            max_connections=max_connections,
            display=display,
            report=not no_report,
        )
    except SuiteError as ex:
        raise click.UsageError(str(ex)) from None
    click.echo(format_table(result.table))
    click.echo(f"\nsummary: {result.summary_path}")
    if result.report_path:
        click.echo(f"report:  {result.report_path}")
    if not result.ok:
        for line in result.failed:
            click.echo(f"error: {line}", err=True)
        sys.exit(1)


@cli.command("list")
def list_() -> None:
    """List tasks, prompts, faults, protections and stub models."""
    from mocks import FAULTS, STUB_MODELS, noisy_retry_rate
    from tasks import PROTECTIONS, TASKS, builtin_prompts

    click.echo("tasks:")
    for name, fn in TASKS.items():
        doc = (fn.__doc__ or "").strip().splitlines()[0] if fn.__doc__ else ""
        click.echo(f"  {name:<24} {doc}")
    click.echo("prompts:")
    for name in builtin_prompts():
        click.echo(f"  {name:<24} (stub/noisy retries with p={noisy_retry_rate(name):g})")
    click.echo("faults:")
    for name, fault in FAULTS.items():
        doc = (type(fault).__doc__ or "").strip().splitlines()[0]
        click.echo(f"  {name:<24} {doc}")
    click.echo("protections:")
    for name, p in PROTECTIONS.items():
        click.echo(f"  {name:<24} {p.summary}")
    click.echo("stub models:")
    for name, doc in STUB_MODELS.items():
        click.echo(f"  stub/{name:<19} {doc}")


def main() -> None:
    """Console-script entry point."""
    cli()


if __name__ == "__main__":
    main()
