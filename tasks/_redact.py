"""The environment's credentials, kept out of what twice writes (logs, summaries, reports).

A gateway's 401 can echo the ``Authorization`` header into an error, and an agent under test
can print or raise with its environment: the values of the environment's key variables
(``OPENAI_API_KEY``...) are replaced before twice records any such text. The one place for
this rule: the evals layer (model args, summaries, reports) imports it from here.

A *configured secret* is the value of an environment variable whose name :data:`SECRET_ENV`
matches (``*_API_KEY``, ``*_TOKEN``, ``*_SECRET``, ``*_PASSWORD``...), the password of a
``user:password@`` URL in the environment (also as its ``Basic`` header), or a credential
written on an agent command's line (:func:`remember_command_secrets`); in each case only when
it has at least :data:`MIN_SECRET_CHARS` characters. Each is replaced wherever it occurs,
inside longer text too (``https://gw.example/KEY/v1`` becomes
``https://gw.example/[redacted]/v1``).
"""

from __future__ import annotations

import base64
import os
import re
import shlex
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import unquote, urlsplit

from pydantic import BaseModel

SECRET_ENV = re.compile(
    r"(API[-_]?KEY|TOKEN|SECRET|PASSWORD|ACCESS[-_]KEY|CREDENTIALS?)($|_)|^AWS_SESSION", re.I
)
"""Environment variables whose values are credentials (``OPENAI_API_KEY``,
``AZURE_OPENAI_AD_TOKEN``, ``AWS_SECRET_ACCESS_KEY``...)."""

CREDENTIAL_ARG = re.compile(
    r"(^|[-_])(api[-_]?key|key|token|secret|password|passwd|credentials?|auth|authorization"
    r"|headers|signature|sig|cookie)($|[-_])|^aws[-_]|^x[-_]api",
    re.I,
)
"""Names that carry credentials (``api_key``, ``api-key``, ``azure_ad_token``,
``client_secret``, ``default_headers``...). Inspect drops only ``api_key`` and ``aws_*`` from
the model args it logs."""

MIN_SECRET_CHARS = 8
"""Shorter values are not scrubbed: replacing every "1" or "true" would garble the output."""

REDACTED = "[redacted]"


_REMEMBERED: set[str] = set()
"""Credentials found outside the environment (an agent command's own line), scrubbed too."""


def remember_secrets(values: Iterable[str]) -> None:
    """Scrub ``values`` too, from now on, wherever this process scrubs the environment's
    credentials (values shorter than :data:`MIN_SECRET_CHARS` are left, as there)."""
    _REMEMBERED.update(v for v in values if len(v) >= MIN_SECRET_CHARS)


def secret_values(environ: Mapping[str, str] | None = None) -> list[str]:
    """The values of the environment's credential variables, longest first (and, for this
    process's environment, those :func:`remember_secrets` was given)."""
    env = os.environ if environ is None else environ
    found = {v for k, v in env.items() if SECRET_ENV.search(k) and len(v) >= MIN_SECRET_CHARS}
    for value in env.values():
        if "@" in value and "://" in value:  # a base URL with user:password@
            found.update(_userinfo_secrets(value))
    if environ is None:
        found |= _REMEMBERED
    return sorted(found, key=len, reverse=True)


def _userinfo_secrets(url: str) -> set[str]:
    """A URL's password as a client sends it: itself, ``user:password``, and that in base64
    (the ``Authorization: Basic`` header a gateway may echo into an error)."""
    try:
        parts = urlsplit(url)
        user, password = parts.username, parts.password
    except ValueError:
        return set()
    if not password:
        return set()
    pair = f"{unquote(user or '')}:{unquote(password)}"
    basic = base64.b64encode(pair.encode()).decode()
    return {v for v in (unquote(password), pair, basic) if len(v) >= MIN_SECRET_CHARS}


def secrets_in(text: str, environ: Mapping[str, str] | None = None) -> list[str]:
    """The names of the environment's credential variables whose values occur in ``text``
    (names only: a caller reporting them never echoes a value)."""
    env = os.environ if environ is None else environ
    return sorted(
        k
        for k, v in env.items()
        if SECRET_ENV.search(k) and len(v) >= MIN_SECRET_CHARS and v in text
    )


def scrub(text: str, secrets: list[str] | None = None) -> str:
    """``text`` with every environment credential replaced by ``[redacted]``."""
    for secret in secret_values() if secrets is None else secrets:
        text = text.replace(secret, REDACTED)
    return text


