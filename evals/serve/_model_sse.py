"""A model's answer as the server-sent events of its API's stream, as the official SDKs
(OpenAI's Python and JavaScript SDKs, the Vercel AI SDK, Anthropic's SDK) parse them.

The whole answer is known before the first event (the eval's model answered in full): each
text, tool call or argument string goes out as one delta.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from typing import Any


def stream_body(dialect: str, result: dict[str, Any], request: dict[str, Any]) -> bytes:
    """``result`` (a ``chat.completion``, a Response or a Message, as JSON) as the body of
    the stream ``request`` asked for; ``dialect`` is ``completions``, ``responses`` or
    ``anthropic``."""
    if dialect == "completions":
        events = _completions_events(result, request)
    elif dialect == "responses":
        events = _responses_events(result)
    else:
        events = _anthropic_events(result)
    return "".join(events).encode()


def _sse(data: Any, event: str | None = None) -> str:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data)}\n\n"


def _completions_events(completion: dict[str, Any], request: dict[str, Any]) -> Iterator[str]:
    """A chat.completion as the chunks of a stream: per choice its role, its text, each tool
    call whole (id, name and arguments in one delta), its finish reason; the usage when
    asked for (``stream_options.include_usage``); then ``[DONE]``."""
    base = {k: completion.get(k) for k in ("id", "created", "model")}
    base["object"] = "chat.completion.chunk"

    def chunk(choices: list[dict[str, Any]], **extra: Any) -> str:
        return _sse({**base, "choices": choices, **extra})

    for choice in completion.get("choices") or []:
        index = choice.get("index", 0)
        message = choice.get("message") or {}
        yield chunk([{"index": index, "delta": {"role": "assistant"}, "finish_reason": None}])
        if message.get("content"):
            delta = {"content": message["content"]}
            yield chunk([{"index": index, "delta": delta, "finish_reason": None}])
        for i, call in enumerate(message.get("tool_calls") or []):
            delta = {"tool_calls": [{"index": i, **call}]}
            yield chunk([{"index": index, "delta": delta, "finish_reason": None}])
        finish = choice.get("finish_reason")
        yield chunk([{"index": index, "delta": {}, "finish_reason": finish}])
    if (request.get("stream_options") or {}).get("include_usage"):
        yield chunk([], usage=completion.get("usage"))
    yield "data: [DONE]\n\n"


def _responses_events(response: dict[str, Any]) -> Iterator[str]:
    """A Response as the events of a stream: created, each output item added (empty), its
    text or arguments as one delta, done; then completed with the whole response."""
    number = itertools.count()

    def event(kind: str, **data: Any) -> str:
        return _sse({"type": kind, "sequence_number": next(number), **data}, kind)

    started = {**response, "status": "in_progress", "output": []}
    yield event("response.created", response=started)
    yield event("response.in_progress", response=started)
    for index, item in enumerate(response.get("output") or []):
        item_id = item.get("id")
        at = {"item_id": item_id, "output_index": index}
        kind = item.get("type")
        if kind == "message":
            yield event("response.output_item.added", output_index=index,
                        item={**item, "status": "in_progress", "content": []})  # fmt: skip
            for part_index, part in enumerate(item.get("content") or []):
                empty = {**part, "text": ""} if part.get("type") == "output_text" else part
                yield event("response.content_part.added", **at, content_index=part_index,
                            part=empty)  # fmt: skip
                if part.get("type") == "output_text":
                    text = part.get("text", "")
                    yield event("response.output_text.delta", **at, content_index=part_index,
                                delta=text, logprobs=[])  # fmt: skip
                    yield event("response.output_text.done", **at, content_index=part_index,
                                text=text, logprobs=[])  # fmt: skip
                yield event("response.content_part.done", **at, content_index=part_index,
                            part=part)  # fmt: skip
        elif kind == "function_call":
            arguments = item.get("arguments", "")
            yield event("response.output_item.added", output_index=index,
                        item={**item, "status": "in_progress", "arguments": ""})  # fmt: skip
            yield event("response.function_call_arguments.delta", **at, delta=arguments)
            yield event("response.function_call_arguments.done", **at, arguments=arguments)
        else:  # reasoning and the rest: whole, as they come
            yield event("response.output_item.added", output_index=index, item=item)
        yield event("response.output_item.done", output_index=index, item=item)
    yield event("response.completed", response=response)


def _anthropic_events(message: dict[str, Any]) -> Iterator[str]:
    """A Message as the events of a stream: message_start (no content), each block started
    empty, its text, thinking or tool input as one delta, stopped; message_delta with the
    stop reason and usage; message_stop."""
    usage = message.get("usage") or {}
    start = {**message, "content": [], "stop_reason": None, "stop_sequence": None}
    yield _sse({"type": "message_start", "message": start}, "message_start")
    for index, block in enumerate(message.get("content") or []):
        kind = block.get("type")
        deltas: list[dict[str, Any]] = []
        if kind == "text":
            empty: dict[str, Any] = {**block, "text": ""}
            deltas.append({"type": "text_delta", "text": block.get("text", "")})
        elif kind in ("tool_use", "server_tool_use"):
            empty = {**block, "input": {}}
            partial = json.dumps(block.get("input") or {})
            deltas.append({"type": "input_json_delta", "partial_json": partial})
        elif kind == "thinking":
            empty = {**block, "thinking": "", "signature": ""}
            deltas.append({"type": "thinking_delta", "thinking": block.get("thinking", "")})
            if block.get("signature"):
                deltas.append({"type": "signature_delta", "signature": block["signature"]})
        else:
            empty = block
        yield _sse({"type": "content_block_start", "index": index, "content_block": empty},
                   "content_block_start")  # fmt: skip
        for delta in deltas:
            yield _sse({"type": "content_block_delta", "index": index, "delta": delta},
                       "content_block_delta")  # fmt: skip
        yield _sse({"type": "content_block_stop", "index": index}, "content_block_stop")
    delta = {"stop_reason": message.get("stop_reason"),
             "stop_sequence": message.get("stop_sequence")}  # fmt: skip
    yield _sse({"type": "message_delta", "delta": delta, "usage": usage}, "message_delta")
    yield _sse({"type": "message_stop"}, "message_stop")
