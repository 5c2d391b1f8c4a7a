"""Affected versions: the probes on every release of a range (the survey), and the table it writes."""
