"""Keeping credentials out of everything twice writes.

Two rules. Model args (``-M``) carry no credentials: any key, at any depth, that names one,
any URL with userinfo or a credential in its query string, and any value equal to a key in
the environment are refused, naming where (never the value). And the values of the
environment's key variables (``OPENAI_API_KEY``...) are scrubbed from whatever twice writes
or prints, because a gateway's 401 can echo the ``Authorization`` header into an error.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from twice.tasks import REDACTED, scrub, secret_values
from twice.tasks._redact import CREDENTIAL_ARG

from ._suite import SuiteError

KEY_ENV_HINT = (
    "OPENAI_API_KEY for openai/, ANTHROPIC_API_KEY for anthropic/, "
    "<SERVICE>_API_KEY for openai-api/<service>/"
)


class CredentialError(SuiteError):
    """A model arg that carries a credential (the message names where, never the value)."""


def redact_url(url: str) -> str:
    """A URL fit to print: userinfo and credential-named query values replaced."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return scrub(url)
    netloc = parts.netloc
    if "@" in netloc:
        netloc = f"{REDACTED}@{netloc.rsplit('@', 1)[1]}"
    query = "&".join(
        f"{k}={REDACTED if CREDENTIAL_ARG.search(k) else v}"
        for k, v in parse_qsl(parts.query, keep_blank_values=True)
    )
    return scrub(parts._replace(netloc=netloc, query=query).geturl())


def _walk(value: Any, path: str) -> Iterator[tuple[str, Any]]:
    yield path, value
    if isinstance(value, Mapping):
        for k, v in value.items():
            yield from _walk(v, f"{path}.{k}")
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            yield from _walk(v, f"{path}[{i}]")


def _url_problem(text: str) -> str | None:
    if "://" not in text:
        return None
    try:
        parts = urlsplit(text.strip())
    except ValueError:
        return None
    if parts.username is not None or parts.password is not None or "@" in parts.netloc:
        return "is a URL with a user name or password in it"
    for k, _ in parse_qsl(parts.query, keep_blank_values=True):
        if CREDENTIAL_ARG.search(k):
            return f"is a URL whose query string carries a credential ({k!r})"
    return None


def check_model_args(model_args: Mapping[str, Any]) -> None:
    """Refuse model args that carry credentials: API keys come from the environment only.

    Every key and value is checked at every depth (``-M "default_query={api-key: ...}"``),
    as is every URL (``-M base_url=http://user:pass@host/v1``, ``...?key=...``).

    Raises:
        CredentialError: naming the argument (its path, never its value) and the
            environment variables to use instead.
    """
    secrets = set(secret_values())
    for key, value in model_args.items():
        for path, item in _walk(value, key):
            name = path.rsplit(".", 1)[-1].split("[", 1)[0]
            if CREDENTIAL_ARG.search(name):
                why = "looks like a credential"
            elif isinstance(item, str) and (problem := _url_problem(item)):
                why = problem
            elif isinstance(item, str) and item in secrets:
                why = "holds the value of an API key variable"
            else:
                continue
            raise CredentialError(
                f"model arg {path!r} {why}; twice takes API keys from the environment only "
                f"(so they stay out of shell history, logs and reports): set {KEY_ENV_HINT}"
            )
