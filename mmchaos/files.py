"""Writing files so that a reader sees the old version or the new one, never half of one."""

from __future__ import annotations

import json
import os
from pathlib import Path


def write_json_atomic(path: Path | str, data: dict) -> None:
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True, default=str))
    os.replace(tmp, path)


def write_files_atomic(folder: Path, files: dict[str, bytes]) -> list[Path]:
    """Write every file under a temporary name first, then rename them all: a failure (OSError) leaves the
    folder as it was, never some files new and some half-written."""
    folder.mkdir(parents=True, exist_ok=True)
    tmps = []
    try:
        for name, data in files.items():
            tmp = folder / f".{name}.tmp-{os.getpid()}"
            tmp.write_bytes(data)
            tmps.append((tmp, folder / name))
        for tmp, final in tmps:
            os.replace(tmp, final)
    except OSError:
        for tmp, _ in tmps:
            tmp.unlink(missing_ok=True)
        raise
    return [final for _, final in tmps]
