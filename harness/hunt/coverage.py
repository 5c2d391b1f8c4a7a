"""The hunt's compass: which lines of vLLM's own code the server's processes ran, read back case by case.

Every process of an engine the hunt starts measures itself (in_engine/engine_site/engine_coverage.py, asked by
MMCHAOS_COVERAGE_DIR). After a case, :meth:`EngineCoverage.new_lines` asks the server's live processes to save
(it touches ``flush`` and waits for each one's ``ack.<pid>``, bounded), reads their data files and returns the lines
no case had reached before. Lines are named by their path below the ``vllm`` package, so the counts of servers that
lived one after the other add up. A server whose processes never answer (an attached server, a command of another
interpreter, an engine without coverage.py) leaves the hunt searching blind, which it says.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import psutil
from coverage import CoverageData

ENV = "MMCHAOS_COVERAGE_DIR"
ACK_TIMEOUT_S = 10.0  # a process that has not saved by then is read as it last was
# the parts of vLLM the report names: what renders media, the engine, and the routes
AREAS = {
    "multimodal/": "vllm/multimodal/",
    "v1/engine/": "vllm/v1/engine/",
    "entrypoints/ (pooling, serving, OpenAI)": "vllm/entrypoints/",
}


class EngineCoverage:
    def __init__(self, folder: Path):
        self.folder = Path(folder)  # made when a server is started with it (env)
        kept = self.folder / "startup.json"
        self.seen: set[tuple[str, int]] = set()
        # what servers ran before any case (imports, their start): no case's; kept for a re-run
        self.startup: set[tuple[str, int]] = (
            {tuple(x) for x in json.loads(kept.read_text())} if kept.exists() else set()
        )
        self.curve: list[tuple[int, int]] = []  # (case, lines the cases reached so far) after each case measured
        self._files: dict[Path, tuple[int, int, set[tuple[str, int]]]] = {}  # data file -> (mtime, size, lines)

    def env(self) -> dict[str, str]:
        self.folder.mkdir(parents=True, exist_ok=True)
        return {ENV: str(self.folder)}

    def unavailable(self) -> str | None:
        f = self.folder / "unavailable"
        return f.read_text().strip() if f.exists() else None

    def flush(self, pids: list[int]) -> list[int]:
        """Ask the processes ``pids`` to save; the pids that answered (the others are read as they last were)."""
        asked = time.time_ns()
        flush = self.folder / "flush"
        flush.touch()
        os.utime(flush, ns=(asked, asked))
        asked = flush.stat().st_mtime_ns  # as the file system keeps it (its resolution may be coarser)
        waiting = {p for p in pids if psutil.pid_exists(p)}
        answered: list[int] = []
        deadline = time.monotonic() + ACK_TIMEOUT_S
        while waiting and time.monotonic() < deadline:
            for p in list(waiting):
                try:
                    if int((self.folder / f"ack.{p}").read_text() or 0) >= asked:
                        waiting.discard(p)
                        answered.append(p)
                except (OSError, ValueError):
                    if not psutil.pid_exists(p):
                        waiting.discard(p)
            if waiting:
                time.sleep(0.02)  # polling the processes' answers
        return answered

    def lines(self) -> set[tuple[str, int]]:
        """Every line any process has saved so far (a data file unchanged since the last read is not read again)."""
        out: set[tuple[str, int]] = set()
        for f in sorted(self.folder.glob("cov.*")):
            if f.suffix in (".tmp", ".journal") or f.name.endswith(("-journal", "-wal", "-shm")):
                continue
            st = f.stat()
            cached = self._files.get(f)
            if cached is None or cached[:2] != (st.st_mtime_ns, st.st_size):
                got = _read(f)
                if got is None:  # being written as we read: read again at the next case
                    continue
                cached = (st.st_mtime_ns, st.st_size, got)
                self._files[f] = cached
            out |= cached[2]
        return out

    def started(self, pids: list[int]) -> bool:
        """A server became healthy: what it ran so far is its start's, credited to no case. Whether any of its
        processes answered (none: coverage is not measured there)."""
        if not self.flush(pids):
            return False
        now = self.lines() - self.seen
        self.startup |= now
        self.seen |= now
        (self.folder / "startup.json").write_text(json.dumps(sorted(self.startup)))  # a re-run's, too
        return True

    def new_lines(self, case: int, pids: list[int]) -> int:
        """After case ``case``: how many lines it reached that no case before it had (0 with no answer at all)."""
        if not self.flush(pids) and not self._files:
            return 0
        now = self.lines()
        new = now - self.seen
        self.seen |= now
        self.curve.append((case, len(self.seen - self.startup)))
        return len(new)

    def by_area(self) -> dict[str, dict[str, int]]:
        """Per area of vLLM: lines run by the cases (beyond what servers ran to start), and in all."""
        by_cases = self.seen - self.startup
        out = {
            area: {
                "by_cases": sum(1 for f, _ in by_cases if f.startswith(prefix)),
                "in_all": sum(1 for f, _ in self.seen if f.startswith(prefix)),
            }
            for area, prefix in AREAS.items()
        }
        out["all of vLLM"] = {"by_cases": len(by_cases), "in_all": len(self.seen)}
        return out


def _read(path: Path) -> set[tuple[str, int]] | None:
    data = CoverageData(basename=str(path))
    try:
        data.read()
        return {(_vllm_path(f), n) for f in data.measured_files() for n in (data.lines(f) or ())}
    except Exception:  # coverage.py's DataError or sqlite3's, on a file a process is writing
        return None


def _vllm_path(path: str) -> str:
    """``.../site-packages/vllm/multimodal/inputs.py`` -> ``vllm/multimodal/inputs.py``."""
    i = path.rfind("/vllm/")
    return path[i + 1 :] if i >= 0 else path
