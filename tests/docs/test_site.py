"""The documentation site builds strictly, works offline, and reads well at 1280 px."""

from __future__ import annotations

import importlib.util
import re
from html.parser import HTMLParser
from pathlib import Path
from types import ModuleType
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from twice.evals.cli import cli

ROOT = Path(__file__).parents[2]
LOCAL_HOSTS = {"127.0.0.1", "localhost", ""}


class _Fetches(HTMLParser):
    """What a browser fetches on its own when it loads a page: ``src`` of any element,
    ``<link href>`` (stylesheets, icons, preloads), ``srcset`` and ``<object data>``; not the
    ``<a href>`` a reader may click."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if value is None:
                continue
            if (
                name == "src"
                or (tag == "link" and name == "href")
                or (tag == "object" and name == "data")
            ):
                self.urls.append(value)
            elif name == "srcset":
                self.urls += [part.split()[0] for part in value.split(",") if part.strip()]


def remote_fetches(html: str) -> list[str]:
    """The URLs a page would fetch from a host other than its own."""
    parser = _Fetches()
    parser.feed(html)
    urls = parser.urls + re.findall(r"url\(\s*['\"]?(https?://[^'\")\s]+)", html)
    urls += re.findall(r"@import\s+['\"](https?://[^'\"]+)", html)
    return [u for u in urls if urlsplit(u).scheme in ("http", "https") or u.startswith("//")]


def nav_pages(nav: Any) -> list[str]:
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, list):
        return [p for item in nav for p in nav_pages(item)]
    if isinstance(nav, dict):
        return [p for value in nav.values() for p in nav_pages(value)]
    return []


def page_path(site: Path, page: str) -> Path:
    stem = page.removesuffix(".md")
    if stem == "index" or stem.endswith("/index"):
        return site / stem.removesuffix("index") / "index.html"
    return site / stem / "index.html"


def visible_text(html: str) -> str:
    html = re.sub(r"<(script|style)\b.*?</\1>", " ", html, flags=re.S)
    return re.sub(r"<[^>]+>", " ", html)


def test_every_page_of_the_nav_is_built(built_site: Path) -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    assert config["theme"]["font"] is False
    pages = nav_pages(config["nav"])
    assert len(pages) >= 30
    for page in pages:
        assert (ROOT / "docs" / page).is_file(), page
        assert page_path(built_site, page).is_file(), page
    # Every Markdown page under docs/ is in the nav (a page nobody can reach is lost).
    on_disk = {p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md")}
    assert on_disk == set(pages), on_disk ^ set(pages)


def test_the_site_fetches_nothing_from_another_host(built_site: Path) -> None:
    pages = sorted(built_site.rglob("*.html"))
    assert len(pages) >= 30
    found = {
        str(p.relative_to(built_site)): remote_fetches(p.read_text(encoding="utf-8"))
        for p in [*pages, *built_site.rglob("*.css")]
    }
    assert not {page: urls for page, urls in found.items() if urls}
    search = built_site / "search" / "search_index.json"
    assert search.is_file() and "lost_reply" in search.read_text(encoding="utf-8")


def test_the_fetch_check_catches_a_web_font_a_cdn_script_and_an_image() -> None:
    html = (
        '<link rel="stylesheet" href="https://fonts.googleapis.com/css?family=Roboto">'
        '<script src="https://cdn.example/x.js"></script><img srcset="//img.example/a.png 2x">'
        '<style>@import "https://cdn.example/y.css";'
        " b { background: url(https://i.example/b.png) }</style>"
        '<a href="https://inspect.aisi.org.uk/">a link to click is not a fetch</a>'
        '<link rel="stylesheet" href="../assets/main.css"><img src="assets/report.png">'
    )
    assert remote_fetches(html) == [
        "https://fonts.googleapis.com/css?family=Roboto",
        "https://cdn.example/x.js",
        "//img.example/a.png",
        "https://i.example/b.png",
        "https://cdn.example/y.css",
    ]


def test_the_cli_page_documents_every_command_and_option(built_site: Path) -> None:
    text = visible_text((built_site / "reference" / "cli" / "index.html").read_text())
    commands = [("twice", cli)]
    while commands:
        name, command = commands.pop()
        assert name in text, name
        for param in command.params:
            for opt in param.opts:
                if opt.startswith("--"):
                    assert opt in text, f"{name} {opt}"
        for sub_name, sub in getattr(command, "commands", {}).items():
            commands.append((f"{name} {sub_name}", sub))


@pytest.mark.parametrize("package", ["mocks", "tasks", "assertions", "evals", "reports"])
def test_the_api_page_shows_the_public_names_and_no_private_module(
    built_site: Path, package: str
) -> None:
    import importlib

    module = importlib.import_module(f"twice.{package}")
    html = (built_site / "reference" / "api" / package / "index.html").read_text()
    text = visible_text(html)
    # A name that is also a sub-package's (the task `refund` in `twice.tasks.refund`) has its
    # entry under that sub-package.
    missing = [
        name
        for name in module.__all__
        if not re.search(rf'id="twice\.{package}\.(\w+\.)*{name}"', html)
    ]
    assert not missing, f"twice.{package}: no entry for {missing}"
    # ...and nothing else at the top: the page is the public surface, `__all__`.
    extra = set(re.findall(rf'id="twice\.{package}\.(\w+)"', html)) - set(module.__all__)
    assert not extra, f"twice.{package}: entries for names outside __all__: {extra}"
    assert not re.findall(rf"twice\.{package}\._\w+", text)


def test_the_readme_shows_no_test_count_or_timing() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 250
    assert not re.search(r"\b\d[\d,]* (tests|passed)\b", text)
    assert not re.search(r"\b\d+(\.\d+)? ?(s|ms|min|minutes|seconds)\b(?! of)", text)


@pytest.mark.browser
@pytest.mark.parametrize("page", ["", "guides/own-task/"])
def test_a_browser_loads_the_page_from_127_0_0_1_only_and_it_fits_1280_px(
    browser: Any, site_server: str, page: str
) -> None:
    requests: list[str] = []
    with browser() as b:
        tab = b.new_page(viewport={"width": 1280, "height": 900})
        tab.on("request", lambda r: requests.append(r.url))
        errors: list[str] = []
        tab.on("pageerror", lambda e: errors.append(str(e)))
        tab.goto(f"{site_server}/{page}")
        tab.wait_for_load_state("networkidle")
        widths = tab.evaluate(
            "() => [document.documentElement.scrollWidth, document.documentElement.clientWidth]"
        )
        heading = tab.inner_text("h1")
        if page == "":
            # The search is built in: typing a word finds pages, with no request elsewhere.
            tab.click("input[data-md-component=search-query]")
            tab.keyboard.type("lost_reply", delay=20)
            tab.wait_for_selector(".md-search-result__item", timeout=10_000)
        tab.close()
    assert not errors, errors
    elsewhere = [u for u in requests if urlsplit(u).hostname not in LOCAL_HOSTS]
    assert not elsewhere, elsewhere
    assert len(requests) > 3  # the page, its stylesheets and scripts, all from 127.0.0.1
    assert widths[0] <= widths[1], f"horizontal scroll at 1280 px: {widths}"
    assert heading.strip()


def _source_tree() -> ModuleType:
    spec = importlib.util.spec_from_file_location("source_tree", ROOT / "docs/hooks/source_tree.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_api_pages_read_each_packages_modules_and_nothing_else(tmp_path: Path) -> None:
    # An agent command's installed .venv lies inside tasks/: a link to the whole folder had
    # griffe walk its million files on every build.
    source_tree = _source_tree()
    root = tmp_path / "repo"
    for package in source_tree.PACKAGES:
        (root / package / "sub").mkdir(parents=True)
        (root / package / "__init__.py").write_text('"""A package."""\n')
        (root / package / "_mod.py").write_text("X = 1\n")
        (root / package / "sub" / "__init__.py").write_text("")
        (root / package / "data.toml").write_text("")
    venv = root / "tasks" / "agents" / "commands" / "crewai" / ".venv" / "lib"
    venv.mkdir(parents=True)
    (venv / "six.py").write_text("")
    (root / "tasks" / "agents" / "__init__.py").write_text("")
    target = tmp_path / "build" / "twice"
    target.mkdir(parents=True)
    (target / "mocks").symlink_to(root / "mocks")  # the old layout: one link per package
    (target / "evals" / "gone").mkdir(parents=True)
    (target / "evals" / "gone" / "old.py").symlink_to(root / "evals" / "_mod.py")

    source_tree.link_sources(root, target)
    source_tree.link_sources(root, target)  # a second build finds it made

    found = {p.relative_to(target).as_posix() for p in target.rglob("*")}
    expected = {"tasks/agents", "tasks/agents/__init__.py"}
    for package in source_tree.PACKAGES:
        expected |= {package, f"{package}/sub"}
        expected |= {f"{package}/{m}" for m in ("__init__.py", "_mod.py", "sub/__init__.py")}
    assert found == expected
    assert not (target / "mocks").is_symlink()
    assert (target / "reports" / "_mod.py").read_text() == "X = 1\n"
    # mkdocstrings keeps only the paths that exist when it starts: on a fresh clone the
    # tree must be made before that, by a hook that runs first.
    assert source_tree.on_config.mkdocs_priority > 0


def test_the_built_api_tree_holds_no_installed_packages(built_site: Path) -> None:
    tree = ROOT / "build" / "docs-src" / "twice"
    paths = [p.relative_to(tree).as_posix() for p in tree.rglob("*")]
    assert "evals/gate/_gate.py" in paths and "tasks/agents/__init__.py" in paths
    assert not [p for p in paths if "node_modules" in p or ".venv" in p or "commands" in p]
