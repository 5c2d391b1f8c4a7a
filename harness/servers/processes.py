"""Processes mmchaos starts: each in a process group of its own, whose id is recorded at launch, and stopped by
that id only (never by name). Free ports on loopback."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time

import psutil

LOOPBACK = "127.0.0.1"


def free_port(host: str = LOOPBACK) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_in_use(port: int, host: str = LOOPBACK) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def wait_port_free(port: int, timeout: float, host: str = LOOPBACK) -> bool:
    """Whether ``port`` became free within ``timeout`` seconds (polled: a port has no event to wait on)."""
    end = time.monotonic() + timeout
    while port_in_use(port, host):
        if time.monotonic() > end:
            return False
        time.sleep(0.25)
    return True


def group_members(pgid: int) -> list[psutil.Process]:
    """Live (non-zombie) processes of the process group ``pgid``."""
    found = []
    for p in psutil.process_iter():
        try:
            if os.getpgid(p.pid) == pgid and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except (ProcessLookupError, psutil.Error):
            continue
    return found


def signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def stop_group(
    leader: subprocess.Popen, grace: float, leader_first: bool = False, sig: int = signal.SIGTERM
) -> int | None:
    """Stop the group ``leader`` heads (its pgid is its pid: started with ``start_new_session``).

    ``sig`` (SIGTERM) goes to the leader alone when it shuts its children down in order itself (``leader_first``,
    as vLLM and nginx do), else to the whole group; SIGCONT follows (a stopped process handles it only once
    continued). Whatever of the group is still alive after ``grace`` seconds is SIGKILLed. Returns the leader's
    exit code."""
    pgid = leader.pid
    if leader_first and leader.poll() is None:
        leader.send_signal(sig)
    else:
        signal_group(pgid, sig)  # with a dead leader, its orphans get the signal directly
    signal_group(pgid, signal.SIGCONT)
    deadline = time.monotonic() + grace
    try:
        leader.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        pass
    # the leader is waited for by Popen only: a wait by psutil would reap it and lose its exit code
    _, alive = psutil.wait_procs(_others(pgid, leader), timeout=max(0.0, deadline - time.monotonic()))
    if alive or leader.poll() is None:
        signal_group(pgid, signal.SIGKILL)
        try:
            leader.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        psutil.wait_procs(_others(pgid, leader), timeout=10)
    return leader.poll()


def _others(pgid: int, leader: subprocess.Popen) -> list[psutil.Process]:
    return [p for p in group_members(pgid) if p.pid != leader.pid]
