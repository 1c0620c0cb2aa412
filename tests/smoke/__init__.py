"""The benchmarks in their small mode (each test's own markers)."""