def scrub_value(value: Any, secrets: list[str]) -> Any:
    """``value`` with ``secrets`` redacted: text, and dicts, lists, tuples and pydantic models
    (inspect's messages, outputs and events) holding text, keys included. Anything else, and
    anything that holds no secret, is returned as it is (the same object: a caller can tell
    with ``is`` whether there was anything to scrub)."""
    if isinstance(value, str):
        text = scrub(value, secrets)
        return value if text == value else text
    if isinstance(value, dict):
        mapping: dict[Any, Any] = {}
        any_changed = False
        for k, v in value.items():
            k2, v2 = scrub_value(k, secrets), scrub_value(v, secrets)
            any_changed = any_changed or k2 is not k or v2 is not v
            mapping[k2] = v2
        return mapping if any_changed else value
    if isinstance(value, list | tuple):
        cleaned_items = [scrub_value(v, secrets) for v in value]
        if all(c is v for c, v in zip(cleaned_items, value, strict=True)):
            return value
        return cleaned_items if isinstance(value, list) else tuple(cleaned_items)
    if isinstance(value, BaseModel):
        fields = scrubbed_fields(value, secrets)
        return value.model_copy(update=fields) if fields else value
    return value


def scrubbed_fields(model: BaseModel, secrets: list[str]) -> dict[str, Any]:
    """The fields of ``model`` that hold one of ``secrets``, by name, scrubbed (to set in
    place on an object others hold, as inspect's transcript holds its events)."""
    changed: dict[str, Any] = {}
    for name in type(model).model_fields:
        value = getattr(model, name, None)
        cleaned = scrub_value(value, secrets)
        if cleaned is not value:
            changed[name] = cleaned
    return changed


CREDENTIAL_OPTION = re.compile(
    r"(^|[-_])(api[-_]?key|token|secret|password|passwd|access[-_]?key|credentials?)$", re.I
)
"""Command-line options whose value is a credential: the name ends in one (``--api-key``,
``--auth-token``, ``--client-secret``), so ``--key-strategy``, ``--sort-key`` or
``--api-key-env NAME`` are not taken for one."""

KEY_HEADER = re.compile(
    r"\b(?:authorization|x-api-key|api-key|x-goog-api-key)\s*:\s*"
    r"(?:(?:bearer|basic|token)\s+)?([^\s'\"]+)",
    re.I,
)
"""A header carrying a key: OpenAI's ``Authorization: Bearer``, Anthropic's ``x-api-key``,
Azure's ``api-key``, Google's ``x-goog-api-key``."""

SCRIPT_OPTION = re.compile(r"-[A-Za-z]*[ce]")
"""The option before a script given as one argument: ``sh -c``, ``bash -lc``, ``node -e``."""

URL_PASSWORD = re.compile(r"://[^/\s:@]*:([^/\s@]+)@")


def command_secrets(command: str, _depth: int = 0) -> list[str]:
    """Credentials written on a shell command line (``--agent-cmd``), where no environment
    variable names them: the values of key-variable assignments (``OPENAI_API_KEY=sk-…
    python agent.py``, ``export …;``), of credential-named options (``--api-key X``,
    ``--token=X``), of a key header (``-H 'Authorization: Bearer X'``) and of a URL's
    password, also inside a quoted script (``bash -c '…'``)."""
    lexer = shlex.shlex(command, posix=True, punctuation_chars=True)  # `;`, `&&` apart
    lexer.whitespace_split = True
    try:
        words = list(lexer)
    except ValueError:  # an unclosed quote: the shell will say so; split on blanks here
        words = command.split()
    found: list[str] = []
    for i, word in enumerate(words):
        if _depth < 2 and any(c.isspace() for c in word):
            found += command_secrets(word, _depth + 1)  # a script given as one argument
            if i and SCRIPT_OPTION.fullmatch(words[i - 1]):
                # Only a script (``bash -c 'KEY=sk-… node a.js'``): read as an assignment
                # too, its "value" ran to the end of the script, and redacting that left
                # every such command the same agent label.
                continue
        name, eq, value = word.partition("=")
        if name.startswith("-") and CREDENTIAL_OPTION.search(name.lstrip("-")):
            if not eq:
                value = words[i + 1] if i + 1 < len(words) else ""
            if value and not value.startswith(("-", "$")):
                found.append(value)
        elif (
            eq
            and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name)
            and SECRET_ENV.search(name)
            and not value.startswith("$")
        ):
            found.append(value)
        found += KEY_HEADER.findall(word) + URL_PASSWORD.findall(word)
    return found


def remember_command_secrets(command: str) -> None:
    """Scrub :func:`command_secrets` of ``command`` from everything this process writes or
    prints from now on, as the environment's keys are: the command is logged, named in the
    agent axis and summary.json, and an agent may print its own arguments."""
    remember_secrets(command_secrets(command))
