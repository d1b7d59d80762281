"""The studies: one package per study under ``scripts/studies/<name>/``, run as ``python -m scripts.studies.<name>``,
and what they share (the study statistics)."""
