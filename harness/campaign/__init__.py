"""Campaigns: the plan read from TOML, the runner of its trials (Locust's master and workers), progress,
provenance."""
