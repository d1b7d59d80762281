"""Research and tooling around the library, outside it (``lit_entropy`` imports nothing from here).

Run every script as a module from the repository root, ``python -m scripts.<area>.<name>``:

- ``scripts.bench``: benchmarks and exactness checks (speed, memory, weights before/after a change).
- ``scripts.docs``: generators of documentation blocks and figures.
- ``scripts.assets``: builders of the library's embedded assets (the tiny model).
- ``scripts.studies``: the studies, one package each (``scripts/studies/<name>/``), sharing one runner and one
  analysis.
"""
