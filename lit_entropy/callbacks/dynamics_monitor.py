"""EntropyDynamicsMonitor: log the first-order entropy change of each update, split into its four quadrants."""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from torch import Tensor
from typing_extensions import override

from lit_entropy.callbacks.base import TokenCallback
from lit_entropy.functional.checks import check_flag
from lit_entropy.functional.entropy import predicted_entropy_change
from lit_entropy.functional.registry import POLICY_LOSSES, policy_loss_attribute
from lit_entropy.protocol import TokenMaskContext

__all__ = ["QUADRANTS", "EntropyDynamicsMonitor", "quadrant_sums"]

#: Quadrant names: sign of the advantage x sign of the centred discriminator D_c = S - E_p[S].
#: THEORY §2: (A>0, D>0) and (A<0, D<0) lower the entropy, the other two raise it.
QUADRANTS = ("a_pos_d_pos", "a_pos_d_neg", "a_neg_d_pos", "a_neg_d_neg")


def quadrant_sums(
    discriminator: Tensor, policy_average: Tensor, advantages: Tensor, mask: Tensor
) -> tuple[Tensor, Tensor]:
    """Sum of the per-token first-order entropy change ``-A * (S - E_p[S])`` over each quadrant.

    Args:
        discriminator: ``S`` per token, ``[B, T]``.
        policy_average: ``E_p[S]`` per token, ``[B, T]``.
        advantages: ``A`` per token, ``[B, T]``.
        mask: bool ``[B, T]``, the tokens that carry a gradient.

    Returns:
        ``(sums, counts)``: float64 ``[4]`` each, in :data:`QUADRANTS` order. Tokens with ``A == 0``
        or ``D_c == 0`` contribute nothing to the change and are in no quadrant.
    """
    s, avg = discriminator.detach().to(torch.float64), policy_average.detach().to(torch.float64)
    change = predicted_entropy_change(s, avg, advantages.to(torch.float64))
    centred = s - avg
    pos, neg = advantages > 0, advantages < 0
    up, down = centred > 0, centred < 0
    zero = torch.zeros((), dtype=torch.float64, device=change.device)
    sums, counts = [], []
    for a_side, d_side in ((pos, up), (pos, down), (neg, up), (neg, down)):
        selected = mask & a_side & d_side
        sums.append(torch.where(selected, change, zero).sum())
        counts.append(selected.sum().to(torch.float64))
    return torch.stack(sums), torch.stack(counts)


