"""The environment's credentials, kept out of what twice writes (logs, summaries, reports).

A gateway's 401 can echo the ``Authorization`` header into an error, and an agent under test
can print or raise with its environment: the values of the environment's key variables
(``OPENAI_API_KEY``...) are replaced before twice records any such text. The one place for
this rule: the evals layer (model args, summaries, reports) imports it from here.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

SECRET_ENV = re.compile(
    r"(API[-_]?KEY|TOKEN|SECRET|PASSWORD|ACCESS[-_]KEY|CREDENTIALS?)($|_)|^AWS_SESSION", re.I
)
"""Environment variables whose values are credentials (``OPENAI_API_KEY``,
``AZURE_OPENAI_AD_TOKEN``, ``AWS_SECRET_ACCESS_KEY``...)."""

MIN_SECRET_CHARS = 8
"""Shorter values are not scrubbed: replacing every "1" or "true" would garble the output."""

REDACTED = "[redacted]"


def secret_values(environ: Mapping[str, str] | None = None) -> list[str]:
    """The values of the environment's credential variables, longest first."""
    env = os.environ if environ is None else environ
    found = {v for k, v in env.items() if SECRET_ENV.search(k) and len(v) >= MIN_SECRET_CHARS}
    return sorted(found, key=len, reverse=True)


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
