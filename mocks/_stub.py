"""Stub models: deterministic, offline controls registered as the inspect provider ``stub``.

``--model stub/NAME`` works from ``twice run`` and ``inspect eval``. A stub sees what a real
model sees (messages and tool schemas) plus what twice's trial setup keeps for it: the
sample's gold plan, the prompt's name and a seed (:func:`keep_stub_config`); a real model
sees none of them, and none of them is logged.

A stub follows the plan step by step. It recovers where it is from the ids of its *own* earlier
tool calls (``call_stub_s<step>_<a|v><n>``), so it keeps no state between calls and adds nothing a
real model would see. What it does after an error is its behaviour:

========== ==========================================================================
retry      repeats a failed call (up to ``-M attempts=3`` calls)
no-retry   reports the error and stops
verify     after an unknown outcome, reads state first; retries only if nothing happened
drift      like retry, but the retry uses slightly changed arguments (the plan's ``drift``)
parallel   issues the mutating call twice in one turn, then reports
noisy      after an unknown outcome retries with a probability set by the prompt
           (:data:`NOISY_RETRY_RATES`; ``-M p=0.3`` overrides), drawn from a seed per trial
========== ==========================================================================

Errors across an agent bridge: a framework agent's tool errors reach the model as plain text
(inspect's ``ChatMessageTool.error`` is None in the OpenAI wire format), so a stub also treats a
tool result as an error when its text looks like one (:data:`ERROR_TEXT`: LangGraph's
``Error: ...``, openai-agents' "An error occurred while running the tool", pydantic-ai's
``{"error": ...}`` and "Fix the errors and try again", Google ADK's ``{..."error_type": ...}``,
the bare messages of Node's fetch that the Vercel AI SDK passes on, twice's unknown-outcome
phrase, or a bare exception message that opens with a timeout or a lost connection, as AutoGen
and Agno send it), and
as an *unknown* outcome when it says so or names a timeout or a connection closed before
the reply (:data:`TIMEOUT_TEXT`). A text that hides the error's kind (the openai-agents
default) is an error of unknown kind: ``verify`` treats it as a plain failure.

An agent that offers the task's tools through an MCP server under the Claude Code CLI's names
(``mcp__<server>__<tool>``, the Claude Agent SDK) is called by those names.

A framework that writes the conversation's tool calls as text (smolagents'
``ToolCallingAgent``: "Calling tools: [...]", "Observation: ...", and only the error when a tool
raised) is read back as tool calls first; offered smolagents' ``final_answer`` tool, a stub
gives its final answer by calling it. Offered none of the plan's tools by a prompt that asks
for ReAct text (``Action:`` / ``Action Input:``), a stub reads and answers in that format
(:mod:`._stub_react`).

Independent actions: when a stub gives up on a step whose plan says ``on_fail: "continue"``
(e.g. the first of two refunds), it goes on with the next step instead of stopping.

The conversation faults (``ask_again``, ``compaction``): when the user asks again after the
final answer, ``retry`` and ``drift`` do the whole plan again; ``verify`` looks each step up
first and does only what it finds undone; ``noisy`` does the plan again with its retry
probability, else answers from memory, as ``no-retry`` and ``parallel`` always do. When a
tool result was compacted away (inspect's placeholder, :data:`COMPACTED_RESULT`), ``verify``
looks the step up; every other stub has no memory of it and does the step again. Calls made
after the user's n-th further message carry ``call_stub_r<n>_`` ids.

Sagas: when a stub gives up on a step whose plan says ``on_fail: "compensate"``, it calls the
``compensate`` action of each earlier step that has one, latest first (ids
``call_stub_s<step>_c<n>``), with ``{ref}`` replaced by the reference (e.g. a booking id) found by
the step's ``ref_pattern`` in the last successful result of that step that contains one: the
id the agent saw, which is not always the one the service made first. A compensation that
fails is retried like a forward call by ``retry``/``drift``; the others report it. A stub
never undoes again what an undo of the conversation already undid with the same arguments.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
from dataclasses import dataclass, replace
from typing import Any

from inspect_ai.model import (
    ChatMessage,
    ChatMessageAssistant,
    ChatMessageTool,
    ChatMessageUser,
    GenerateConfig,
    ModelAPI,
    ModelOutput,
    ModelUsage,
    modelapi,
)
from inspect_ai.tool import ToolCall, ToolChoice, ToolInfo

from ._inspect_compat import TOOL_RESULT_REMOVED
from ._stub_config import (
    STUB_STORE_KEY,
    StubCannotPlay,
    current_config,
    plan_of,
)
from ._stub_react import as_react_text, from_react_transcript, react_tools
from ._stub_transcript import (
    ID_PREFIX,
    STUB_ID,
    as_final_answer,
    from_text_transcript,
    is_error,
    is_unknown,
    offered_name,
)

STUB_MODELS: dict[str, str] = {
    "retry": "repeats a failed call",
    "no-retry": "reports the error and stops",
    "verify": "on an unknown outcome reads state first, retries only if nothing happened",
    "drift": "retries with slightly changed arguments",
    "parallel": "issues the same mutating call twice in one turn",
    "noisy": "after an unknown outcome retries with a probability set by the prompt",
}
"""The stub models by name (``stub/<name>``) with what each does."""

NOISY_RETRY_RATES: dict[str, float] = {"baseline": 0.5, "cautious": 0.1, "persistent": 0.9}
"""``stub/noisy``'s retry probability per built-in prompt; other prompts get
:data:`NOISY_DEFAULT_RATE`. These are the true rates its intervals must cover."""
NOISY_DEFAULT_RATE = 0.5

COMPACTED_RESULT = TOOL_RESULT_REMOVED
"""The text inspect's edit compaction leaves in place of a tool result: a stub that reads it
has lost what that call returned."""

REMEMBERS = ("no-retry", "parallel")
"""Stubs that, asked again, answer from the conversation (``noisy`` does so with 1 - p)."""


def noisy_retry_rate(prompt: str) -> float:
    """The true retry probability of ``stub/noisy`` under a prompt."""
    return NOISY_RETRY_RATES.get(prompt, NOISY_DEFAULT_RATE)


@dataclass
class _Turn:
    """What the stub did last (parsed from its own tool-call ids) and what came back."""

    step: int
    kind: str
    n: int
    results: list[ChatMessageTool]


def _last_turn(messages: list[ChatMessage]) -> _Turn | None:
    for i in range(len(messages) - 1, -1, -1):
        msg = messages[i]
        if isinstance(msg, ChatMessageAssistant):
            if not msg.tool_calls:
                return None
            m = STUB_ID.match(msg.tool_calls[0].id)
            if m is None:
                return None
            ids = {c.id for c in msg.tool_calls}
            results = [
                r
                for r in messages[i + 1 :]
                if isinstance(r, ChatMessageTool) and r.tool_call_id in ids
            ]
            return _Turn(int(m["step"]), m["kind"], int(m["n"]), results)
    return None


def _round(messages: list[ChatMessage]) -> int:
    """How many times the user wrote after the agent's first turn (0: not yet)."""
    first = next((i for i, m in enumerate(messages) if isinstance(m, ChatMessageAssistant)), None)
    if first is None:
        return 0
    return sum(isinstance(m, ChatMessageUser) for m in messages[first:])


