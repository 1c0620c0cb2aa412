"""What the hub knows beyond JupyterHub's own state: the stored catalog and its audit
log, usage history and reports, the idle culler's records, and the hub's metrics."""
