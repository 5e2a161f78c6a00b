"""A harness whose chat loop runs in the environment's own process: one chat completion per segment.

verifiers' `null` harness runs its chat program as a `uv` script, a process per segment (the first
turn and each feedback turn), which costs seconds of start-up each on a small machine. verifiers'
Harness contract allows a loop in process as long as every model call goes through the episode's
interception endpoint and secret; this one does exactly that and returns a synthetic success. It
has no tools: a task with tool servers needs `null` (or another harness that speaks MCP).
"""

from __future__ import annotations

import openai
import verifiers.v1 as vf
from verifiers.v1.dialects.chat import message_to_wire


class InProcessChatHarness(vf.Harness[vf.HarnessConfig]):
    APPENDS_SYSTEM_PROMPT = True   # the task's system prompt is its own message
    SUPPORTS_RESUME = True         # a later segment is relaunched on the whole conversation
    EXECUTES_CODE = False
    NEEDS_CONTAINER = False

    async def launch(self, ctx, trace, runtime, endpoint, secret, mcp_urls, data, **_) -> vf.ProgramResult:
        if mcp_urls:
            raise vf.HarnessError("the in-process chat harness has no tool support; use the null harness")
        system, prompt = self.resolve_prompt(data)
        messages = [{"role": "system", "content": system}] if system else []
        if isinstance(prompt, str):
            messages.append({"role": "user", "content": prompt})
        elif prompt is not None:
            messages += [message_to_wire(m) for m in prompt]
        async with openai.AsyncOpenAI(base_url=endpoint, api_key=secret, max_retries=0) as client:
            reply = await client.chat.completions.create(model=ctx.model, messages=messages)
        return vf.ProgramResult(exit_code=0, stdout=reply.choices[0].message.content or "", stderr="")
