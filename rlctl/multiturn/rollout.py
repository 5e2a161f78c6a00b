"""The multi-turn rollout loop: batched turns on the policy workers, tools and interactions here.

`ToolLoop` is the "tools" kind of the rollout table (rlctl.rollouts): wherever the controller generates
(training batches, validation, ReMax's greedy baseline, the separate rollout group, `rlctl eval`) its
`generate(prompt_batch, seed, mode)` returns a rollout Batch of the same shape as the single-turn one.
Each turn, all live conversations of the step generate together in one `generate_turn` call (the
first turn samples rollout.n continuations per prompt; later turns continue each sample once);
conversations that ended drop out. Between turns the controller runs the turn's tool calls
concurrently (an asyncio loop in a thread, each call time-limited) and asks the interaction,
so no tool ever runs inside a generation worker. See rlctl.multiturn.conversation for the
token bookkeeping and docs/multi-turn.md for the user's side.

Extra rollout columns (besides the single-turn ones): `conversation` (the whole chat, OpenAI
shape) and `multi_turn` (per sample: num_turns, tool_calls, turn_scores, tool_rewards, finish).
`response_mask` is 1 on model tokens only; `attention_mask` covers every real token.

A vision-language policy (rollout.mode = "sync", hf engine): each conversation carries its images
(the prompt's, then those its tools returned: rlctl.multiturn.vision_turns) into every turn and
into its training row (pixel_values, image_grid_thw, position_ids). Its turns re-prefill the whole
conversation (no kept KV), so each prefill computes the M-RoPE positions of every image so far.
"""

from __future__ import annotations

import asyncio
import copy
from typing import TYPE_CHECKING

import numpy as np

from rlctl.multiturn.conversation import ChatRenderer, Conversation
from rlctl.multiturn.tools import EventLoop, SampleTools, ToolResult, ToolRunner, clean_text, load_tools
from rlctl.multiturn.vision_turns import TurnImages, batch_positions, row_positions, stacked, tool_message
from rlctl.rollouts.single import join_rounds, score_samples
from rlctl.runtime.batch import Batch, chunk_bounds, object_array
from rlctl.runtime.policy import rollout_batch

if TYPE_CHECKING:
    from rlctl.rollouts.base import RolloutContext
    from rlctl.runtime.policy import TurnGenerator


