"""The mmchaos plugin for Locust, beside the locustfiles users run (embeddings.py, probes.py, replay.py): its
listeners on Locust's events (listeners.py), the users' base, the recorder, the watchers, the live panel and the web
UI, the open-loop pacer and the shapes."""
