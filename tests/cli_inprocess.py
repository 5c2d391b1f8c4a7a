"""The `mmchaos` command run in this process, for tests of what it says and exits with on bad input: main() as the
console script calls it, its stdout and stderr captured, its exit code returned as a process's would be."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess

from mmchaos.harness import cli


def mmchaos(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """``env``: entries set (None: removed) for the call only."""
    out, err = io.StringIO(), io.StringIO()
    saved = dict(os.environ)
    for k, v in (env or {}).items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = cli.main(list(args))
            except SystemExit as e:  # argparse's own exit (usage errors, --help)
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return subprocess.CompletedProcess(["mmchaos", *args], code, out.getvalue(), err.getvalue())