class ToolLoop:
    """rlctl.rollouts.base.Rollout: the turn loop over `group`, of which it calls only `generate_turn`
    and `world_size` (the actor group, the one-step-off rollout group, a local model)."""

    def __init__(self, group: TurnGenerator, ctx: RolloutContext):
        from rlctl.models.vision import is_vision_model
        from rlctl.multiturn.interactions import load_interaction

        config = ctx.config
        mt = config.rollout.multi_turn
        self.group, self.config, self.mt = group, config, mt
        tools = load_tools(mt.tools, ctx.base) if ctx.tools is None else ctx.tools
        self.runner = ToolRunner(tools, timeout_s=mt.tool_timeout_s)
        self.interaction = load_interaction(mt.interaction, ctx.base) if mt.interaction else None
        self.renderer = ChatRenderer(ctx.tokenizer, self.runner.schemas)
        self.eos_ids = set(int(e) for e in ctx.eos_ids)
        self.pad = ctx.pad_id
        self.engine_log_probs = ctx.engine_log_probs
        self.vision = TurnImages(config.model.path) if is_vision_model(config.model.path) else None
        self.events = EventLoop()

    def close(self) -> None:
        self.events.close()

    def score(self, batch: Batch, reward, tokenizer, components: tuple = ()) -> dict:
        """The single-turn scoring, the whole conversation reaching the reward in verl's extra_info keys."""
        infos = [reward_extra_info(ei, conversation, info)
                 for ei, conversation, info in zip(batch["extra_info"], batch["conversation"], batch["multi_turn"])]
        metrics = score_samples(batch, reward, tokenizer, components, extra_info=infos)
        return {**metrics, **multi_turn_metrics(batch)}

    def sample_rows(self, batch: Batch) -> np.ndarray:
        return np.arange(len(batch))

    def watch(self, step: int, batch: Batch, say) -> None:
        """Nothing of its own to tell about a training batch."""

    @staticmethod
    def record_fields(batch: Batch, r: int) -> dict:
        """A row's fields in the rollouts dump: the whole conversation, its turns and tool calls."""
        info = batch["multi_turn"][r]
        return {"messages": batch["conversation"][r], "num_turns": info["num_turns"],
                "turn_scores": info["turn_scores"], "tool_rewards": info["tool_rewards"], "finish": info["finish"],
                "tool_calls": info["tool_calls"]}

    @property
    def prompt_tools(self) -> list[dict]:
        return self.runner.schemas

    def eval_samples(self, batch: Batch, tokenizer) -> list[tuple[dict, dict]]:
        """Each sample's (reward item, with the conversation in extra_info; record fields: the conversation,
        its turns and tool calls)."""
        from rlctl.rollouts.single import decode_prompts, decode_responses

        return [({"data_source": ds, "solution_str": text, "ground_truth": gt, "prompt_str": prompt_str,
                  "extra_info": reward_extra_info(ei, conv, info), "messages": prompt},
                 {"finish_reason": info["finish"], "messages": conv, "num_turns": info["num_turns"],
                  "tool_calls": info["tool_calls"], "turn_scores": info["turn_scores"]})
                for text, ds, gt, ei, conv, info, prompt, prompt_str in zip(
                    decode_responses(batch, tokenizer), batch["data_source"], batch["ground_truth"],
                    batch["extra_info"], batch["conversation"], batch["multi_turn"], batch["messages"],
                    decode_prompts(batch, tokenizer))]

    def join_groups(self, rounds: list[Batch], groups: int, world_size: int) -> Batch:
        return join_rounds(rounds, groups, self.config.rollout.n, world_size)

    # --- the loop ------------------------------------------------------------------------------
    def generate(self, batch: Batch, *, seed: int, mode: str = "train") -> Batch:
        rc = self.config.rollout
        n = {"train": rc.n, "val": rc.val_n, "greedy": 1}[mode]
        budget = self.config.data.max_response_length
        prompts = [row[m != 0].tolist() for row, m in zip(batch["input_ids"], batch["attention_mask"])]
        images = self._prompt_images(batch)
        pil = list(batch["images"]) if self.vision is not None and "images" in batch else [None] * len(prompts)
        convs = [self._start(prompt_ids, messages, extra_info, image, shown)
                 for prompt_ids, messages, extra_info, image, shown in zip(prompts, batch["messages"],
                                                                           batch["extra_info"], images, pil)
                 for _ in range(n)]
        self.events.run(self._gather([self._start_interaction(c) for c in convs]))
        live, turn = list(range(len(convs))), 0
        # kept-KV keys, new for every rollout (so no KV outlives a weight update): conversation i of
        # this call is `base + i`; each turn keeps its rows' KV and the next turn continues from it
        base = int(np.random.default_rng().integers(1, 2 ** 30)) << 24
        homes: dict[int, int] = {}   # conversation -> the rank holding its kept KV
        while live:
            turn += 1
            if turn == 1:   # n samples per prompt: the engine shares each prompt's prefill
                inputs, reps, turn_images = prompts, n, images
            else:
                inputs, reps = [convs[i].prompt_ids + convs[i].response_ids for i in live], 1
                turn_images = [stacked(convs[i].images) for i in live]
            limits = [min(budget - len(convs[i].response_ids), self.mt.max_turn_length or budget)
                      for i in live[::reps]]
            keys = [base + i for i in live] if self.vision is None else [-1] * len(live)   # VLM: re-prefill
            out = self._generate_turn(inputs, limits, reps, seed=_turn_seed(seed, turn), mode=mode,
                                      keys=keys, reuse=turn > 1 and self.vision is None, homes=homes,
                                      images=turn_images if self.vision is not None else None)
            for j, i in enumerate(live):
                length = int(out["response_length"][j])
                if self.vision is not None:   # the whole sequence's positions so far (the batch's at the end)
                    convs[i].positions = row_positions(out["position_ids"][j], out.meta["input_width"],
                                                       len(inputs[j // reps]), length)
                log_probs = out["rollout_log_prob"][j, :length].tolist() if "rollout_log_prob" in out else None
                convs[i].add_turn(self.renderer, out["responses"][j, :length].tolist(), log_probs,
                                  truncated=bool(out["truncated"][j]), eos_ids=self.eos_ids,
                                  at_budget=len(convs[i].response_ids) + length >= budget,
                                  max_turns=self.mt.max_turns, has_tools=bool(self.runner.tools),
                                  has_interaction=self.interaction is not None, fmt=self.mt.tool_format)
            self.events.run(self._between_turns([convs[i] for i in live], budget))
            live = [i for i in live if not convs[i].done]
        self.events.run(self._gather([self._finish(c) for c in convs]))
        return self._batch(batch, convs, n)

    def _start(self, prompt_ids: list, messages, extra_info, images=None, pil=None) -> Conversation:
        messages = [dict(m) for m in (messages if messages is not None else [])]
        extra_info = dict(extra_info or {})
        return Conversation(messages=messages, prompt_ids=list(prompt_ids),
                            text=self.renderer.render(messages, generation_prompt=True), extra_info=extra_info,
                            tools=SampleTools(tools_kwargs=dict(extra_info.get("tools_kwargs") or {}),
                                              images=list(pil or [])),
                            images=[images] if images is not None and images[0] is not None else [])

    def _prompt_images(self, batch: Batch) -> list:
        """Each prompt's (pixel_values, image_grid_thw) from the batch's PIL `images` column, or
        (None, None); all (None, None) for a text policy."""
        from rlctl.models.vision import IMAGES

        if self.vision is None or IMAGES not in batch:
            return [(None, None)] * len(batch["input_ids"])
        return [self.vision.encode(row) or (None, None) for row in batch[IMAGES]]

    def _generate_turn(self, inputs: list[list[int]], limits: list[int], n: int, *, seed: int, mode: str,
                       keys: list[int], reuse: bool, homes: dict[int, int], images: list | None = None) -> Batch:
        """One generate_turn call on the group: `inputs` (one per prompt, n samples each; or one per
        conversation, n = 1), every rank taking part (FSDP gathers weights in it). keys: each
        response row's kept-KV key; reuse: continue each input from its key's kept KV. A
        conversation goes back to the rank that holds its KV (`homes`, updated here) where the
        split allows; dummy rows (one token, dropped again) even the ranks out. images: each input's
        (pixel_values, image_grid_thw) for a vision-language policy; the result's meta then holds
        `input_width`, the width its position_ids' input part is padded to."""
        world = self.group.world_size
        if n > 1:   # prompts in order, each rank its consecutive share (Batch.chunk)
            order = list(range(len(inputs))) + [None] * max(0, world - len(inputs))
            bounds = chunk_bounds(len(order), world)
            for rank in range(world):
                for row in order[bounds[rank]:bounds[rank + 1]]:
                    if row is not None:
                        homes.update({keys[row * n + j]: rank for j in range(n)})
        else:
            order = _arrange(keys, homes, world)
        dummy = [self.pad]
        rows = [inputs[j] if j is not None else dummy for j in order]
        width = max(len(x) for x in rows)
        ids = np.full((len(rows), width), self.pad, dtype=np.int64)
        mask = np.zeros((len(rows), width), dtype=np.int64)
        for r, x in enumerate(rows):
            ids[r, width - len(x):], mask[r, width - len(x):] = x, 1
        lookup = [keys[j] if j is not None and reuse else -1 for j in order]
        store = [[keys[j * n + s] if j is not None else -1 for s in range(n)] for j in order]
        columns = {"input_ids": ids, "attention_mask": mask,
                   "max_new_tokens": np.asarray([limits[j] if j is not None else 1 for j in order], dtype=np.int64),
                   "kv_lookup": np.asarray(lookup, dtype=np.int64), "kv_store": np.asarray(store, dtype=np.int64)}
        if images is not None:   # each row's images, in token order (a dummy row has none)
            for k, key in enumerate(("pixel_values", "image_grid_thw")):
                columns[key] = object_array([images[j][k] if j is not None else None for j in order])
        out = self.group.generate_turn(Batch(columns), seed=seed, mode=mode, n=n, width=max(limits))
        at = {j: k for k, j in enumerate(order) if j is not None}
        picked = out.select([at[j] * n + s for j in range(len(inputs)) for s in range(n)])
        picked.meta["input_width"] = width
        return picked

    # --- tools and interactions, concurrently for all conversations of a turn --------------------
    async def _gather(self, coros):
        return await asyncio.gather(*coros)

    async def _between_turns(self, convs: list[Conversation], budget: int) -> None:
        await asyncio.gather(*(self._answer(c, budget) for c in convs if not c.done and c.next))

    async def _answer(self, conv: Conversation, budget: int) -> None:
        if conv.next == "tools":
            results = await asyncio.gather(*(self._call(conv, item) for item in conv.pending))
            conv.pending = []
            shown = [r.images if self.vision is not None else [] for r in results]
            messages = [tool_message(self._cap(r.text + _unseen(r, self.vision)), images)
                        for r, images in zip(results, shown)]
            encoded = self.vision.encode([im for images in shown for im in images]) if self.vision else None
            conv.extend(self.renderer, messages, budget, images=encoded, vision=self.vision)
            return
        reply = await self.interaction.respond(conv.interaction_state, conv.messages, conv.extra_info)
        if reply.score is not None:
            conv.turn_scores.append(reply.score)
        if reply.done:
            conv.finish = "interaction"
            return
        shown = reply.images if self.vision is not None else []
        conv.extend(self.renderer, [tool_message(self._cap(clean_text(reply.content)), shown, role="user")], budget,
                    images=self.vision.encode(shown) if shown else None, vision=self.vision)

    async def _call(self, conv: Conversation, item) -> ToolResult:
        if isinstance(item, str):   # a block that was not a readable call: the model hears why
            conv.calls.append({"name": None, "arguments": None, "error": True})
            return ToolResult(f"error: {item}", error=True)
        result = await self.runner.call(item.name, dict(item.arguments), conv.tools)
        conv.calls.append({"name": item.name, "arguments": item.arguments, "error": result.error})
        return result

    def _cap(self, text: str) -> str:
        """At most max_tool_response_length tokens of a tool or interaction answer."""
        limit = self.mt.max_tool_response_length
        ids = self.renderer.encode(text)
        if len(ids) <= limit:
            return text
        return clean_text(self.renderer.decode(ids[:limit])) + "...(truncated)"

    async def _start_interaction(self, conv: Conversation) -> None:
        if self.interaction is not None:
            conv.interaction_state = await self.interaction.start(conv.extra_info)

    async def _finish(self, conv: Conversation) -> None:
        await self.runner.finish(conv.tools)
        if self.interaction is not None:
            try:
                await self.interaction.finish(conv.interaction_state)
            except Exception:   # releasing state must not lose the rollout
                pass

    # --- the rollout batch -------------------------------------------------------------------------
    def _batch(self, prompts: Batch, convs: list[Conversation], n: int) -> Batch:
        """The single-turn rollout's rows (rlctl.runtime.policy.rollout_batch: prompt-major, prompts
        left-padded to data.max_prompt_length, responses right-padded to data.max_response_length),
        with response_mask 1 on model tokens only, and the conversation columns."""
        width = self.config.data.max_response_length
        lengths = np.array([len(c.response_ids) for c in convs], dtype=np.int64)
        responses = np.full((len(convs), width), self.pad, dtype=np.int64)
        model_mask = np.zeros((len(convs), width), dtype=np.float32)
        log_probs = np.zeros((len(convs), width), dtype=np.float32)
        for r, (c, t) in enumerate(zip(convs, lengths)):
            responses[r, :t], model_mask[r, :t], log_probs[r, :t] = c.response_ids, c.response_mask, c.log_probs
        out = {"responses": responses, "response_length": lengths,
               "response_mask": np.arange(width)[None, :] < lengths[:, None],   # every real token: the attention
               "truncated": np.array([c.finish == "length" for c in convs])}
        if self.engine_log_probs:   # GPU engines report their log-probs (0 on non-model tokens)
            out["rollout_log_prob"] = log_probs
        batch = rollout_batch(prompts, out, n, width=self.config.data.max_prompt_length, pad=self.pad)
        batch["response_mask"] = model_mask
        batch["conversation"] = object_array([copy.deepcopy(c.messages) for c in convs])
        batch["multi_turn"] = object_array([c.summary() for c in convs])
        if self.vision is not None:   # each row's own images (prompt's + tools') and whole-sequence positions
            from rlctl.models.vision import IMAGES, without_images

            batch = without_images(batch) if IMAGES in batch else batch
            pairs = [stacked(c.images) for c in convs]
            batch["pixel_values"] = object_array([p for p, _ in pairs])
            batch["image_grid_thw"] = object_array([g for _, g in pairs])
            batch["position_ids"] = batch_positions(convs, batch["prompts"].shape[1], width)
        return batch


def _unseen(result: ToolResult, vision) -> str:
    """What a text-only policy reads in place of a tool's images."""
    if vision is not None or not result.images:
        return ""
    return f"\n({len(result.images)} image(s) left out: the policy reads no images)"


def _arrange(keys: list[int], homes: dict[int, int], world: int) -> list[int | None]:
    """Row order for one turn over `world` ranks in equal consecutive shares: each conversation on
    its home rank while that rank has room, the rest where there is room; None = a dummy row."""
    share = -(-len(keys) // world)
    slots: list[list[int | None]] = [[] for _ in range(world)]
    loose = []
    for j, key in enumerate(keys):
        rank = homes.get(key)
        if rank is not None and len(slots[rank]) < share:
            slots[rank].append(j)
        else:
            loose.append(j)
    for j in loose:
        rank = next(r for r in range(world) if len(slots[r]) < share)
        slots[rank].append(j)
    for rank, slot in enumerate(slots):
        slot += [None] * (share - len(slot))
        homes.update({keys[j]: rank for j in slot if j is not None})
    return [j for slot in slots for j in slot]


def _turn_seed(seed: int, turn: int) -> int:
    return seed if turn == 1 else int(np.random.SeedSequence([seed, turn]).generate_state(1)[0])


def reward_extra_info(extra_info: dict, conversation: list, info: dict) -> dict:
    """verl's extra_info for a multi-turn sample: the row's own keys plus the whole conversation
    (`messages`), `num_turns`, `tool_calls`, `turn_scores` and `tool_rewards`."""
    return {**(extra_info or {}), "messages": conversation, "num_turns": info["num_turns"],
            "tool_calls": info["tool_calls"], "turn_scores": info["turn_scores"],
            "tool_rewards": info["tool_rewards"]}


def multi_turn_metrics(batch: Batch) -> dict:
    """Step metrics of a multi-turn rollout: turns, tool calls and their errors, how samples ended."""
    infos = list(batch["multi_turn"])
    calls = [len(i["tool_calls"]) for i in infos]
    errors = sum(sum(bool(c["error"]) for c in i["tool_calls"]) for i in infos)
    out = {"multi_turn/turns/mean": float(np.mean([i["num_turns"] for i in infos])),
           "multi_turn/tool_calls/mean": float(np.mean(calls)),
           "multi_turn/tool_use_frac": float(np.mean([c > 0 for c in calls])),
           "multi_turn/tool_errors_frac": errors / max(sum(calls), 1),
           "multi_turn/model_token_frac": float(batch["response_mask"].sum() / max(batch["response_length"].sum(), 1))}
    for finish in ("stop", "length", "max_turns", "interaction", "template"):
        out[f"multi_turn/finish_{finish}"] = float(np.mean([i["finish"] == finish for i in infos]))
    return out
