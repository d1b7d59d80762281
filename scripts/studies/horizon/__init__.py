"""The horizon and short-execution forking studies (issue 24 A, B): ``python -m scripts.studies.horizon
--experiment {horizon,short}``; results in ``scripts/forking/experiments/<experiment>/runs.parquet``."""
