"""A minimal RL LightningModule that is not lit_entropy's: a user's module implementing the token-mask protocol."""

from __future__ import annotations

import torch
from lightning.pytorch import LightningModule
from torch import nn

from lit_entropy.functional import entropy_stats, policy_loss
from lit_entropy.protocol import TokenMaskContext, collect_keep_mask, required_token_mask_fields


class FreeLogitPolicy(LightningModule):
    """One free logit vector per position, shared by all rows; a clipped policy-gradient step with plain SGD.

    Reward: the share of low token ids in a row, centred over the batch (one advantage per sequence).
    With free logits THEORY §2 is exact to first order for the batch: the logits of position j move by
    ``(lr / N) * sum_rows A (e_k - p)`` (token-mean loss over N tokens).
    """

    def __init__(
        self,
        positions: int = 4,
        vocab: int = 6,
        rows: int = 256,
        lr: float = 0.02,
        scale: float = 1.0,
        dtype: torch.dtype = torch.float64,
        batches: int = 6,
    ) -> None:
        super().__init__()
        self.automatic_optimization = False
        gen = torch.Generator().manual_seed(0)
        self.logits = nn.Parameter(scale * torch.randn(positions, vocab, generator=gen, dtype=dtype))
        self.rows, self.lr, self.batches = rows, lr, batches
        self.kept: list[float] = []
        self.true_entropy: list[float] = []

    def token_mask_fields(self):
        return frozenset({"mask", "advantages", "discriminator", "policy_average", "entropy", "old_logprobs"})

    def training_step(self, batch, batch_idx):
        positions, vocab = self.logits.shape
        want_average = "policy_average" in required_token_mask_fields(self.trainer)
        with torch.no_grad():
            logits = self.logits.expand(self.rows, positions, vocab)
            tokens = torch.distributions.Categorical(logits=logits).sample()
            old = entropy_stats(logits, tokens, policy_average=want_average)
            self.true_entropy.append(float(old.entropy[0].mean()))
        reward = (tokens < vocab // 2).to(old.logprobs.dtype).mean(-1, keepdim=True)
        advantages = (reward - reward.mean()).expand(-1, positions).contiguous()
        mask = torch.ones_like(tokens, dtype=torch.bool)
        context = TokenMaskContext(
            mask=mask,
            advantages=advantages,
            discriminator=old.discriminator,
            policy_average=old.policy_average,
            entropy=old.entropy,
            old_logprobs=old.logprobs,
        )
        keep = collect_keep_mask(self.trainer, self, context)
        self.kept.append(float(keep.double().mean()))
        new = entropy_stats(self.logits.expand(self.rows, positions, vocab), tokens)
        loss, _ = policy_loss(new.logprobs, old.logprobs, advantages, keep)
        opt = self.optimizers()
        opt.zero_grad()
        self.manual_backward(loss)
        opt.step()

    def train_dataloader(self):
        return torch.utils.data.DataLoader(torch.zeros(self.batches, 1), batch_size=1)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)
