"""Notebook jobs in the hub: records, the state machine and admission, and two backends.

- :mod:`.models`: the ``gpulab_jobs`` table (SQLAlchemy, on gpulab's own database);
- :mod:`.service`: submit / list / cancel / re-run, admission by the shared ledger;
- :mod:`.local`: the single-server backend (papermill processes on the packer's GPUs);
- :mod:`.kube`: the Kubernetes backend (one ``batch/v1`` Job per submission).
"""
