"""Logs to one tidy frame, per-cell rates with intervals, and the HTML report."""
