"""The first forking study (80 steps, every method): ``python -m scripts.studies.forking``; its tables and plots in
``scripts/forking/results/``, base models in ``scripts/forking/models/``."""
