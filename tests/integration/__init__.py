"""Real hubs, proxies, labs, Prometheus and system accounts (marker ``integration``)."""
