"""Multi-turn rollouts on any rollout engine: the policy's turns of all live trajectories in one engine call.

Token in, token out. A trajectory's ids are the prompt, then per turn the ids the engine sampled (kept as sampled,
never decoded and re-encoded) and the environment's answer rendered by
:class:`~lit_entropy.agents.template.ConversationRenderer` (only the new messages are tokenized). The engine sees
each turn's context as those very ids, left-padded like any prompt, so its positions are the trainer's. One token
budget, ``model.sampling.max_new_tokens``, covers the whole trajectory: a turn is cut where it runs out, and an
environment answer that leaves no room for another turn ends the trajectory (stop reason ``length``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn
from torch.distributed.fsdp import FSDPModule

from lit_entropy.agents.config import MultiTurnConfig
from lit_entropy.agents.environments import Environments, EnvironmentSession
from lit_entropy.agents.template import ConversationRenderer
from lit_entropy.agents.tools import TRUNCATION_MARKER
from lit_entropy.distributed.collectives import all_reduce_max, is_distributed
from lit_entropy.rollout.base import RolloutBatch, RolloutEngine, SamplingConfig
from lit_entropy.rollout.trajectories import STOP_REASONS, Trajectories

__all__ = ["MultiTurnRollout", "Trajectory"]


@dataclasses.dataclass
class Trajectory:
    """One row while it is rolled out: its prompt ids and, per segment, the ids and whose they are."""

    prompt: list[int]
    session: EnvironmentSession
    ids: list[int] = dataclasses.field(default_factory=list)
    from_policy: list[bool] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    conversation: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    reward: float = 0.0
    turn_rewards: list[tuple[int, float]] = dataclasses.field(default_factory=list)  # (turn's last column, reward)
    stop: str | None = None

    def add(self, ids: Sequence[int], policy: bool, logprobs: Sequence[float] | None = None) -> None:
        self.ids.extend(ids)
        self.from_policy.extend([policy] * len(ids))
        self.logprobs.extend(logprobs if logprobs is not None else [0.0] * len(ids))


class MultiTurnRollout:
    """Rolls out ``model.sampling.multi_turn`` trajectories with a rollout engine.

    Args:
        config: the settings (environment, tools and parser are imported here: errors come before training).
    """

    def __init__(self, config: MultiTurnConfig) -> None:
        self.config = config
        self.environments = Environments(config)
        self.renderer: ConversationRenderer | None = None

    @classmethod
    def of(cls, settings: Any) -> MultiTurnRollout | None:
        """The rollout of ``settings.sampling.multi_turn`` (None when unset). Under ``model.sampling.async_rollout``
        the rollout worker runs :meth:`generate` on its own copy of the policy (the Hugging Face engine; the
        asynchronous pipeline refuses the vLLM engine's process); under ``model.sampling.filter_groups`` the fill
        keeps whole trajectories (their environment masks and records) across generation batches."""
        config = settings.sampling.multi_turn
        return None if config is None else cls(config)

    def bind(self, tokenizer: Any, eos_token_ids: Sequence[int]) -> None:
        """At setup: the tokenizer, the EOS ids that end a turn, and the chat-template check (refuses a template
        that rewrites earlier turns)."""
        if not eos_token_ids:
            raise ValueError(
                "model.sampling.multi_turn needs an EOS token to end a policy turn; the tokenizer has none"
            )
        self.tokenizer, self.eos_ids = tokenizer, frozenset(eos_token_ids)
        schemas = self.environments.schemas()
        self.renderer = ConversationRenderer(tokenizer, list(eos_token_ids), self.config.chat_template, schemas)

    @torch.no_grad()
    def generate(
        self, engine: RolloutEngine, policy: nn.Module, batch: dict[str, Any], sampling: SamplingConfig
    ) -> RolloutBatch:
        """``sampling.num_samples`` trajectories per prompt of ``batch`` (rows grouped by prompt)."""
        self.bound()
        rows = self._start(batch, sampling.num_samples)
        budget, turn = sampling.max_new_tokens, 0
        device = batch["input_ids"].device
        # A sharded (FSDP2) policy's forward is a collective: every rank runs the same rounds and asks the engine
        # for the same number of tokens, a rank whose trajectories all ended generating for a throw-away row.
        lockstep = isinstance(policy, FSDPModule) and is_distributed()
        while True:
            live = [t for t in rows if t.stop is None]
            room = [budget - len(t.ids) for t in live]  # >= 1 for a live row: an answer leaving none ends it
            width = max(room, default=0)
            if lockstep:
                width = int(all_reduce_max(torch.tensor([width], device=device)).item())
            if width == 0:  # no live row (on any rank, in lockstep)
                break
            last = turn == self.config.max_turns - 1
            turn_sampling = _turn_sampling(sampling, width)
            contexts = [t.prompt + t.ids for t in live] or [rows[0].prompt]  # idle in lockstep: a throw-away row
            out = engine.generate(policy, *_left_pad(contexts, self.pad_id, device), turn_sampling)
            for i, (row, left) in enumerate(zip(live, room, strict=True)):
                self._policy_turn(row, out, i, left, last)
            turn += 1
        return self._batch(rows, device, engine.reports_logprobs)

    def bound(self) -> ConversationRenderer:
        """The renderer of :meth:`bind` (a RuntimeError before it)."""
        if self.renderer is None:
            raise RuntimeError("MultiTurnRollout.bind(tokenizer, eos_token_ids) must run before generate")
        return self.renderer

    @property
    def pad_id(self) -> int:
        pad = self.tokenizer.pad_token_id
        return int(pad if pad is not None else next(iter(self.eos_ids)))

    def _start(self, batch: dict[str, Any], num_samples: int) -> list[Trajectory]:
        """A trajectory per sample, its environment reset for its prompt's dataset row."""
        rows = []
        for b, (ids, mask) in enumerate(zip(batch["input_ids"], batch["attention_mask"], strict=True)):
            prompt = ids[mask.bool()].tolist()
            row = {"prompt": batch["prompts"][b], "answer": batch["answers"][b]}
            if "classes" in batch:
                row["class"] = batch["classes"][b]
            for _ in range(num_samples):
                session = self.environments.session()
                first = session.start(row)
                own = prompt
                if first is not None:
                    text, chat = self.bound().prompt_with(batch["prompts"][b], first)
                    own = list(self.tokenizer(text, add_special_tokens=not chat)["input_ids"])
                trajectory = Trajectory(prompt=own, session=session)
                if first is not None:
                    trajectory.conversation.append({"role": "user", "content": first})
                rows.append(trajectory)
        return rows

    def _policy_turn(self, row: Trajectory, out: RolloutBatch, i: int, room: int, last: bool) -> None:
        """Take row ``i`` of the engine's output as ``row``'s turn (cut at its budget); the environment answers."""
        mask = out.response_mask[i]
        ids = out.responses[i][mask].tolist()[:room]
        logprobs = None if out.rollout_logprobs is None else out.rollout_logprobs[i][mask].tolist()[:room]
        row.add(ids, True, logprobs)
        row.turns += 1
        ended = bool(ids) and ids[-1] in self.eos_ids
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        row.conversation.append({"role": "assistant", "content": text})
        if not ended:  # the budget ran out inside the turn
            row.stop = "length"
            return
        outcome = row.session.respond(text, last)
        row.tool_calls += outcome.tool_calls
        row.tool_errors += outcome.tool_errors
        row.reward += outcome.reward
        if outcome.reward:
            row.turn_rewards.append((len(row.ids) - 1, outcome.reward))
        if outcome.stop is not None:
            row.stop = outcome.stop
            return
        messages = [self._cut(m) for m in outcome.messages]
        env_ids = self.bound().message_ids(messages)
        if len(env_ids) >= room - len(ids):  # no room left for another policy token after the answer
            row.stop = "length"
            return
        row.conversation.extend(messages)
        row.add(env_ids, False)

    def _cut(self, message: dict[str, Any]) -> dict[str, Any]:
        """A tool result cut at ``max_tool_response_tokens`` tokens, marked."""
        if message["role"] != "tool":
            return message
        limit = self.config.max_tool_response_tokens
        ids = self.tokenizer(message["content"], add_special_tokens=False)["input_ids"]
        if len(ids) <= limit:
            return message
        return {**message, "content": self.tokenizer.decode(ids[:limit]) + TRUNCATION_MARKER}

    def _batch(self, rows: list[Trajectory], device: torch.device, logprobs: bool) -> RolloutBatch:
        """The trajectories as a rollout batch: prompts left-padded, trajectories right-padded."""
        for row in rows:
            row.reward += row.session.final_reward()
        prompts, lengths = _left_pad([r.prompt for r in rows], self.pad_id, device)
        width = max(1, max(len(r.ids) for r in rows))
        n = len(rows)
        responses = torch.full((n, width), self.pad_id, dtype=torch.long)
        real = torch.zeros(n, width, dtype=torch.bool)
        policy = torch.zeros(n, width, dtype=torch.bool)
        sampled = torch.zeros(n, width, dtype=torch.float32)
        for i, row in enumerate(rows):
            k = len(row.ids)
            responses[i, :k] = torch.tensor(row.ids, dtype=torch.long)
            real[i, :k] = True
            policy[i, :k] = torch.tensor(row.from_policy, dtype=torch.bool)
            sampled[i, :k] = torch.tensor(row.logprobs, dtype=torch.float32)
        responses, real, policy, sampled = (t.to(device) for t in (responses, real, policy, sampled))
        as_long = lambda values: torch.tensor(values, dtype=torch.long, device=device)  # noqa: E731
        records = Trajectories(
            turns=as_long([r.turns for r in rows]), tool_calls=as_long([r.tool_calls for r in rows]),
            tool_errors=as_long([r.tool_errors for r in rows]),
            stop_reasons=as_long([STOP_REASONS.index(r.stop or "max_turns") for r in rows]),
            environment_rewards=torch.tensor([r.reward for r in rows], dtype=torch.float32, device=device),
            conversations=[r.conversation for r in rows], environments=[r.session.environment for r in rows],
            turn_rewards=[r.turn_rewards for r in rows] if self.config.reward_placement == "per_turn" else None,
        )  # fmt: skip
        return RolloutBatch(
            sequences=torch.cat([prompts, responses], 1),
            attention_mask=torch.cat([lengths, real.to(lengths.dtype)], 1),
            response_mask=policy,
            rollout_logprobs=sampled if logprobs else None,
            environment_mask=real & ~policy,
            trajectories=records,
        )


def _turn_sampling(sampling: SamplingConfig, max_new_tokens: int) -> SamplingConfig:
    """One turn per live trajectory: the engine's sampling settings (a plain :class:`SamplingConfig`, without the
    training-only keys such as ``filter_groups`` that check a group size) with one sample and the turn's budget."""
    fields = {f.name: getattr(sampling, f.name) for f in dataclasses.fields(SamplingConfig)}
    return SamplingConfig(**{**fields, "num_samples": 1, "max_new_tokens": max_new_tokens})


def _left_pad(rows: list[list[int]], pad_id: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """``[n, L]`` ids left-padded with ``pad_id`` and their attention mask (int64)."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, row in enumerate(rows):
        if row:
            ids[i, width - len(row) :] = torch.tensor(row, dtype=torch.long)
            mask[i, width - len(row) :] = 1
    return ids.to(device), mask.to(device)
