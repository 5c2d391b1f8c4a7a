"""From a crash to a bug report: the deterministic probes, the standalone reproducer script, the minimizer's
search on fresh servers, the report it hands out."""
