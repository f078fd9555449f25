"""The model endpoint an agent command is given, answered by real SDK clients over loopback."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
from inspect_ai import Task, eval
from inspect_ai.dataset import Sample
from inspect_ai.log import EvalLog
from inspect_ai.model import ChatMessage, ModelOutput, ModelUsage, get_model
from inspect_ai.solver import Generate, Solver, TaskState, solver
from inspect_ai.tool import ToolInfo
from twice.evals.serve._model_endpoint import ModelAccess, model_endpoint

if TYPE_CHECKING:
    import openai

USAGE = ModelUsage(input_tokens=10, output_tokens=5, total_tokens=15)
PARAMETERS = {"type": "object", "properties": {"order_id": {"type": "string"}}}
TOOL = {
    "type": "function",
    "function": {"name": "issue_refund", "description": "Refund.", "parameters": PARAMETERS},
}
RESPONSES_TOOL = {
    "type": "function",
    "name": "issue_refund",
    "description": "Refund.",
    "parameters": PARAMETERS,
}
ANTHROPIC_TOOL = {"name": "issue_refund", "description": "Refund.", "input_schema": PARAMETERS}


def _policy(
    input: list[ChatMessage], tools: list[ToolInfo], tool_choice: Any, config: Any
) -> ModelOutput:
    """Calls the refund tool when it has one, else says the last message back."""
    if tools:
        out = ModelOutput.for_tool_call(
            "mockllm/model", "issue_refund", {"order_id": "A-1"}, tool_call_id="call_1",
            content="",
        )  # fmt: skip
    else:
        out = ModelOutput.from_content("mockllm/model", f"heard: {input[-1].text}")
    out.usage = USAGE
    return out


Client = Callable[[ModelAccess], Awaitable[Any]]


def _run(tmp_path: Path, clients: list[Client], model: Any = None) -> tuple[EvalLog, list[Any]]:
    """One eval, a sample per client: each sample's solver enters the endpoint and runs its
    client against it; returns the log and what each client returned."""
    results: list[Any] = [None] * len(clients)

    @solver
    def with_endpoint() -> Solver:
        async def solve(state: TaskState, generate: Generate) -> TaskState:
            index = int(str(state.sample_id))
            async with model_endpoint() as (access, bridge):
                results[index] = await clients[index](access)
            state.messages = list(bridge.state.messages) or state.messages
            state.output = bridge.state.output
            return state

        return solve

    task = Task(
        dataset=[Sample(input=f"request {i}", id=i) for i in range(len(clients))],
        solver=with_endpoint(),
        message_limit=10,
    )
    model = model or get_model("mockllm/model", custom_outputs=_policy)
    (log,) = eval(task, model=model, display="none", log_dir=str(tmp_path / "logs"))
    return log, results


def _openai(access: ModelAccess) -> openai.AsyncOpenAI:
    import openai  # here: the SDKs take seconds to import, each worker's collection would pay

    return openai.AsyncOpenAI(base_url=access.openai_base_url, api_key="unused", max_retries=0)


async def _chat(access: ModelAccess) -> Any:
    client = _openai(access)
    messages: Any = [{"role": "user", "content": "refund A-1"}]
    plain = await client.chat.completions.create(model="inspect", messages=messages, tools=[TOOL])  # type: ignore[list-item]
    stream = await client.chat.completions.create(
        model="inspect", messages=messages, tools=[TOOL], stream=True,  # type: ignore[list-item]
        stream_options={"include_usage": True},
    )  # fmt: skip
    chunks = [chunk async for chunk in stream]
    text_stream = await client.chat.completions.create(
        model="inspect", messages=messages, stream=True
    )
    text = "".join([c.choices[0].delta.content or "" async for c in text_stream if c.choices])
    return plain, chunks, text


def test_chat_completions_answered_whole_and_streamed(tmp_path: Path) -> None:
    log, [(plain, chunks, text)] = _run(tmp_path, [_chat])
    assert log.status == "success", log.error
    (call,) = plain.choices[0].message.tool_calls
    assert call.function.name == "issue_refund"
    assert json.loads(call.function.arguments) == {"order_id": "A-1"}
    assert plain.choices[0].finish_reason == "tool_calls"
    # The stream: a role, the tool call whole in one delta, the finish reason, the usage.
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    (streamed,) = [tc for d in deltas for tc in d.tool_calls or []]
    assert (streamed.id, streamed.function.name) == ("call_1", "issue_refund")
    assert json.loads(streamed.function.arguments or "") == {"order_id": "A-1"}
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    assert chunks[-1].usage is not None and chunks[-1].usage.total_tokens == 15
    assert text == "heard: refund A-1"
    # What the command sent is the sample's conversation, as inspect's bridge records it.
    assert log.samples
    (call,) = log.samples[0].messages[-1].tool_calls or []
    assert call.function == "issue_refund" and call.arguments == {"order_id": "A-1"}


async def _responses(access: ModelAccess) -> Any:
    client = _openai(access)
    plain = await client.responses.create(
        model="inspect", input="refund A-1", tools=[RESPONSES_TOOL]
    )  # type: ignore[list-item]
    events = [e async for e in await client.responses.create(
        model="inspect", input="refund A-1", tools=[RESPONSES_TOOL], stream=True)]  # type: ignore[list-item]  # fmt: skip
    async with client.responses.stream(model="inspect", input="hello") as stream:
        final = await stream.get_final_response()
    return plain, events, final


def test_responses_answered_whole_and_streamed(tmp_path: Path) -> None:
    log, [(plain, events, final)] = _run(tmp_path, [_responses])
    assert log.status == "success", log.error
    (call,) = [item for item in plain.output if item.type == "function_call"]
    assert call.name == "issue_refund" and json.loads(call.arguments) == {"order_id": "A-1"}
    kinds = [e.type for e in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert "response.function_call_arguments.done" in kinds
    (done,) = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert json.loads(done.arguments) == {"order_id": "A-1"}
    # The SDK's own accumulation of the events gives the whole answer back.
    assert final.output_text == "heard: hello"


async def _anthropic(access: ModelAccess) -> Any:
    import anthropic

    client = anthropic.AsyncAnthropic(
        base_url=access.anthropic_base_url, api_key=access.key, max_retries=0
    )
    messages: Any = [{"role": "user", "content": "refund A-1"}]
    plain = await client.messages.create(
        model="inspect",
        max_tokens=100,
        messages=messages,
        tools=[ANTHROPIC_TOOL],  # type: ignore[list-item]
    )
    async with client.messages.stream(
        model="inspect",
        max_tokens=100,
        messages=messages,
        tools=[ANTHROPIC_TOOL],  # type: ignore[list-item]
    ) as stream:
        streamed = await stream.get_final_message()
    async with client.messages.stream(model="inspect", max_tokens=100, messages=messages) as text:
        said = await text.get_final_message()
    return plain, streamed, said


def test_anthropic_messages_answered_whole_and_streamed(tmp_path: Path) -> None:
    log, [(plain, streamed, said)] = _run(tmp_path, [_anthropic])
    assert log.status == "success", log.error
    for message in (plain, streamed):
        (use,) = [b for b in message.content if b.type == "tool_use"]
        assert use.name == "issue_refund" and use.input == {"order_id": "A-1"}
        assert message.stop_reason == "tool_use"
    assert [b.text for b in said.content if b.type == "text"] == ["heard: refund A-1"]


async def _the_key_alone(access: ModelAccess) -> Any:
    import anthropic
    import openai

    # No path prefix: the key names the trial (the x-api-key form included).
    root = access.openai_base_url.split("/t/")[0]
    client = openai.AsyncOpenAI(base_url=f"{root}/v1", api_key=access.key, max_retries=0)
    models = await client.models.list()
    plain = await client.chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": "hi"}]
    )
    claude = anthropic.AsyncAnthropic(base_url=root, api_key=access.key, max_retries=0)
    said = await claude.messages.create(
        model="claude-x", max_tokens=10, messages=[{"role": "user", "content": "hi"}]
    )
    return [m.id for m in models.data], plain.choices[0].message.content, said.content[0]


def test_the_key_alone_names_the_trial_and_any_model_name_is_the_evals(tmp_path: Path) -> None:
    log, [(models, text, block)] = _run(tmp_path, [_the_key_alone])
    assert log.status == "success", log.error
    assert models == ["inspect"]
    assert text == "heard: hi" and block.text == "heard: hi"


def test_two_concurrent_trials_are_answered_apart(tmp_path: Path) -> None:
    # Both trials are in the endpoint at once; each asks with its own key and hears its own
    # conversation, recorded in its own sample.
    both_in = asyncio.Event()
    entered: list[ModelAccess] = []

    def client(n: int) -> Client:
        async def ask(access: ModelAccess) -> Any:
            entered.append(access)
            if len(entered) == 2:
                both_in.set()
            await asyncio.wait_for(both_in.wait(), 30)
            c = _openai(access)
            said = await c.chat.completions.create(
                model="inspect", messages=[{"role": "user", "content": f"trial {n}"}]
            )
            return access.key, said.choices[0].message.content

        return ask

    log, results = _run(tmp_path, [client(0), client(1)])
    assert log.status == "success", log.error
    assert [text for _, text in results] == ["heard: trial 0", "heard: trial 1"]
    assert results[0][0] != results[1][0]
    assert log.samples is not None
    for sample in log.samples:
        assert sample.output.completion == f"heard: trial {sample.id}"


async def _refused(access: ModelAccess) -> Any:
    root = access.openai_base_url.split("/t/")[0]
    async with httpx.AsyncClient() as http:
        body = {"model": "inspect", "messages": [{"role": "user", "content": "hi"}]}
        wrong = await http.post(f"{root}/v1/chat/completions", json=body,
                                headers={"Authorization": "Bearer sk-real-key-123456"})  # fmt: skip
        prefixed = await http.post(f"{root}/t/twice-trial-nope/v1/chat/completions", json=body)
        claude = await http.post(f"{root}/v1/messages", json=body,
                                 headers={"x-api-key": "sk-ant-real-9876"})  # fmt: skip
        missing = await http.post(f"{access.openai_base_url}/embeddings", json=body)
        bad = await http.post(f"{access.openai_base_url}/chat/completions", content=b"[1]")
    return wrong, prefixed, claude, missing, bad


def test_a_request_naming_no_trial_is_refused_and_the_key_is_not_echoed(tmp_path: Path) -> None:
    log, [(wrong, prefixed, claude, missing, bad)] = _run(tmp_path, [_refused])
    assert log.status == "success", log.error
    for refused in (wrong, prefixed, claude):
        assert refused.status_code == 401
        text = refused.text
        assert "OPENAI_API_KEY" in text and "ANTHROPIC_API_KEY" in text and "/t/KEY/" in text
        assert "sk-real" not in text and "sk-ant" not in text and "nope" not in text
    assert claude.json()["type"] == "error"  # the Anthropic shape on its route
    assert missing.status_code == 404
    assert "POST /v1/embeddings" in missing.text and "POST /v1/messages" in missing.text
    assert "twice-trial" not in missing.text
    assert bad.status_code == 400 and "JSON object" in bad.text


async def _fails(access: ModelAccess) -> Any:
    import openai

    try:
        await _openai(access).chat.completions.create(
            model="inspect", messages=[{"role": "user", "content": "hi"}]
        )
    except openai.APIStatusError as ex:
        return ex.status_code, ex.message
    return None


def test_a_model_error_is_the_agents_error_reply_and_the_sample_goes_on(tmp_path: Path) -> None:
    # As inspect's sandbox bridge forwards it: the agent gets an error reply, and may go on.
    def broken(*args: Any) -> ModelOutput:
        raise RuntimeError("the model is down")

    model = get_model("mockllm/model", custom_outputs=broken)
    log, [result] = _run(tmp_path, [_fails], model=model)
    assert log.status == "success", log.error
    assert result is not None
    status, message = result
    assert status == 500 and "the model is down" in message


async def _past_the_limit(access: ModelAccess) -> Any:
    client = _openai(access)
    messages: Any = [{"role": "user", "content": "hi"}] * 40  # past the task's limit (10)
    await client.chat.completions.create(model="inspect", messages=messages)
    await asyncio.sleep(30)  # never reached: the limit ends the block
    return "not ended"


def test_a_limit_the_model_call_hits_ends_the_sample(tmp_path: Path) -> None:
    log, [result] = _run(tmp_path, [_past_the_limit])
    assert result is None  # the client was cancelled
    assert log.samples and log.samples[0].limit is not None
    assert log.samples[0].limit.type == "message"


def test_a_trials_key_is_refused_once_its_trial_ended() -> None:
    async def main() -> int:
        async with model_endpoint() as (ended, _):
            pass
        async with model_endpoint() as (running, _):  # the server of this loop is up again
            url = f"{running.openai_base_url}/models"
            async with httpx.AsyncClient() as http:
                return (await http.get(url.replace(running.key, ended.key))).status_code

    assert asyncio.run(main()) == 401


def test_a_client_that_waits_for_100_continue_gets_it_then_its_answer() -> None:
    # curl sends a large body (an agent's long conversation) only after 100 Continue.
    async def main() -> tuple[bytes, bytes]:
        async with model_endpoint() as (access, _):
            port = int(access.openai_base_url.split(":")[2].split("/")[0])
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            body = b"{}"
            writer.write(
                f"POST /t/{access.key}/v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                f"Expect: 100-continue\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            )
            interim = await reader.readuntil(b"\r\n\r\n")
            writer.write(body)
            final = await reader.readuntil(b"\r\n\r\n")
            writer.close()
            return interim, final

    interim, final = asyncio.run(main())
    assert interim.startswith(b"HTTP/1.1 100 Continue")
    assert final.startswith(b"HTTP/1.1 404")  # POST /v1/models is no route: GET is