def _asked_again(messages: list[ChatMessage]) -> bool:
    """Whether the conversation ends with the user writing after an answer of the agent."""
    return bool(messages) and isinstance(messages[-1], ChatMessageUser) and _round(messages) > 0


def _undone(messages: list[ChatMessage], step: int, args: dict[str, Any]) -> bool:
    """Whether an undo of ``step`` with ``args`` already succeeded in the conversation: asked
    again after a saga it undid, a stub does not undo the same thing twice."""
    done = {
        m.tool_call_id
        for m in messages
        if isinstance(m, ChatMessageTool) and m.tool_call_id and not is_error(m)
    }
    for m in messages:
        if isinstance(m, ChatMessageAssistant):
            for call in m.tool_calls or []:
                found = STUB_ID.match(call.id)
                if (
                    found is not None
                    and found["kind"] == "c"
                    and int(found["step"]) == step
                    and call.id in done
                    and call.arguments == args
                ):
                    return True
    return False


def _text(result: ChatMessageTool) -> str:
    if result.error is not None:
        return result.error.message
    return result.text


def _usage(messages: list[ChatMessage], out: str) -> ModelUsage:
    # Set usage explicitly: left empty, inspect downloads a tokenizer to count (fails offline).
    n_in = sum(len(m.text) for m in messages) // 4 + 1
    n_out = len(out) // 4 + 1
    return ModelUsage(input_tokens=n_in, output_tokens=n_out, total_tokens=n_in + n_out)


