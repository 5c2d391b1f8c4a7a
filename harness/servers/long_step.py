"""A long subprocess step (an engine install, the model build) that people can follow: its output goes to a log
file, the lines it marks as steps are shown as they come, and a heartbeat line says it is still going at least
every ``HEARTBEAT_S`` seconds, with the log's last line."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path

HEARTBEAT_S = 15.0
STEP_PREFIX = "step "  # lines a step prints to be shown (e.g. "step 2/5: weights")


def _last_line(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, path.stat().st_size - 2048))
            lines = [ln.strip() for ln in f.read().decode(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1][:120] if lines else ""


def run(
    cmd: list, log_path: Path, what: str, say: Callable[[str], None], timeout: float, env: dict | None = None
) -> int:
    """Run ``cmd`` with stdout and stderr appended to ``log_path``; returns its exit code (-9 after ``timeout``)."""
    with open(log_path, "ab") as log:
        log.write(f"$ {' '.join(map(str, cmd))}\n".encode())
        log.flush()
        start = log.tell()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    t0 = last_beat = time.monotonic()
    shown = start
    while True:
        try:
            code = proc.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            code = None
        shown = _show_steps(log_path, shown, say)
        now = time.monotonic()
        if code is not None:
            return code
        if now - t0 > timeout:
            proc.kill()
            proc.wait()
            return -9
        if now - last_beat >= HEARTBEAT_S:
            last_beat = now
            say(f"  … {what}: {now - t0:.0f} s" + (f" ({_last_line(log_path)})" if _last_line(log_path) else ""))


def _show_steps(log_path: Path, pos: int, say) -> int:
    with open(log_path, "rb") as f:
        f.seek(pos)
        data = f.read()
    complete = data[: data.rfind(b"\n") + 1]
    for line in complete.decode(errors="replace").splitlines():
        if line.startswith(STEP_PREFIX):
            say(f"  {line}")
    return pos + len(complete)
