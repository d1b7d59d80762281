"""A seeded, distributed-aware prompt sampler and a DataLoader that resume mid-epoch.

Lightning 2.x saves the state of a training dataloader with the fit loop only when the *dataloader object*
has ``state_dict`` / ``load_state_dict`` (``lightning.pytorch.utilities.combined_loader``); a plain
``DataLoader`` restarts its epoch from the first batch after a resume. :class:`ResumableDataLoader` counts
the batches it has handed out in the current epoch, and :class:`ResumableDistributedSampler` skips them on
the next iteration, so a resumed run sees exactly the batches an uninterrupted run would have seen.

The sampler subclasses ``DistributedSampler`` so Lightning keeps it as is (it only injects its own
sampler when the loader's sampler is not a ``DistributedSampler``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from torch.utils.data import DataLoader, Dataset, DistributedSampler

__all__ = ["ResumableDataLoader", "ResumableDistributedSampler"]


class ResumableDistributedSampler(DistributedSampler):
    """Rank ``rank``'s share of a seeded permutation of the dataset; can start mid-epoch.

    As ``DistributedSampler``: epoch ``e`` permutes ``range(len(dataset))`` with ``seed + e`` (or keeps file
    order when ``shuffle`` is False) and rank ``r`` takes every ``num_replicas``-th index from ``r``. The
    first ``k`` indices of all ranks together are the first ``num_replicas * k`` of the permutation, so a
    single process with a ``num_replicas`` times larger batch sees the same prompts per step.

    Unlike ``DistributedSampler``, iterating without :meth:`set_epoch` moves on to the next epoch's order
    (a plain loop over the loader reshuffles each pass).

    Args:
        dataset: map-style dataset.
        num_replicas: data-parallel world size.
        rank: data-parallel rank in ``[0, num_replicas)``.
        shuffle: permute each epoch.
        seed: base seed of the permutation.
        drop_last: drop the tail that does not divide evenly over ranks (else pad by repeating).
    """

    def __init__(
        self,
        dataset: Dataset,
        num_replicas: int = 1,
        rank: int = 0,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
    ) -> None:
        if isinstance(num_replicas, bool) or not isinstance(num_replicas, int) or num_replicas < 1:
            raise ValueError(f"num_replicas must be a positive int, got {num_replicas!r}")
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < num_replicas:
            raise ValueError(f"rank must be an int in [0, {num_replicas}), got {rank!r}")
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed, drop_last=drop_last)
        self.start = 0  # indices of this rank's epoch to skip on the next iteration
        self._fresh = True  # the next iteration uses ``self.epoch`` as is (else the one after it)

    def set_epoch(self, epoch: int) -> None:
        super().set_epoch(epoch)
        self._fresh = True

    def upcoming_epoch(self) -> int:
        """The epoch the next iteration will use."""
        return self.epoch if self._fresh else self.epoch + 1

    def __iter__(self) -> Iterator[int]:
        # Without an explicit set_epoch each pass is a new epoch (DataLoader(shuffle=True) behaviour).
        self.epoch = self.upcoming_epoch()
        self._fresh = False
        start, self.start = self.start, 0
        return iter(list(super().__iter__())[start:])


class ResumableDataLoader(DataLoader):
    """A ``DataLoader`` over a :class:`ResumableDistributedSampler` whose position Lightning checkpoints.

    ``state_dict`` holds the epoch of the iteration in progress and the number of batches this rank has
    consumed in it. Lightning does not prefetch from loaders with a length, so when a checkpoint is written
    after batch ``k`` exactly ``k`` batches have left the iterator. Pass a ``generator`` so creating the
    iterator (worker base seed) draws from it instead of the global RNG, which a resume restores.
    """

    def __init__(self, dataset: Dataset, *args: Any, **kwargs: Any) -> None:
        super().__init__(dataset, *args, **kwargs)
        if not isinstance(self.sampler, ResumableDistributedSampler):
            raise ValueError(
                f"ResumableDataLoader needs sampler=ResumableDistributedSampler(...), got {type(self.sampler).__name__}"
            )
        self._epoch: int | None = None  # epoch of the iteration in progress
        self._consumed = 0  # batches handed out in it
        self._resume: dict[str, int] | None = None

    # A generator instead of DataLoader's iterator object: callers only iterate it (Lightning, for loops).
    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        # A generator: the body runs at the first ``next``, after Lightning's ``set_sampler_epoch``.
        sampler: ResumableDistributedSampler = self.sampler  # type: ignore[assignment]
        epoch = sampler.upcoming_epoch()
        skip = 0
        if self._resume is not None:
            if self._resume["epoch"] == epoch:
                skip = self._resume["batches"]
            self._resume = None
        sampler.start = skip * self._per_step()
        self._epoch, self._consumed = epoch, skip
        for batch in super().__iter__():
            self._consumed += 1
            yield batch

    def _per_step(self) -> int:
        if self.batch_size is None:
            raise ValueError("ResumableDataLoader needs an integer batch_size, got None")
        return int(self.batch_size)

    def state_dict(self) -> dict[str, int]:
        """Position: ``epoch``, ``batches`` consumed by this rank, and the layout they count in."""
        sampler: ResumableDistributedSampler = self.sampler  # type: ignore[assignment]
        return {
            "epoch": -1 if self._epoch is None else self._epoch,
            "batches": self._consumed,
            "batch_size": self._per_step(),
            "num_replicas": sampler.num_replicas,
        }

    def load_state_dict(self, state_dict: dict[str, int]) -> None:
        """Skip the consumed batches when the same epoch is iterated next.

        After a change of world size or batch size the global number of consumed prompts is kept (the
        first ``n`` prompts of the permutation are the same whatever the layout); a remainder that is not a
        whole batch of the new layout is dropped with a warning.
        """
        sampler: ResumableDistributedSampler = self.sampler  # type: ignore[assignment]
        consumed = int(state_dict["batches"]) * int(state_dict["batch_size"]) * int(state_dict["num_replicas"])
        per_step = self._per_step() * sampler.num_replicas
        if consumed % per_step:
            rank_zero_warn(
                f"resuming with batch_size={self._per_step()} x {sampler.num_replicas} ranks after "
                f"{consumed} prompts of the epoch: the last {consumed % per_step} of them are seen again"
            )
        self._resume = {"epoch": int(state_dict["epoch"]), "batches": consumed // per_step}
