"""Keeping credentials out of everything twice writes.

Three rules. Model args (``-M``) carry no credentials: any key, at any depth, that names one,
any URL with userinfo or a credential in its query string, and any value equal to a key in
the environment are refused, naming where (never the value). The values of the
environment's key variables (``OPENAI_API_KEY``...; see ``twice.tasks.secret_values``) are
scrubbed wherever they occur, inside longer text too, from whatever twice writes or prints,
because a gateway's 401 can echo the ``Authorization`` header into an error.

And what inspect records of a model is scrubbed on the model before inspect sees it
(:func:`scrub_model_record`): a key may legitimately sit inside a longer arg (a gateway's
``base_url=https://gw.example/KEY/v1``), which the provider needs as it is, while the log
header, ``eval-set.json`` and ``logs.json`` get ``[redacted]`` in its place. Only a model's
*name* cannot be split that way (inspect writes it into every event and sends it in every
request), so a model name holding a key is refused (:func:`check_model_name`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlsplit

from twice.tasks import CREDENTIAL_ARG, REDACTED, scrub, scrub_value, secret_values, secrets_in

from ..suite import SuiteError

if TYPE_CHECKING:
    from inspect_ai.model import Model

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


def _holders(text: str) -> list[str]:
    """The names of the credential variables whose values occur in ``text`` (values of
    :func:`remember_secrets` have no name: they are "a credential on the command line")."""
    names = secrets_in(text)
    if not names and any(secret in text for secret in secret_values()):
        names = ["a credential (a URL password in the environment, or one on the command line)"]
    return names


def check_model_name(name: str) -> None:
    """Refuse a model name that holds a credential (``openai-api/gw/<key>``).

    Inspect writes the name into the log header, every model event and ``eval-set.json``,
    and sends it in every request, so it cannot be scrubbed from the record and kept for the
    call, as a model arg's value is.

    Raises:
        CredentialError: naming the model (the key redacted) and the variable it holds.
    """
    holders = _holders(name)
    if holders:
        raise CredentialError(
            f"model {scrub(name)!r} holds the value of {', '.join(holders)}; a model name is "
            "written into every log, so it may not carry a key: name the model, and let the "
            f"provider take its key from the environment ({KEY_ENV_HINT})"
        )


def scrub_model_record(model: Model) -> None:
    """Scrub the environment's credentials from what inspect records of ``model``: its model
    args (the log header's ``model_args``, ``eval-set.json``, the task's resume identity)
    and its explicit ``base_url`` (``model_base_url``). The provider was built already and
    keeps the values as given, so the calls still go where they were meant to."""
    secrets = secret_values()
    if not secrets:
        return
    model.model_args = scrub_value(model.model_args, secrets)
    # Only the recorded copy: the provider holds its own base_url. inspect has no setter.
    base_url = model._explicit_base_url
    if base_url:
        model._explicit_base_url = scrub(base_url, secrets)


@contextmanager
def scrubbed_log_records() -> Iterator[None]:
    """Scrub the environment's credentials from every log record made in the block.

    Inspect logs each model request's URL (``POST http://gw.example/KEY/v1/...``) into its
    trace file (``~/.local/share/inspect_ai/traces``), and warnings into the eval log's
    transcript; a key inside ``base_url`` would be written there. The record factory is the
    one place every record of every logger passes, before any handler sees it.
    """
    secrets = secret_values()
    previous = logging.getLogRecordFactory()
    if not secrets:
        yield
        return

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        try:
            message = record.getMessage()
        except Exception:  # a bad format string: logging reports it when it is handled
            return record
        clean = scrub(message, secrets)
        if clean != message:
            record.msg, record.args = clean, None
        return record

    logging.setLogRecordFactory(factory)
    try:
        yield
    finally:
        if logging.getLogRecordFactory() is factory:  # another may have wrapped ours since
            logging.setLogRecordFactory(previous)
