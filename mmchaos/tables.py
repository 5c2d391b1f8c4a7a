"""Write and read the tables of schema.py as folders of small Parquet parts.

A writer appends rows in memory and flushes them as a new part every ``interval`` seconds, each written to a
temp name and renamed, so whatever dies (server, Locust, a worker) leaves only complete, readable parts and
loses at most one interval of rows.
"""

from __future__ import annotations

import json
import os
import socket
import threading
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from mmchaos import schema


def table_dir(trial_dir: Path | str, table: str) -> Path:
    return Path(trial_dir) / schema.TABLE_DIRS[table]


def process_tag() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class PartWriter:
    """Append rows (dicts) and flush them as parquet parts under ``folder``. Thread- and greenlet-safe."""

    def __init__(self, folder: Path | str, table_schema: pa.Schema, tag: str | None = None):
        self.folder = Path(folder)
        self.schema = table_schema
        self.tag = tag or process_tag()
        self._rows: list[dict] = []
        self._n = 0
        self.rows_written = 0
        self._swap = threading.Lock()  # guards the row list: held only to append or swap it
        self._write = threading.Lock()  # one flush at a time, so part numbers stay in order

    def add(self, row: dict) -> None:
        with self._swap:
            self._rows.append(row)

    def flush(self) -> int:
        with self._write:
            with self._swap:
                rows, self._rows = self._rows, []
            if not rows:
                return 0
            self.folder.mkdir(parents=True, exist_ok=True)
            name = f"part-{self.tag}-{self._n:06d}.parquet"
            self._n += 1
            tmp = self.folder / f".{name}.tmp"
            pq.write_table(schema.table_from_rows(rows, self.schema), tmp)
            os.replace(tmp, self.folder / name)
            self.rows_written += len(rows)
            return len(rows)

    @property
    def pending(self) -> int:
        return len(self._rows)


def read_table(trial_dir: Path | str, table: str) -> pa.Table:
    """All parts of one table of one trial (an empty table of the right schema when there are none)."""
    folder = table_dir(trial_dir, table)
    parts = sorted(folder.glob("part-*.parquet")) if folder.is_dir() else []
    if not parts:
        return schema.TABLES[table].empty_table()
    return pa.concat_tables(pq.read_table(p, schema=schema.TABLES[table]) for p in parts)


def write_json_atomic(path: Path | str, data: dict) -> None:
    """Write JSON so that readers see the old file or the new one, never half of one."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True, default=str))
    os.replace(tmp, path)
