"""The `mmchaos` commands, one module each: ``add_parser(subparsers)`` defines the command's arguments and sets
``func=run``; ``run(args) -> int`` is its exit code. A failure the user can act on is an
:class:`mmchaos.errors.MmchaosError`, which `harness/cli.py` alone turns into one line and an exit code."""
