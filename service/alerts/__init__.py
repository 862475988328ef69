"""Alerts: what changed at a commit against its baseline (detect.py), whether a timing moved
(timing.py, the one replaceable decision), and posting them to a project's hooks (delivery.py)."""
