"""Notebook jobs in the hub: records, the state machine and admission, and the backends.

- :mod:`.models`: the ``gpulab_jobs`` table (SQLAlchemy, on gpulab's own database);
- :mod:`.service`: create / list / cancel / re-run, admission by the shared ledger;
- :mod:`.homes`: the users' homes, read as their owners or by the hub (chosen once);
- :mod:`.backends`: where jobs run (single server or Kubernetes);
- :mod:`.runner`: the process that runs one notebook (papermill), as the job's owner.
"""