def _number(
    model: str, name: str, value: object, low: float, high: float | None, *, whole: bool = False
) -> float:
    """A stub model arg checked: a number (a whole one if ``whole``) in ``[low, high]``.

    Raises:
        ValueError: naming the arg, the value and what is accepted.
    """
    kind = "a whole number" if whole else "a number"
    accepted = f"{kind} >= {low:g}" if high is None else f"{kind} from {low:g} to {high:g}"
    ok = isinstance(value, int | float | str) and not isinstance(value, bool)
    number = float("nan")
    if ok:
        try:
            number = float(value)  # type: ignore[arg-type]
        except ValueError:
            ok = False
    ok = ok and low <= number and (high is None or number <= high)
    if ok and whole and not number.is_integer():
        ok = False
    if not ok:
        raise ValueError(f"{name} for stub/{model} must be {accepted}, got {value!r}")
    return number


class StubAPI(ModelAPI):
    """The ``stub`` model provider. ``model_name`` is the behaviour (``retry``, ``verify``...).

    Model args (``-M``): ``attempts`` (most calls of one action for retry/drift, default 3),
    ``p`` (override ``stub/noisy``'s retry probability), ``delay`` (seconds each turn waits,
    like a real model's latency; default 0, used by the concurrency benchmark).
    """

    def __init__(
        self,
        model_name: str,
        base_url: str | None = None,
        api_key: str | None = None,
        config: GenerateConfig = GenerateConfig(),  # noqa: B008 (inspect's ModelAPI signature)
        attempts: int = 3,
        p: float | None = None,
        delay: float = 0.0,
        **model_args: Any,
    ) -> None:
        super().__init__(model_name, base_url, api_key, [], config)
        if model_name not in STUB_MODELS:
            raise ValueError(
                f"unknown stub model 'stub/{model_name}'; expected one of: "
                + ", ".join(f"stub/{n}" for n in STUB_MODELS)
            )
        if model_args:
            takes = "attempts, delay, p" if model_name == "noisy" else "attempts, delay"
            raise ValueError(
                f"unknown model args for stub/{model_name}: {', '.join(model_args)}; "
                f"stub/{model_name} accepts {takes}"
            )
        self.behaviour = model_name
        self.attempts = int(_number(model_name, "attempts", attempts, 1, None, whole=True))
        self.delay = _number(model_name, "delay", delay, 0.0, None)
        if p is not None and model_name != "noisy":
            raise ValueError(
                f"p for stub/{model_name}: only stub/noisy takes p (its retry probability); "
                f"stub/{model_name} accepts attempts, delay"
            )
        self.p = None if p is None else _number(model_name, "p", p, 0.0, 1.0)

    def max_connections(self) -> int:
        return 64

    def connection_key(self) -> str:
        return f"stub/{self.behaviour}"

    async def generate(
        self,
        input: list[ChatMessage],
        tools: list[ToolInfo],
        tool_choice: ToolChoice,
        config: GenerateConfig,
    ) -> ModelOutput:
        cfg = current_config()
        if not cfg:
            raise RuntimeError(
                f"stub/{self.behaviour} found no trial setup (twice's keep_stub_config, or "
                f"{STUB_STORE_KEY!r} in the sample store); stub models only run twice tasks"
            )
        if self.delay:
            # A turn's latency, awaited like a network call so other trials run meanwhile.
            await asyncio.sleep(self.delay)
        plan = plan_of(cfg)
        names = {t.name for t in tools}
        react = react_tools(input, plan, names)
        if react is not None:
            names, input = react, from_react_transcript(input, plan)
        input = from_text_transcript(input, plan)
        turn = _last_turn(input)
        if turn is None:
            if _asked_again(input):
                out = self._asked_again(input, plan, cfg)
            elif any(isinstance(m, ChatMessageAssistant) for m in input):
                out = self._say(input, "Done.")
            else:
                out = self._act(input, plan, 0, 1)
        else:
            out = self._next(input, plan, cfg, turn)
        said = self._offered(out, input, plan, names)
        return as_final_answer(said, names) if react is None else as_react_text(said)

    def _offered(
        self,
        out: ModelOutput,
        input: list[ChatMessage],
        plan: list[dict[str, Any]],
        names: set[str],
    ) -> ModelOutput:
        """``out`` if it calls only tools the agent offered, as a real model would.

        A lookup the agent does not offer cannot be made: stub/verify then gives up, as a
        careful model with no way to check would. A plan's action the agent does not offer
        is an error naming both sets: the stub cannot play its part, and calling the missing
        tool anyway made every control crash alike (the controls were not told apart).
        """
        calls = out.message.tool_calls or []
        if any(offered_name(c.function, names) != c.function for c in calls):
            # The agent offers the task's tools under its own prefix: called by those names,
            # as a model reading the offered tools would.
            calls = [replace(c, function=offered_name(c.function, names)) for c in calls]
            out.message.tool_calls = calls
        missing = sorted({c.function for c in calls} - names)
        if not missing:
            return out
        m = STUB_ID.match(calls[0].id)
        if m is not None and m["kind"] == "v":
            turn = _last_turn(input)
            text = _text(turn.results[0]) if turn is not None and turn.results else "(no result)"
            return self._offered(self._fail(input, plan, int(m["step"]), text), input, plan, names)
        offered = ", ".join(sorted(names)) if names else "no tools"
        message = (
            f"stub/{self.behaviour} plays the task's plan, whose next call is "
            f"{', '.join(missing)}, but the agent offered {offered}: a stub model calls the "
            "task's tools by their names, so give the agent's tools those names"
        )
        config = current_config()
        if config is not None:
            config["refused"] = message
        raise StubCannotPlay(message)

    # -- decisions -------------------------------------------------------------------------

    def _next(
        self, input: list[ChatMessage], plan: list[dict[str, Any]], cfg: dict[str, Any], turn: _Turn
    ) -> ModelOutput:
        if turn.kind == "c":
            return self._after_undo(input, plan, turn)
        step = plan[turn.step]
        result = turn.results[0] if turn.results else None
        text = _text(result) if result is not None else "(no result)"
        failed = result is None or is_error(result)
        if turn.kind == "a" and not failed and text.strip() == COMPACTED_RESULT:
            # What the call returned was compacted away: verify looks; the others have no
            # memory of it and do the step again.
            if self.behaviour == "verify" and step.get("verify"):
                return self._verify(input, step, turn.step, turn.n)
            return self._act(input, plan, turn.step, turn.n + 1)

        if turn.kind == "v":
            if not failed and re.search(step.get("found_pattern") or r".", text):
                return self._advance(input, plan, turn.step, f"It had already happened: {text}")
            if turn.n >= self.attempts:
                return self._fail(input, plan, turn.step, text)
            return self._act(input, plan, turn.step, turn.n + 1)

        if self.behaviour == "parallel" and step.get("on_fail") == "compensate":
            # A saga step: the pair failed only if every call of it failed.
            if all(is_error(r) for r in turn.results):
                return self._fail(input, plan, turn.step, text)
            return self._advance(input, plan, turn.step, text)
        if self.behaviour == "parallel" or not failed:
            return self._advance(input, plan, turn.step, text)

        unknown = is_unknown(text)
        b = self.behaviour
        if b in ("retry", "drift"):
            if turn.n < self.attempts:
                return self._act(input, plan, turn.step, turn.n + 1)
        elif b == "verify":
            if unknown and step.get("verify"):
                return self._verify(input, step, turn.step, turn.n)
        elif b == "noisy" and unknown:
            p = self.p if self.p is not None else noisy_retry_rate(cfg.get("prompt", ""))
            draw = random.Random(f"{cfg.get('seed')}:{turn.step}:{turn.n}").random()
            if draw < p and turn.n < self.attempts:
                return self._act(input, plan, turn.step, turn.n + 1)
        return self._fail(input, plan, turn.step, text)

    # -- sagas -----------------------------------------------------------------------------

    def _fail(
        self, input: list[ChatMessage], plan: list[dict[str, Any]], step: int, text: str
    ) -> ModelOutput:
        """Give up on a step: undo the earlier steps first when the plan says so."""
        on_fail = plan[step].get("on_fail")
        if on_fail == "compensate":
            undo = self._undo_before(input, plan, step)
            if undo is not None:
                return undo
        if on_fail == "continue" and step + 1 < len(plan):
            # Independent actions: giving up on one does not abandon the others.
            return self._act(input, plan, step + 1, 1)
        return self._give_up(input, text)

    def _undo_before(
        self, input: list[ChatMessage], plan: list[dict[str, Any]], before: int
    ) -> ModelOutput | None:
        """The first compensation of a step before ``before`` (latest first), or None."""
        for j in range(before - 1, -1, -1):
            args = self._undo_args(input, plan[j], j)
            if args is not None:
                return self._undo(input, plan[j], j, 1, args)
        return None

    def _undo_args(
        self, input: list[ChatMessage], spec: dict[str, Any], step: int
    ) -> dict[str, Any] | None:
        comp = spec.get("compensate")
        if not comp:
            return None
        pattern = spec.get("ref_pattern")
        ref = None
        if pattern:
            for msg in reversed(input):
                if not isinstance(msg, ChatMessageTool) or is_error(msg):
                    continue
                m = STUB_ID.match(msg.tool_call_id or "")
                if m is None or int(m["step"]) != step or m["kind"] == "c":
                    continue
                found = re.search(pattern, msg.text)
                if found:
                    ref = found.group(0)
                    break
            if ref is None:
                return None  # nothing this step made is known: nothing to undo
        args = {
            k: v.replace("{ref}", ref) if isinstance(v, str) and ref is not None else v
            for k, v in comp["args"].items()
        }
        return None if _undone(input, step, args) else args

    def _undo(
        self,
        input: list[ChatMessage],
        spec: dict[str, Any],
        step: int,
        n: int,
        args: dict[str, Any],
    ) -> ModelOutput:
        tool = spec["compensate"]["tool"]
        if self.behaviour == "parallel":
            calls = [
                ToolCall(id=f"{ID_PREFIX}s{step}_c{n}p{i}", function=tool, arguments=dict(args))
                for i in (1, 2)
            ]
        else:
            calls = [ToolCall(id=f"{ID_PREFIX}s{step}_c{n}", function=tool, arguments=args)]
        return self._calls(input, calls)

    def _after_undo(
        self, input: list[ChatMessage], plan: list[dict[str, Any]], turn: _Turn
    ) -> ModelOutput:
        result = turn.results[0] if turn.results else None
        text = _text(result) if result is not None else "(no result)"
        failed = all(is_error(r) for r in turn.results) if turn.results else True
        if failed and self.behaviour in ("retry", "drift") and turn.n < self.attempts:
            args = self._undo_args(input, plan[turn.step], turn.step)
            if args is not None:
                return self._undo(input, plan[turn.step], turn.step, turn.n + 1, args)
        undo = self._undo_before(input, plan, turn.step)
        if undo is not None:
            return undo
        if failed:
            return self._say(
                input, f"I could not complete the request, and undoing it failed too: {text}"
            )
        return self._say(input, f"I could not complete the request, so I undid it: {text}")

    def _advance(
        self, input: list[ChatMessage], plan: list[dict[str, Any]], step: int, text: str
    ) -> ModelOutput:
        if step + 1 < len(plan):
            nxt = plan[step + 1]
            if self.behaviour == "verify" and nxt.get("verify") and _round(input) > 0:
                # Rechecking what was done (asked again, or after a compaction): look first.
                return self._verify(input, nxt, step + 1, 1)
            return self._act(input, plan, step + 1, 1)
        return self._say(input, f"Done. {text}")

    def _asked_again(
        self, input: list[ChatMessage], plan: list[dict[str, Any]], cfg: dict[str, Any]
    ) -> ModelOutput:
        """The user wrote again after the final answer ("did it go through?")."""
        b = self.behaviour
        redo = b in ("retry", "drift")
        if b == "noisy":
            p = self.p if self.p is not None else noisy_retry_rate(cfg.get("prompt", ""))
            redo = random.Random(f"{cfg.get('seed')}:asked:{_round(input)}").random() < p
        if b == "verify":
            for i, spec in enumerate(plan):
                if spec.get("verify"):
                    return self._verify(input, spec, i, 1)
        if redo and plan:
            return self._act(input, plan, 0, 1)
        said = next(
            (m.text for m in reversed(input) if isinstance(m, ChatMessageAssistant) and m.text),
            "",
        )
        return self._say(input, f"As I said: {said}" if said else "It is done.")

    def _give_up(self, input: list[ChatMessage], text: str) -> ModelOutput:
        return self._say(input, f"I could not complete the request. The last error was: {text}")

    # -- outputs ---------------------------------------------------------------------------

    def _act(
        self, input: list[ChatMessage], plan: list[dict[str, Any]], step: int, n: int
    ) -> ModelOutput:
        spec = plan[step]
        args = dict(spec["call"]["args"])
        if self.behaviour == "drift" and n > 1:
            args.update(spec.get("drift") or {})
        if self.behaviour == "parallel":
            calls = [
                ToolCall(
                    id=f"{ID_PREFIX}s{step}_a{n}p{i}",
                    function=spec["call"]["tool"],
                    arguments=dict(args),
                )
                for i in (1, 2)
            ]
        else:
            calls = [
                ToolCall(
                    id=f"{ID_PREFIX}s{step}_a{n}", function=spec["call"]["tool"], arguments=args
                )
            ]
        return self._calls(input, calls)

    def _verify(
        self, input: list[ChatMessage], spec: dict[str, Any], step: int, n: int
    ) -> ModelOutput:
        v = spec["verify"]
        call = ToolCall(
            id=f"{ID_PREFIX}s{step}_v{n}", function=v["tool"], arguments=dict(v["args"])
        )
        return self._calls(input, [call])

    def _calls(self, input: list[ChatMessage], calls: list[ToolCall]) -> ModelOutput:
        n = _round(input)
        if n:
            # The user wrote again: ids of this round differ from the earlier round's.
            calls = [
                ToolCall(
                    id=f"{ID_PREFIX}r{n}_{c.id[len(ID_PREFIX) :]}",
                    function=c.function,
                    arguments=c.arguments,
                )
                for c in calls
            ]
        out = ModelOutput.from_message(
            ChatMessageAssistant(content="", tool_calls=calls, model=self.model_name),
            stop_reason="tool_calls",
        )
        out.model = f"stub/{self.behaviour}"
        out.usage = _usage(input, json.dumps([c.arguments for c in calls]))
        return out

    def _say(self, input: list[ChatMessage], text: str) -> ModelOutput:
        out = ModelOutput.from_content(f"stub/{self.behaviour}", text)
        out.usage = _usage(input, text)
        return out


@modelapi(name="stub")
def stub() -> type[ModelAPI]:
    """Register the ``stub`` provider (resolved through the package's entry point)."""
    return StubAPI
