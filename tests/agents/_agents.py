"""Shared pieces of the multi-turn tests: a char tokenizer with a chat template, environments, a scripted engine."""

from __future__ import annotations

import torch

from lit_entropy.data.char_tokenizer import build_char_tokenizer
from lit_entropy.rollout import RolloutBatch, RolloutEngine, response_mask_from_ids

#: Characters of the tool-call JSON, the template's role names and the environments' messages (no whitespace: the
#: char tokenizer refuses it).
CHAT_ALPHABET = "0123456789+-*=abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ<>/{}[]\":,._|()?!'"

#: ChatML-like, with the tokenizer's <eos> closing a reply and "|" between messages.
CHAT_TEMPLATE = (
    "{%- for m in messages -%}{{ m['role'] }}:{{ m['content'] }}{% if m['role'] == 'assistant' %}<eos>{% endif %}|"
    "{%- endfor -%}{%- if add_generation_prompt -%}assistant:{%- endif -%}"
)

#: As CHAT_TEMPLATE, but an earlier reply loses its <think> block once a user message follows (Qwen3's rule).
REWRITING_TEMPLATE = (
    "{%- set ns = namespace(last=-1) -%}{%- for m in messages -%}{%- if m['role'] == 'user' -%}"
    "{%- set ns.last = loop.index0 -%}{%- endif -%}{%- endfor -%}"
    "{%- for m in messages -%}{%- set c = m['content'] -%}"
    "{%- if m['role'] == 'assistant' and loop.index0 < ns.last and '</think>' in c -%}"
    "{%- set c = c.split('</think>')[-1] -%}{%- endif -%}"
    "{{ m['role'] }}:{{ c }}{% if m['role'] == 'assistant' %}<eos>{% endif %}|"
    "{%- endfor -%}{%- if add_generation_prompt -%}assistant:{%- endif -%}"
)


def chat_tokenizer(template: str | None = CHAT_TEMPLATE):
    tokenizer = build_char_tokenizer(CHAT_ALPHABET, model_max_length=512)
    tokenizer.chat_template = template
    return tokenizer


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first.
        b: the second.
    """
    return a + b


class Calculator:
    """A tool environment (TRL's duck type): ``reset(**row)``, public methods are tools, ``get_reward()``."""

    def __init__(self, bonus: float = 1.0) -> None:
        self.bonus = bonus
        self.used = 0

    def reset(self, **row):
        self.answer = row["answer"]
        return None

    def multiply(self, a: int, b: int) -> int:
        """Multiply two integers.

        Args:
            a: the first.
            b: the second.
        """
        self.used += 1
        return a * b

    def get_reward(self) -> float:
        return self.bonus * min(self.used, 1)


class Greeter(Calculator):
    """A tool environment whose reset returns a first message."""

    def reset(self, **row):
        super().reset(**row)
        return "hi"


class Guess:
    """A text environment (gym-like): higher/lower feedback on a secret number, done when guessed."""

    def reset(self, row):
        self.secret = int(row["answer"])
        return None

    def step(self, text):
        try:
            guess = int(text.strip("<>|") or -1)
        except ValueError:
            return "NaN", -0.1, False
        if guess == self.secret:
            return "", 1.0, True
        return ("higher" if guess < self.secret else "lower"), -0.1, False


class ScriptedEngine(RolloutEngine):
    """Returns the given replies (text, in order per call and row) as sampled ids, with made-up log-probs; records
    every call's contexts so tests can check what the engine saw."""

    reports_logprobs = True

    def __init__(self, tokenizer, turns: list[list[str]]) -> None:
        self.tokenizer, self.turns, self.calls = tokenizer, list(turns), []

    def generate(self, policy, input_ids, attention_mask, sampling):
        replies = self.turns.pop(0)
        assert len(replies) == input_ids.shape[0] and sampling.num_samples == 1
        self.calls.append([row[m.bool()].tolist() for row, m in zip(input_ids, attention_mask, strict=True)])
        ids = [self.tokenizer(r, add_special_tokens=False)["input_ids"][: sampling.max_new_tokens] for r in replies]
        width = max(1, max(len(i) for i in ids))
        responses = torch.full((len(ids), width), self.tokenizer.pad_token_id, dtype=torch.long)
        for row, i in enumerate(ids):
            responses[row, : len(i)] = torch.tensor(i, dtype=torch.long)
        mask = response_mask_from_ids(responses, self.tokenizer.eos_token_id)
        mask &= torch.arange(width) < torch.tensor([len(i) for i in ids]).unsqueeze(-1)
        logprobs = (-0.5 - torch.arange(width, dtype=torch.float32)).expand(len(ids), -1).masked_fill(~mask, 0.0)
        sequences = torch.cat([input_ids, responses], 1)
        return RolloutBatch(sequences, torch.cat([attention_mask, mask.long()], 1), mask, logprobs)
