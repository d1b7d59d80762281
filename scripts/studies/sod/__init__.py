"""The sum-or-difference studies (issue 24 C, its Clip_V amendment, issue 39 E): ``python -m scripts.studies.sod
--experiment {sod,sod_clipv,sod_robust}``; designs in ``design.py``, results in
``scripts/forking/experiments/<experiment>/runs.parquet``."""
