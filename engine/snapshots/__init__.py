"""Versions of a dataset: snapshots, their schedules and retention, archives, the datasets view."""
