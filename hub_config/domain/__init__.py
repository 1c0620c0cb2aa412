"""What the hub knows beyond JupyterHub's own state: the stored catalog and its audit
log, usage history and reports, the idle culler's records (:mod:`.idle_records`) and its
warn -> grace -> reclaim state machine (:mod:`.idle_store`), and the hub's metrics."""
