"""The ``[serve]`` extra: ``twice serve``, each trial's mock services and tools over HTTP and
MCP for an agent twice does not run itself, and the inspect task that drives one."""

from ._app import TwiceServer
from ._config import TrialConfig, parse_trial_config
from ._errors import ControlError, ServeError
from ._eval import URL_ENV, agent_commands_at_once, command_agent, served_task
from ._log import DamagedLog, RequestLog
from ._server import running_server, serve

__all__ = [
    "URL_ENV",
    "ControlError",
    "DamagedLog",
    "RequestLog",
    "ServeError",
    "TrialConfig",
    "TwiceServer",
    "agent_commands_at_once",
    "command_agent",
    "parse_trial_config",
    "running_server",
    "serve",
    "served_task",
]
