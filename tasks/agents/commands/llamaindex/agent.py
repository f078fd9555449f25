"""A twice command agent on LlamaIndex, written as its docs write one: a ``FunctionAgent`` with
``FunctionTool``s, on ``OpenAILike`` pointed at an OpenAI-compatible endpoint.

Runs in this folder's own venv (``make frameworks-install``). A tool that raises becomes a
``ToolOutput(is_error=True)`` whose text, ``str(exception)``, the model reads; nothing in
LlamaIndex retries a tool (the LLM's ``max_retries`` covers model calls only).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from llama_index.core.agent.workflow import FunctionAgent
from llama_index.core.tools import FunctionTool
from llama_index.llms.openai_like import OpenAILike

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from services import TRIAL, client, service_tools


async def main() -> None:
    llm = OpenAILike(
        model=TRIAL["model"],
        api_base=TRIAL["base_url"],
        api_key=TRIAL["api_key"],
        is_chat_model=True,
        is_function_calling_model=True,
        context_window=128_000,
    )
    async with client() as http:
        tools = [FunctionTool.from_defaults(async_fn=fn) for fn in service_tools(http)]
        agent = FunctionAgent(tools=tools, llm=llm, system_prompt=TRIAL["system"])
        print(await agent.run(user_msg=TRIAL["input"]))


asyncio.run(main())
