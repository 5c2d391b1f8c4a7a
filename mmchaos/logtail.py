"""Follow a growing log file: the complete lines appended since the last read."""

from __future__ import annotations

import os


class LogTail:
    def __init__(self, path):
        self.path = path
        self.pos = 0
        self._partial = b""

    def skip_to_end(self) -> None:
        try:
            self.pos = os.path.getsize(self.path)
        except FileNotFoundError:
            pass
        self._partial = b""

    def new_lines(self) -> list[str]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.pos)
                data = f.read()
        except FileNotFoundError:
            return []
        self.pos += len(data)
        data = self._partial + data
        *lines, self._partial = data.split(b"\n")
        return [ln.decode(errors="replace") for ln in lines]
