"""The Lightning glue around the algorithm: :class:`~lit_entropy.training.lifecycle.ModelLifecycle`, the base of
:class:`~lit_entropy.module.RFTModule` (loading, sharding and exporting the models, the tokenizer, the rollout
engine's attach and close), and the callbacks every run brings along (:mod:`~lit_entropy.training.bundled`).

It sits with :mod:`lit_entropy.module` above every other package: it may import any of them, none imports it.
"""

from lit_entropy.training.bundled import bundled_callbacks, missing_callbacks
from lit_entropy.training.lifecycle import ModelLifecycle

__all__ = ["ModelLifecycle", "bundled_callbacks", "missing_callbacks"]
