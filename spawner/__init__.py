"""gpulab spawner package.

The policy core (``units``, ``priority``, ``model``, ``catalog``, ``ledger``,
``packer``, ``availability``, ``labels``) is plain Python with no I/O and no
tornado / kubernetes / jupyterhub imports. The spawners (``local``, ``kube``)
are thin adapters on top of it. Importing this package imports nothing heavy.
"""

__all__: list[str] = []
