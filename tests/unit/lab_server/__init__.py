"""The lab server extension in a real jupyter_server, in process (pytest-jupyter, this folder only)."""
