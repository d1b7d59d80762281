"""Entropy-dynamics implementation checks: ``python -m scripts.studies.dynamics``; report in
``scripts/dynamics_report/``."""
