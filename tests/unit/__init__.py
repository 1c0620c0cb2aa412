"""The fast tier: no hub, lab, browser or cluster (tests/conftest.py gives no marker)."""
