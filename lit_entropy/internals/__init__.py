"""The only place that touches private state of the frameworks lit_entropy builds on.

Every use of a private attribute, hook or checkpoint key of Lightning, torchmetrics, TensorBoard,
transformers, vLLM or jsonargparse sits in one small adapter here, and ``tests/internals/`` pins each one
against the installed versions: an upgrade that changes one of them breaks one named test with a clear
message instead of a run. The rest of the package uses the public API, or these adapters
(``tests/internals/test_private_access.py`` enforces it).

- :mod:`~lit_entropy.internals.lightning`: the trainer a module is attached to, the logging step,
  loader states to restore, SLURM (HPC) checkpoint paths, the cluster environment, ModelCheckpoint's
  last saved step, a ModelParallelStrategy's data-parallel size, callback state keys.
- :mod:`~lit_entropy.internals.torchmetrics`: metrics that log per step after ``update`` and keep float64
  accumulators under module casts (torchmetrics' private hooks).
- :mod:`~lit_entropy.internals.tensorboard`: the writer of a TensorBoard logger's event file.
- :mod:`~lit_entropy.internals.transformers`: decoder-layer classes and the FSDP2 mark ``generate`` reads.
- :mod:`~lit_entropy.internals.vllm`: detaching an engine client's finaliser.
- :mod:`~lit_entropy.internals.cli`: the settings a jsonargparse parser accepts with their types, and the
  parser LightningCLI built for a subcommand (for the one-line settings errors).
- :mod:`~lit_entropy.internals.threads`: another thread's Python stack (``sys._current_frames``), for the error
  of a hung rollout worker.
- :mod:`~lit_entropy.internals.noise`: Lightning's info lines and warnings that say nothing to a user (its
  rank-zero logger names, message texts), silenced on ``import lit_entropy``.
"""
