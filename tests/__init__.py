"""gpulab's tests, by tier folder; helpers in :mod:`tests.support` (see CONTRIBUTING.md)."""