class EntropyDynamicsMonitor(TokenCallback):
    """Per rollout batch: predicted entropy change by quadrant, and the realised change one batch later.

    A :class:`~lit_entropy.protocol.TokenMaskObserver`: it sees each rollout batch together with the
    final keep mask (the AND of every provider's mask) and changes nothing. Works with any module
    implementing the protocol.

    **What "predicted" means.** THEORY §2: a policy-gradient step that moves the logits of a position
    by ``alpha (e_k - p)``, ``alpha = eta * r * A``, changes its entropy by ``-alpha (S_k - E_p[S])``
    to first order. The monitor logs ``sum of -A * (S_k - E_p[S])`` (``r = 1``, on-policy) over the
    tokens that stay in the loss, split by the sign of ``A`` and of ``D_c = S_k - E_p[S]``. Units: nats per unit step
    size in logit space; it is proportional to the entropy change the update would cause if every
    position's logits were free parameters. It ignores the coupling of positions through shared
    weights, the loss normalisation, the optimizer (Adam rescales) and the PPO clip (no token is
    clipped at the first on-policy update), so compare *signs and relative sizes*, not magnitudes.

    **Which losses it covers.** The formula needs each loss token's on-policy gradient to be
    ``A_t grad log pi_t`` (times its aggregation weight). That holds for every policy loss registered with
    ``first_order_entropy=True``: ``ppo``, ``cispo`` (weight 1 at ratio 1), ``gspo`` / ``gspo_token`` / ``gmpo``
    (sequence ratio 1; a token the keep mask drops gets no gradient, see
    :mod:`lit_entropy.functional.losses.sequence`). At ``setup`` the monitor reads the module's
    ``settings.loss.policy_loss`` and warns when the loss is not one of them (``covers_loss`` is then False).
    Statistics are over the global batch (all-reduced); ``entropy``, ``s_mean`` and ``centred_s_mean``
    cover every response token, masked or not.

    **Realised.** At the next rollout batch the monitor logs ``realised = H_now - H_prev`` (the global
    mean token entropy of the rollout batches, each under its own rollout policy; different prompts,
    so it is a noisy measure), ``sign_match`` (1 when ``sign(realised) == sign(predicted_prev)``) and
    ``agreement``, the running fraction of matches.

    Logged under ``log_prefix``: ``/predicted``, ``/predicted_<quadrant>`` (4), ``/entropy``,
    ``/s_mean``, ``/centred_s_mean`` and, from the second batch on, ``/realised``, ``/sign_match``,
    ``/agreement``.

    Args:
        log_prefix: prefix of the logged names.
        keep_history: also keep every batch's metrics in ``self.history`` (a list of dicts).
    """

    required_fields = frozenset({"mask", "advantages", "discriminator", "policy_average", "entropy"})

    def __init__(self, log_prefix: str = "train/dynamics", keep_history: bool = False) -> None:
        super().__init__(log_prefix)
        self.keep_history = check_flag("keep_history", keep_history)
        self.history: list[dict[str, float]] = []
        self.num_compared = 0
        self.num_agree = 0
        self.prev_entropy: float | None = None
        self.prev_predicted: float | None = None
        self.covers_loss: bool | None = None  # set at setup from the module's policy loss (None: unknown)

    @override
    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        name = getattr(getattr(getattr(pl_module, "settings", None), "loss", None), "policy_loss", None)
        if not isinstance(name, str):
            return
        self.covers_loss = name in POLICY_LOSSES and policy_loss_attribute(name, "first_order_entropy")
        if not self.covers_loss:
            covered = tuple(n for n in POLICY_LOSSES.names() if policy_loss_attribute(n, "first_order_entropy"))
            rank_zero_warn(
                f"EntropyDynamicsMonitor: model.loss.policy_loss={name!r} was not registered with "
                f"first_order_entropy=True, so {self.tag('predicted')} (which assumes each loss token's on-policy "
                f"gradient is A grad log pi, true for {covered}) may not describe its updates"
            )

    def observe_keep_mask(self, trainer: Any, pl_module: Any, context: TokenMaskContext, keep: Tensor) -> None:
        """:class:`~lit_entropy.protocol.TokenMaskObserver`: predict over the tokens that stay in the loss."""
        self.log_metrics(pl_module, self.observe(context, keep))

    def observe(self, context: TokenMaskContext, keep: Tensor | None = None) -> dict[str, float]:
        """Update the state from one rollout batch; returns the metrics (also kept when ``keep_history``).

        ``keep`` (default ``context.mask``) are the tokens that carry a gradient: the prediction sums
        over them, while the entropy statistics cover every response token. Call on every rank.
        """
        mask = context.mask
        keep = mask if keep is None else keep & mask
        sums, _ = quadrant_sums(
            context.require("discriminator"), context.require("policy_average"), context.require("advantages"), keep
        )
        zero = torch.zeros((), dtype=torch.float64, device=mask.device)
        s = context.require("discriminator").detach().to(torch.float64)
        centred = s - context.require("policy_average").detach().to(torch.float64)
        self.count_tokens(mask)
        self.count("entropy_sum", torch.where(mask, context.require("entropy").detach().to(torch.float64), zero).sum())
        self.count("s_sum", torch.where(mask, s, zero).sum())
        self.count("centred_s_sum", torch.where(mask, centred, zero).sum())
        for quadrant, value in zip(QUADRANTS, sums, strict=True):
            self.count(f"predicted_{quadrant}", value)
        c = self.reduce_counts()
        entropy = self.share(c["entropy_sum"], c["tokens"])
        quadrants = {self.tag(f"predicted_{q}"): c[f"predicted_{q}"] for q in QUADRANTS}
        predicted = sum(quadrants.values())
        metrics = {
            self.tag("predicted"): predicted,
            **quadrants,
            self.tag("entropy"): entropy,
            self.tag("s_mean"): self.share(c["s_sum"], c["tokens"]),
            self.tag("centred_s_mean"): self.share(c["centred_s_sum"], c["tokens"]),
        }
        if self.prev_entropy is not None and self.prev_predicted is not None:
            realised = entropy - self.prev_entropy
            match = float((realised > 0) == (self.prev_predicted > 0) and realised != 0)
            self.num_compared += 1
            self.num_agree += int(match)
            metrics[self.tag("realised")] = realised
            metrics[self.tag("sign_match")] = match
            metrics[self.tag("agreement")] = self.num_agree / self.num_compared
        self.prev_entropy, self.prev_predicted = entropy, predicted
        if self.keep_history:
            self.history.append(dict(metrics))
        return metrics

    @override
    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "num_compared": self.num_compared,
            "num_agree": self.num_agree,
            "prev_entropy": self.prev_entropy,
            "prev_predicted": self.prev_predicted,
        }

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        self.num_compared = int(state_dict["num_compared"])
        self.num_agree = int(state_dict["num_agree"])
        self.prev_entropy = state_dict["prev_entropy"]
        self.prev_predicted = state_dict["prev_predicted"]
