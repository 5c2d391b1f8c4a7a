"""Write and read the tables of schema.py as folders of small Parquet parts.

A writer appends rows in memory and flushes them as a new part every ``interval`` seconds, each written to a
temp name and renamed, so whatever dies (server, Locust, a worker) leaves only complete, readable parts and
loses at most one interval of rows. A part's name is unique to its writer and never reused, so a part written
twice (a Locust worker's part sent again to its master, locustfiles/plugin/shipping.py) is still one part.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import socket
import threading
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from mmchaos import schema


def table_dir(trial_dir: Path | str, table: str) -> Path:
    return Path(trial_dir) / schema.TABLE_DIRS[table]


def process_tag() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


COMPRESSION = "zstd"  # a third smaller than Parquet's default (snappy) on rows and traces, as fast to read


class PartWriter:
    """Append rows (dicts) and flush them as parquet parts under ``folder``, or hand each part (name, bytes, row
    count) to ``sink`` instead: a Locust worker ships them to its master. Thread- and greenlet-safe."""

    def __init__(
        self,
        folder: Path | str | None,
        table_schema: pa.Schema,
        tag: str | None = None,
        sink: Callable[[str, bytes, int], None] | None = None,
    ):
        self.folder = Path(folder) if folder is not None else None
        if sink is None:
            if self.folder is None:
                raise ValueError("a PartWriter needs a folder or a sink")
            sink = partial(_put_into, self.folder)
        self.sink = sink
        self.schema = table_schema
        # a token per writer: two writers of one process (two runs from the web UI) never reuse a part name
        self.tag = f"{tag or process_tag()}-{secrets.token_hex(3)}"
        self._rows: list[dict] = []
        self._n = 0
        self.rows_written = 0
        self._swap = threading.Lock()  # guards the row list: held only to append or swap it
        self._write = threading.Lock()  # one flush at a time, so part numbers stay in order

    def add(self, row: dict) -> None:
        with self._swap:
            self._rows.append(row)

    def flush(self, pause: Callable[[], None] | None = None) -> int:
        """Write the rows so far as one part. ``pause``, called between slices of SLICE rows (each a row group),
        lets a greenlet writing in the load's own thread give way: a second of rows at 1,000 req/s built and
        encoded in one go held every request for ~5 ms (bench/peers.py). If the writer is interrupted in a pause
        (its greenlet killed), its rows go back to be written by the next flush."""
        with self._write:
            with self._swap:
                rows, self._rows = self._rows, []
            if not rows:
                return 0
            try:
                data = encode_rows(rows, self.schema, pause)
            except BaseException:
                with self._swap:
                    self._rows[:0] = rows
                raise
            name = f"part-{self.tag}-{self._n:06d}.parquet"
            self._n += 1
            self.sink(name, data, len(rows))
            self.rows_written += len(rows)
            return len(rows)

    @property
    def pending(self) -> int:
        return len(self._rows)


PART_GLOB = "part-*.parquet"  # temp files start with "." and never match
PART_NAME = re.compile(r"part-[A-Za-z0-9_.-]{1,160}\.parquet")  # what a writer names a part (no path in it)
COMPACT = "compact.parquet"
_SOURCES = b"mmchaos_sources"  # compact.parquet's metadata: the part names it holds


def encode_part(table: pa.Table) -> bytes:
    """A part as the bytes of its Parquet file (what is written, or shipped)."""
    out = pa.BufferOutputStream()
    pq.write_table(table, out, compression=COMPRESSION)
    return out.getvalue().to_pybytes()


SLICE = 250  # rows per row group of a part written with pauses


def encode_rows(rows: list[dict], table_schema: pa.Schema, pause: Callable[[], None] | None = None) -> bytes:
    """Rows as a part's bytes; with ``pause``, built and written a slice (a row group) at a time, ``pause()``
    between slices."""
    if pause is None:
        return encode_part(schema.table_from_rows(rows, table_schema))
    out = pa.BufferOutputStream()
    with pq.ParquetWriter(out, table_schema, compression=COMPRESSION) as w:
        for i in range(0, len(rows), SLICE):
            if i:
                pause()
            w.write_table(schema.table_from_rows(rows[i : i + SLICE], table_schema))
    return out.getvalue().to_pybytes()


def part_problem(data: bytes, table_schema: pa.Schema) -> str | None:
    """Why ``data`` is not a part of a table of ``table_schema`` (its columns), or None."""
    try:
        names = pq.read_schema(pa.BufferReader(data)).names
    except (pa.ArrowException, OSError, ValueError) as e:
        return f"not a Parquet file ({(str(e).splitlines() or [type(e).__name__])[0][:120]})"
    return None if names == table_schema.names else f"columns {names[:5]}... are not the table's"


def _put_into(folder: Path, name: str, data: bytes, rows: int) -> None:
    """A PartWriter's sink when it writes into its folder."""
    put_part(folder, name, data)


