"""System prompts: built-in by name (``tasks/prompts/<name>.md``) or any file by path."""

from __future__ import annotations

import functools
import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path

PROMPTS_DIR = Path(__file__).parent / "prompts"

EXCERPT_CHARS = 4000
"""How much of a prompt's text summary.json, the log headers and the report carry: a prompt
is recorded by its digest and size, and a 10 MB prompt file must not make every record 10 MB."""


@dataclass(frozen=True)
class Prompt:
    """A system prompt with the name the report shows and a digest of its file.

    Attributes:
        name: The name the report shows (a built-in name, or a prompt file's stem).
        text: The text the model gets (decoded as UTF-8, a leading byte-order mark and the
            surrounding whitespace removed).
        source: ``builtin`` or the file path it was read from.
        sha256: The SHA-256 of the file's bytes, as ``sha256sum`` prints it.
        size: The file's size in bytes.
    """

    name: str
    text: str
    source: str
    sha256: str
    size: int

    @property
    def excerpt(self) -> str:
        """The text, cut to :data:`EXCERPT_CHARS` characters (marked when cut)."""
        if len(self.text) <= EXCERPT_CHARS:
            return self.text
        more = len(self.text) - EXCERPT_CHARS
        return f"{self.text[:EXCERPT_CHARS]}\n[... {more} more characters]"

    @property
    def truncated(self) -> bool:
        """True when :attr:`excerpt` is not the whole text."""
        return len(self.text) > EXCERPT_CHARS


def builtin_prompts() -> list[str]:
    """Names of the built-in prompts."""
    return sorted(p.stem for p in PROMPTS_DIR.glob("*.md"))


@functools.lru_cache(maxsize=64)
def _builtin_text(name: str) -> str | None:
    if "/" in name or "\\" in name or not (PROMPTS_DIR / f"{name}.md").is_file():
        return None
    return load_prompt(name).text


def is_builtin_prompt(name: str, text: str) -> bool:
    """Whether ``text`` is the built-in prompt ``name``: a prompt file of the user's that only
    shares its stem (``my/cautious.md``) is not."""
    return _builtin_text(name) == text


def read_regular_file(path: str | Path, what: str) -> bytes:
    """The bytes of a regular file, or one line saying why not.

    Opening a FIFO would block until a writer comes (for ever, from a CLI), and a directory
    or an unreadable file would end in a traceback: each is named instead.

    Args:
        path: The file.
        what: How the message names it (``"prompt file"``, ``"suite file"``).

    Raises:
        ValueError: the file does not exist, is a directory or another non-regular file,
            or cannot be read (naming the OS's reason).
    """
    shown = repr(str(path))
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise ValueError(f"{what} {shown} does not exist") from None
    except OSError as ex:
        raise ValueError(f"{what} {shown} cannot be read: {ex.strerror or ex}") from None
    if stat.S_ISDIR(mode):
        raise ValueError(f"{what} {shown} is a directory; expected a file")
    if not stat.S_ISREG(mode):
        raise ValueError(
            f"{what} {shown} is not a regular file (a FIFO, socket or device); expected a file"
        )
    try:
        return Path(path).read_bytes()
    except OSError as ex:
        raise ValueError(f"{what} {shown} cannot be read: {ex.strerror or ex}") from None


def _prompt(name: str, data: bytes, source: str, shown: str) -> Prompt:
    try:
        # utf-8-sig: an editor's byte-order mark is not part of the prompt.
        text = data.decode("utf-8-sig").strip()
    except UnicodeDecodeError as ex:
        raise ValueError(
            f"prompt file {shown!r} is not UTF-8 text ({ex.reason} at byte {ex.start})"
        ) from None
    if not text:
        raise ValueError(f"prompt file {shown!r} is empty")
    return Prompt(name, text, source, hashlib.sha256(data).hexdigest(), len(data))


def load_prompt(name_or_path: str) -> Prompt:
    """A built-in prompt by name, or a prompt file by path (its name is the file stem).

    Raises:
        ValueError: naming the bad value and what would be accepted.
    """
    builtin = PROMPTS_DIR / f"{name_or_path}.md"
    if "/" not in name_or_path and "\\" not in name_or_path and builtin.is_file():
        return _prompt(name_or_path, builtin.read_bytes(), "builtin", name_or_path)
    if not os.path.lexists(name_or_path):
        raise ValueError(
            f"unknown prompt {name_or_path!r}: not a built-in prompt "
            f"({', '.join(builtin_prompts())}) and no such file"
        )
    data = read_regular_file(name_or_path, "prompt file")
    return _prompt(Path(name_or_path).stem, data, name_or_path, name_or_path)
