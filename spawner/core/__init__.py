"""The policy core: pure decisions, no I/O, no framework.

Every module here imports only ``spawner.core`` and the standard library (plus PyYAML
and nothing else to read catalog text); ``scripts/import_rules.py`` holds that by path,
mypy checks this folder strictly, and ``tests/unit/test_core_purity.py`` imports it all
in a clean interpreter. Read first: :mod:`.policy` (what a user may start, and why not)
and :mod:`.ledger` (who holds what; admission checked and recorded in one step).

- units, priority, model: milli-GPUs and durations, priority classes, ``Profile``/``Team``
- catalog/: the one validator of teams, profiles, sharing, inventory and prices
- ledger, policy: admission and the choices offered
- sharing, labels, env: a share as pod resources, pod labels, a server's environment
- packer, fragmentation: single-server device placement
- idle: the cull decision and the warning rules both the culler and the hub apply
- jobspec: notebook jobs (classes, states, validation, the Kubernetes Job manifest)
- whatif, advisor: offline replay and profile sizing
- form, progress, scheduling: the sentences and HTML users read
"""