def put_part(folder: Path | str, name: str, data: bytes) -> bool:
    """Write a part's bytes under ``name``, once: False when the folder holds that part already, as a file or
    inside its compacted file (a part sent again must not add its rows twice). The name must be a part's name."""
    if not PART_NAME.fullmatch(name):
        raise ValueError(f"not a part name: {name!r}")
    folder = Path(folder)
    if (folder / name).exists() or name in _compacted(folder):
        return False
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{name}.{secrets.token_hex(3)}.tmp"
    tmp.write_bytes(data)
    os.replace(tmp, folder / name)
    return True


def _compacted(folder: Path) -> set[str]:
    """The part names the folder's compacted file holds (none when there is none, or it cannot be read)."""
    compact_file = folder / COMPACT
    if not compact_file.is_file():
        return set()
    try:
        return set(json.loads(pq.read_schema(compact_file).metadata[_SOURCES]))
    except (pa.ArrowException, OSError, KeyError, TypeError, ValueError):
        return set()


def part_files(folder: Path | str, notes: list[str] | None = None) -> list[Path]:
    """The files that hold a table's rows, each row in exactly one of them, whatever moment a compaction
    was interrupted at: the compacted file, plus the parts it does not already hold. A compacted file that cannot
    be read, or does not say which parts it holds, is left out (said in ``notes``): its rows cannot be counted
    once and only once."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    parts = sorted(folder.glob(PART_GLOB))
    compact = folder / COMPACT
    if not compact.is_file():
        return parts
    try:
        held = set(json.loads(pq.read_schema(compact).metadata[_SOURCES]))
    except (pa.ArrowException, OSError, KeyError, TypeError, ValueError) as e:
        if notes is not None:
            notes.append(f"skipped unreadable {compact} ({(str(e).splitlines() or [type(e).__name__])[0][:120]})")
        return parts
    return [compact] + [p for p in parts if p.name not in held]


def compact(folder: Path | str) -> int:
    """Merge a finished table's parts into one file (fewer files: faster loading). Crash-safe: the merged file
    is renamed in before any part is deleted, and lists the parts it holds. Returns the parts merged."""
    folder = Path(folder)
    files = part_files(folder)
    parts = [f for f in files if f.name != COMPACT]
    if len(files) < 2 or ((folder / COMPACT).is_file() and files[0].name != COMPACT):
        return 0  # nothing to merge, or a compacted file we cannot read: never write over it
    table = pa.concat_tables(pq.read_table(f) for f in files)
    held = set()
    if files[0].name == COMPACT:
        held = set(json.loads(pq.read_schema(files[0]).metadata[_SOURCES]))
    meta = {**(table.schema.metadata or {}), _SOURCES: json.dumps(sorted(held | {p.name for p in parts}))}
    tmp = folder / f".{COMPACT}.tmp"
    pq.write_table(table.replace_schema_metadata(meta), tmp, compression=COMPRESSION)
    os.replace(tmp, folder / COMPACT)
    for p in parts:
        p.unlink()
    return len(parts)


def read_table(trial_dir: Path | str, table: str) -> pa.Table:
    """All rows of one table of one trial (an empty table of the right schema when there are none)."""
    files = part_files(table_dir(trial_dir, table))
    if not files:
        return schema.TABLES[table].empty_table()
    return pa.concat_tables(pq.read_table(p, schema=schema.TABLES[table]) for p in files)
