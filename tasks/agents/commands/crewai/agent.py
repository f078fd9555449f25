"""A twice command agent on CrewAI, written as its docs write one: an ``Agent`` with tools, a
``Task`` and a ``Crew``, on ``LLM("openai/<model>", base_url=...)`` (CrewAI's native OpenAI
provider) pointed at an OpenAI-compatible endpoint.

Runs in this folder's own venv (``make frameworks-install``). With native tool calling (the
default for a model that supports function calling), a tool that raises becomes the tool result
"Error executing tool: <message>", which the model reads. Left at its default,
``Agent.max_retry_limit=2`` re-runs the whole task after an exception that ends the agent's
run; a tool's exception does not end it.

CrewAI's docs write tools as plain functions and run a crew with ``kickoff()``; it calls a tool
where it pleases (an async tool on an event loop of its own per call), so each call here gets
its own HTTP client, made and closed on the loop that runs it.

``agent.py --react``: the same agent on CrewAI's text (ReAct) path, which CrewAI takes for a
model served without function calling. Its LLM is CrewAI's own OpenAI provider with
``supports_function_calling()`` False (``OpenAICompletion.supports_function_calling``,
``crewai/llms/providers/openai/completion.py:3000-3002``, returns ``not self.is_o1_model``;
``Agent._supports_native_tool_calling``, ``crewai/agent/core.py:662-675``, reads it): the
model is offered no tools, the prompt lists them and asks for ``Thought:`` / ``Action:`` /
``Action Input:``, and ``ToolUsage`` runs the tool. When a tool raises, ``ToolUsage`` calls it
again with the same arguments by itself (``crewai/tools/tool_usage.py:622-629``, a blanket
``except Exception`` that invokes it again, and ``:708-756``, up to ``_max_parsing_attempts``
rounds of ``self.use(...)``), before the model sees anything.
"""

from __future__ import annotations

import asyncio
import functools
import os
import sys
import tempfile
from pathlib import Path

# CrewAI keeps task outputs under $XDG_DATA_HOME/<the current folder's name> and makes a
# credentials folder under ~/.local/share when imported: both go to a folder of this run's own,
# removed when it ends, so no trial reads what another left and nothing lands in the home.
_DATA = tempfile.TemporaryDirectory(prefix="twice-crewai-")
os.environ["XDG_DATA_HOME"] = os.environ["HOME"] = _DATA.name
# No telemetry or tracing leaves the machine, and no first-run prompt waits on a terminal.
os.environ.setdefault("CREWAI_DISABLE_TELEMETRY", "true")
os.environ.setdefault("CREWAI_DISABLE_TRACKING", "true")
os.environ.setdefault("OTEL_SDK_DISABLED", "true")
os.environ.setdefault("CREWAI_TRACING_ENABLED", "false")

from crewai import LLM, Agent, Crew, Task  # noqa: E402
from crewai.llms.providers.openai.completion import OpenAICompletion  # noqa: E402
from crewai.tools import tool  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from services import TRIAL, ApiTool, client, service_tools  # noqa: E402


def sync(name: str, fn: ApiTool) -> object:
    """``fn`` as a plain function that runs it with a client of its own, as a CrewAI tool."""

    @functools.wraps(fn)
    def run(**kwargs: object) -> str:
        async def once() -> str:
            async with client() as http:
                tools = {t.__name__: t for t in service_tools(http)}
                result: str = await tools[name](**kwargs)
                return result

        return asyncio.run(once())

    return tool(name)(run)


# mypy checks this folder without CrewAI installed, where its classes are Any.
class TextOnlyOpenAI(OpenAICompletion):  # type: ignore[misc]
    """CrewAI's OpenAI provider for a model served without function calling: CrewAI then
    offers it no tools and runs its text (ReAct) loop."""

    def supports_function_calling(self) -> bool:
        return False


def main() -> None:
    if "--react" in sys.argv[1:]:
        llm: LLM | OpenAICompletion = TextOnlyOpenAI(
            model=TRIAL["model"], base_url=TRIAL["base_url"], api_key=TRIAL["api_key"]
        )
    else:
        llm = LLM(
            model=f"openai/{TRIAL['model']}", base_url=TRIAL["base_url"], api_key=TRIAL["api_key"]
        )
    with_names = service_tools(client())  # only the names and signatures: never called
    agent = Agent(
        role="Support agent",
        goal="Do what the customer asks, once.",
        backstory=TRIAL["system"] or "You work in customer support.",
        tools=[sync(fn.__name__, fn) for fn in with_names],
        llm=llm,
    )
    task = Task(
        description=TRIAL["input"], expected_output="A short reply to the customer.", agent=agent
    )
    print(Crew(agents=[agent], tasks=[task]).kickoff())


main()
