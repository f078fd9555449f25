"""System prompts: built-in by name (``tasks/prompts/<name>.md``) or any file by path."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

PROMPTS_DIR = Path(__file__).parent / "prompts"


@dataclass(frozen=True)
class Prompt:
    """A system prompt with the name the report shows and a hash of its exact text."""

    name: str
    text: str
    source: str
    """``builtin`` or the file path it was read from."""

    @property
    def sha256(self) -> str:
        """Hash of the text, recorded with the run so comparisons name what was compared."""
        return hashlib.sha256(self.text.encode()).hexdigest()


def builtin_prompts() -> list[str]:
    """Names of the built-in prompts."""
    return sorted(p.stem for p in PROMPTS_DIR.glob("*.md"))


def load_prompt(name_or_path: str) -> Prompt:
    """A built-in prompt by name, or a prompt file by path (its name is the file stem).

    Raises:
        ValueError: naming the bad value and what would be accepted.
    """
    builtin = PROMPTS_DIR / f"{name_or_path}.md"
    if "/" not in name_or_path and "\\" not in name_or_path and builtin.is_file():
        return Prompt(name_or_path, builtin.read_text(encoding="utf-8").strip(), "builtin")
    path = Path(name_or_path)
    if path.is_file():
        try:
            text = path.read_text(encoding="utf-8").strip()
        except UnicodeDecodeError as ex:
            raise ValueError(f"prompt file {name_or_path!r} is not UTF-8 text ({ex})") from None
        if not text:
            raise ValueError(f"prompt file {name_or_path!r} is empty")
        return Prompt(path.stem, text, str(path))
    raise ValueError(
        f"unknown prompt {name_or_path!r}: not a built-in prompt "
        f"({', '.join(builtin_prompts())}) and no such file"
    )
