"""The real control plane of ``bed/`` (markers ``integration``, ``kube``)."""
