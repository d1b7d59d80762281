"""Lightning callbacks of lit_entropy."""

from lit_entropy.callbacks.entropy_clipping import EntropyDiscriminatorClipping

__all__ = ["EntropyDiscriminatorClipping"]
