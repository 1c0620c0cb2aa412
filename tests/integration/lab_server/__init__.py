"""The lab server extension's hub proxy against a real hub (pytest-jupyter, this folder only)."""
