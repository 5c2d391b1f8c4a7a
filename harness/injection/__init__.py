"""Faults injected into a server mmchaos runs: a fault proxy in front of it (network faults), the injector that
fires a campaign's ``[[fault]]`` tables (signals to its processes, the proxy's faults, operator calls to its dev-mode
routes) and a loopback control through which the web UI and ``mmchaos serve`` fire them by hand. What a fault is
and what a server can take are ``mmchaos.faults``'s."""
