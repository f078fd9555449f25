"""The packages as mkdocstrings reads them: ``build/docs-src/twice/<package>``.

twice's folders are installed as ``twice.*`` by setuptools' ``package-dir`` mapping, which
griffe cannot follow, so the API pages read a tree of links named as the imports are. The
tree holds each package's modules and sub-packages only: a link to a whole folder would have
griffe walk whatever else lies in it (an agent command's installed ``.venv`` and
``node_modules``: about a million files, most of a minute's build).

Safe to run from several builds at once (xdist workers): it only adds what is missing and
drops links whose module is gone.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

from mkdocs.plugins import event_priority

PACKAGES = ("mocks", "tasks", "assertions", "evals", "reports")


def link_sources(root: Path, target: Path) -> None:
    """Mirror each of :data:`PACKAGES` under ``target`` (``.../twice``): a directory per
    package and sub-package (a folder with an ``__init__.py``), a link per ``.py`` file."""
    for package in PACKAGES:
        tree = target / package
        if tree.is_symlink():  # a link to the whole folder, which griffe would walk
            with contextlib.suppress(FileNotFoundError):
                tree.unlink()
        wanted: set[Path] = set()
        for folder, dirs, files in os.walk(root / package):
            here = Path(folder)
            dirs[:] = [d for d in dirs if (here / d / "__init__.py").is_file()]
            out = tree / here.relative_to(root / package)
            out.mkdir(parents=True, exist_ok=True)
            wanted.add(out)
            for name in files:
                if not name.endswith(".py"):
                    continue
                link = out / name
                wanted.add(link)
                if not link.is_symlink():
                    with contextlib.suppress(FileExistsError):
                        link.symlink_to(os.path.relpath(here / name, out))
        for path in sorted(tree.rglob("*"), reverse=True):  # children before their folder
            if path in wanted:
                continue
            with contextlib.suppress(OSError):  # another build removed it first
                if path.is_dir() and not path.is_symlink():
                    path.rmdir()
                else:
                    path.unlink()


@event_priority(100)  # before mkdocstrings' own: it keeps only the paths that exist
def on_config(config: Any) -> Any:
    """mkdocs hook: the tree, before mkdocstrings reads its paths."""
    root = Path(config["config_file_path"]).parent
    link_sources(root, root / "build" / "docs-src" / "twice")
    return config
