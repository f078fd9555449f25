"""``twice`` with one extra model provider, ``hang/<name>``, for the killed-run test.

With ``HANG=1`` in the environment, ``hang`` blocks forever on sample ``HANG_SAMPLE`` (as a
stuck provider call would) after touching ``$MARK_DIR/hanging``, which it does only once
every other running trial has finished; every other generate answers "Nothing to do." half a
second late (so that wait is exercised) and touches ``$MARK_DIR/done-<sample>``.
``hang/dup`` plays ``stub/retry``'s first two turns on the hanging sample before it hangs:
under ``lost_reply`` that trial's ledger holds a duplicate when the run is stopped. Sample
``ERROR_SAMPLE``, if set, errors at its first model call.
Usage: ``python hang_run.py run ...``.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from inspect_ai.log._samples import active_samples  # not public: the running samples
from inspect_ai.model import GenerateConfig, ModelAPI, ModelOutput, ModelUsage, modelapi
from inspect_ai.solver._task_state import sample_state  # not public: the running sample
from twice.evals.cli import main
from twice.mocks import StubAPI

MARK = Path(os.environ["MARK_DIR"])


class HangAPI(ModelAPI):
    def __init__(
        self,
        model_name: str,
        base_url: str | None = None,
        api_key: str | None = None,
        config: GenerateConfig = GenerateConfig(),  # noqa: B008 (inspect's own signature)
        **model_args: Any,
    ) -> None:
        super().__init__(model_name, base_url, api_key, [], config)
        self.stub = StubAPI("retry")

    async def generate(self, input: Any, tools: Any, tool_choice: Any, config: Any) -> ModelOutput:
        sample = str(sample_state().sample_id)  # type: ignore[union-attr]
        if sample == os.environ.get("ERROR_SAMPLE"):
            raise RuntimeError(f"hang/{self.model_name} fails on {sample} (ERROR_SAMPLE)")
        if os.environ.get("HANG") and sample == os.environ["HANG_SAMPLE"]:
            turns = sum(1 for m in input if m.role == "assistant")
            if self.model_name == "dup" and turns < 2:  # the call, then its retry
                return await self.stub.generate(input, tools, tool_choice, config)
            # "hanging" promises the test that the hanging trials are the only unfinished ones:
            # a signal sent before the others are scored and logged cuts them short too.
            while any(str(s.sample.id) != sample for s in active_samples()):
                await asyncio.sleep(0.05)
            (MARK / "hanging").touch()
            await asyncio.Event().wait()
        if os.environ.get("HANG"):
            await asyncio.sleep(0.5)  # the others finish after the hang starts, every time
        (MARK / f"done-{sample}").touch()
        out = ModelOutput.from_content(f"hang/{self.model_name}", "Nothing to do.")
        out.usage = ModelUsage(input_tokens=1, output_tokens=1, total_tokens=2)
        return out


@modelapi(name="hang")
def hang() -> type[ModelAPI]:
    return HangAPI


if __name__ == "__main__":
    main()
