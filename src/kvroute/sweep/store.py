"""The run store: ``RUN_DIR/store.sqlite``, one row per cell, written in crash-safe transactions.

Layout (schema version 1):

* ``records`` — one row per cell. ``key`` (TEXT PRIMARY KEY) is the cell's content hash (see
  :mod:`kvroute.sweep.grid`); every other column is a record field of :mod:`kvroute.records`
  (plus whatever fields the chosen metrics add), created with ``ALTER TABLE ADD COLUMN`` the first
  time a field appears, so ``SELECT * FROM records`` is the long-format table. Scalars are plain
  SQLite values (booleans as 0/1). Lists of floats (per-layer vectors, ``probe_features``) are
  little-endian float32 blobs when that is lossless, else JSON text; other lists and tables are
  JSON text (the encoding is :mod:`kvroute.record_format`'s, which the export and the analysis decode with).
* ``columns`` — (name, kind) for every record column, kind in bool | int | float | text | vector |
  json, so readers restore the Python values exactly (:func:`decode_value`, :func:`decode_columns`).
* ``meta`` — (key, value); ``schema_version``.

Errored cells (``status = 'error'``, see :mod:`kvroute.records`) are stored like finished ones:
their errors are deterministic (oracle on an item without evidence fails the same way every
time), so a resume skips them instead of looping on them. ``kvroute sweep --resume
--retry-errors`` deletes them first (:meth:`Store.delete_errors`) to compute them again, e.g.
after a fix.

Why blobs: encoding a realistic record's vectors (SmolLM2: a 576-float ``probe_features`` plus
eight 30-layer vectors) as JSON text costs ~45 s per 100,000 records, as float32 blobs ~4 s
(lossless check included), at a quarter of the size (``benchmarks/bookkeeping.py``).

SQLite runs in WAL mode with ``synchronous=NORMAL``: a transaction is either wholly in the store
or not at all after a crash or SIGKILL of the writer, and readers (reports, exports) never block
the writer. Only the process that holds the run lock (:mod:`kvroute.sweep.lock`) writes.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import sqlite3
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from kvroute.errors import StoreError
from kvroute.record_format import STORE_NAME, TABLE, decode_value, encode_list, kind_of
from kvroute.sweep.lock import RunLock

log = logging.getLogger(__name__)

SCHEMA_VERSION = "1"
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_FAMILY = {"bool": "bool", "int": "number", "float": "number", "text": "text", "vector": "list", "json": "list"}
_TYPES: dict[str, frozenset[type]] = {
    "bool": frozenset({bool}), "number": frozenset({int, float}), "text": frozenset({str}),
    "list": frozenset({list, tuple, dict}),
}


def _plain(v: Any) -> Any:
    """numpy/torch scalars and arrays → Python values (the slow path, for values of unexpected types)."""
    if hasattr(v, "tolist"):
        return v.tolist()
    if hasattr(v, "item"):
        return v.item()
    return v


#: SQLite's primary result codes that are the disk's doing, as the errno the CLI turns into one line
_SQLITE_OS_ERRORS = {13: errno.ENOSPC, 8: errno.EROFS, 10: errno.EIO, 14: errno.EACCES}


def _disk_full(path: Path) -> bool:
    try:
        st = os.statvfs(path.parent)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < 64 * 1024


def _os_error(e: sqlite3.Error, path: Path) -> OSError | None:
    """``e`` as an :class:`OSError` naming ``path`` when the disk caused it (full, read-only, I/O), else None."""
    code = getattr(e, "sqlite_errorcode", None)
    if code is None:
        text = str(e).lower()
        code = 13 if "disk is full" in text else 8 if "readonly" in text else 10 if "disk i/o" in text else None
    err = _SQLITE_OS_ERRORS.get(code & 0xFF) if code is not None else None
    if err == errno.EIO and _disk_full(path):  # reading a WAL store needs room for its -shm file
        err = errno.ENOSPC
    return OSError(err, f"{os.strerror(err)} ({e})", str(path)) if err is not None else None


def _connect(path: Path, *, readonly: bool) -> sqlite3.Connection:
    try:
        if readonly:
            con = sqlite3.connect(f"file:{path}?mode=ro", uri=True, isolation_level=None)
        else:
            con = sqlite3.connect(path, isolation_level=None)
            con.execute("PRAGMA journal_mode=WAL")
            con.execute("PRAGMA synchronous=NORMAL")
        con.execute("PRAGMA busy_timeout=30000")
        return con
    except sqlite3.Error as e:
        os_err = _os_error(e, path)
        if os_err is not None:
            raise os_err from None
        raise StoreError(f"cannot open {path} as a kvroute run store ({e}); use another --out") from None


def _column_kinds(con: sqlite3.Connection) -> dict[str, str]:
    try:
        return dict(con.execute("SELECT name, kind FROM columns ORDER BY rowid").fetchall())
    except sqlite3.OperationalError:
        return {}


class Store:
    """The writer of one run directory's store; holds the run lock while open.

    >>> with Store.open(run_dir) as store:              # doctest: +SKIP
    ...     done = store.keys()
    ...     store.write(records)                        # one transaction
    """

    def __init__(self, run_dir: str | Path) -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / STORE_NAME
        self._lock = RunLock(self.run_dir)
        self._con: sqlite3.Connection | None = None
        self._kinds: dict[str, str] = {}
        self._sql: dict[tuple[str, ...], str] = {}

    @classmethod
    def open(cls, run_dir: str | Path) -> Store:
        """Lock ``run_dir`` (:class:`~kvroute.errors.StoreLockedError` if another sweep has it) and open its store."""
        store = cls(run_dir)
        store._lock.acquire()
        try:
            store._con = _connect(store.path, readonly=False)
            store._init_schema()
        except BaseException:
            store.close()
            raise
        return store

    def _init_schema(self) -> None:
        con = self.con
        try:
            con.execute("BEGIN IMMEDIATE")
            con.execute(f"CREATE TABLE IF NOT EXISTS {TABLE} (key TEXT PRIMARY KEY NOT NULL)")
            con.execute("CREATE TABLE IF NOT EXISTS columns (name TEXT PRIMARY KEY NOT NULL, kind TEXT NOT NULL)")
            con.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY NOT NULL, value TEXT)")
            con.execute("INSERT OR IGNORE INTO meta VALUES ('schema_version', ?)", (SCHEMA_VERSION,))
            con.execute("COMMIT")
        except sqlite3.DatabaseError as e:
            if con.in_transaction:
                con.execute("ROLLBACK")
            os_err = _os_error(e, self.path)
            if os_err is not None:
                raise os_err from None
            raise StoreError(f"{self.path} is not a kvroute run store ({e}); use another --out") from None
        (version,) = con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        if version != SCHEMA_VERSION:
            raise StoreError(f"{self.path} has store schema version {version}; this kvroute writes version "
                             f"{SCHEMA_VERSION}. Export it with the kvroute that wrote it, or use another --out")
        self._kinds = _column_kinds(con)

    @property
    def con(self) -> sqlite3.Connection:
        if self._con is None:
            raise StoreError(f"the store {self.path} is closed")
        return self._con

    def close(self) -> None:
        if self._con is not None:
            self._con.close()
            self._con = None
        self._lock.release()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # reading ------------------------------------------------------------------------------------
    def keys(self) -> set[str]:
        return {k for (k,) in self.con.execute(f"SELECT key FROM {TABLE}")}

    def count(self) -> int:
        return int(self.con.execute(f"SELECT COUNT(*) FROM {TABLE}").fetchone()[0])

    def records(self) -> list[dict[str, Any]]:
        return _read(self.con)

    def errors(self, settings: str | None = None) -> list[dict[str, Any]]:
        """Errored cells per (model, press, error): ``n`` and the first ``instance_id``; most frequent first."""
        have = set(self._kinds)
        if "status" not in have:
            return []
        where = " AND settings = ?" if settings is not None and "settings" in have else ""
        model, press, error, iid = (c if c in have else "NULL" for c in ("model", "press", "error", "instance_id"))
        sql = (f"SELECT {model}, {press}, {error}, COUNT(*), MIN({iid}) FROM {TABLE} "
               f"WHERE status = 'error'{where} GROUP BY 1, 2, 3 ORDER BY 4 DESC, 1, 2, 3")
        rows = self.con.execute(sql, (settings,) if where else ()).fetchall()
        return [dict(zip(("model", "press", "error", "n", "instance_id"), r, strict=True)) for r in rows]

    def delete_errors(self) -> int:
        """Delete the errored cells' records (so a resume computes them again); returns how many."""
        if "status" not in self._kinds:
            return 0
        con = self.con
        con.execute("BEGIN IMMEDIATE")
        try:
            n = con.execute(f"DELETE FROM {TABLE} WHERE status = 'error'").rowcount
            con.execute("COMMIT")
        except BaseException:
            if con.in_transaction:
                con.execute("ROLLBACK")
            raise
        return int(n)

    # writing ------------------------------------------------------------------------------------
    def _add_columns(self, records: Sequence[Mapping[str, Any]]) -> None:
        new: dict[str, str] = {}
        for r in records:
            for k, v in r.items():
                if k not in self._kinds and k not in new and v is not None and k != "key":
                    if not _NAME.match(k):
                        raise StoreError(f"record field {k!r} is not a valid column name (letters, digits, _)")
                    new[k] = kind_of(_plain(v) if type(v) not in _SIMPLE else v)
        for k, kind in new.items():
            self.con.execute(f'ALTER TABLE {TABLE} ADD COLUMN "{k}"')
            self.con.execute("INSERT INTO columns VALUES (?, ?)", (k, kind))
        self._kinds.update(new)

    def write(self, records: Iterable[Mapping[str, Any]]) -> int:
        """Insert ``records`` (each with a ``key``) in one transaction; returns how many were new.

        A key already in the store is left as it is (INSERT OR IGNORE), so a record is never stored twice.
        """
        records = list(records)
        if not records:
            return 0
        for r in records:
            if not isinstance(r.get("key"), str):
                raise StoreError(f"a record has no 'key' (fields: {', '.join(list(r)[:8])}, ...)")
        con = self.con
        kinds_before = dict(self._kinds)
        con.execute("BEGIN IMMEDIATE")
        try:
            self._add_columns(records)
            cols = ("key", *(c for c in self._kinds if any(c in r for r in records)))
            sql = self._sql.get(cols)
            if sql is None:
                names = ", ".join(f'"{c}"' for c in cols)
                sql = self._sql[cols] = f"INSERT OR IGNORE INTO {TABLE} ({names}) VALUES ({', '.join('?' * len(cols))})"
            rows = [self._row(r, cols) for r in records]
            cur = con.executemany(sql, rows)
            con.execute("COMMIT")
        except BaseException as e:
            if con.in_transaction:
                con.execute("ROLLBACK")  # the unit's records go together or not at all
            self._kinds = kinds_before
            os_err = _os_error(e, self.path) if isinstance(e, sqlite3.Error) else None
            if os_err is not None:  # a full disk: one line naming the store; what was committed stays
                raise os_err from None
            raise
        return cur.rowcount

    def _row(self, r: Mapping[str, Any], cols: tuple[str, ...]) -> tuple[Any, ...]:
        out: list[Any] = [r["key"]]
        for c in cols[1:]:
            v = r.get(c)
            if v is None:
                out.append(None)
                continue
            kind = self._kinds[c]
            if type(v) not in _TYPES[_FAMILY[kind]]:
                v = _plain(v)
                if type(v) not in _TYPES[_FAMILY[kind]]:
                    raise StoreError(f"record field {c!r} holds {type(v).__name__} {v!r:.60} but the store's column "
                                     f"holds {kind} values; a field must keep one type across records")
            if kind == "bool":
                v = int(v)
            elif kind in ("vector", "json"):
                v = encode_list(v)
            out.append(v)
        return tuple(out)

    # summaries ----------------------------------------------------------------------------------
    def summary(self, settings: str | None = None) -> list[dict[str, Any]]:
        """Per (model, regime, press, ratio, restore condition): n cells, mean F1, hallucination rate and mean GER
        (None when not measured) over the cells that ran, and ``errors``: how many of the n errored (metrics
        absent)."""
        have = set(self._kinds)
        agg = ", ".join(f"AVG({c})" if c in have else "NULL" for c in ("f1", "hallucinated", "ger"))
        agg += ", SUM(CASE WHEN status = 'error' THEN 1 ELSE 0 END)" if "status" in have else ", 0"
        where = " WHERE settings = ?" if settings is not None and "settings" in have else ""
        keys = ("model", "regime", "press", "ratio", "restore")
        select = ", ".join(f"{c} AS k_{c}" if c in have else f"NULL AS k_{c}" for c in keys)
        group = ", ".join(f"k_{c}" for c in keys)
        sql = (f"SELECT {select}, COUNT(*), {agg} FROM {TABLE}{where} GROUP BY {group} "
               "ORDER BY k_model, k_regime, k_press != 'none', k_press, k_ratio, k_restore IS NOT NULL, k_restore")
        rows = self.con.execute(sql, (settings,) if where else ()).fetchall()
        names = ("model", "regime", "press", "ratio", "restore", "n", "f1", "hallucination_rate", "ger", "errors")
        return [dict(zip(names, r, strict=True)) for r in rows]


_SIMPLE = frozenset({bool, int, float, str, list, tuple, dict})


def _iter(con: sqlite3.Connection, order: str = "rowid") -> Iterator[dict[str, Any]]:
    kinds = _column_kinds(con)
    cur = con.execute(f"SELECT * FROM {TABLE} ORDER BY {order}")
    names = [d[0] for d in cur.description]
    decoders = [kinds.get(n, "text") for n in names]
    for row in cur:
        yield {n: (decode_value(k, v) if k in ("vector", "json", "bool") else v)
               for n, k, v in zip(names, decoders, row, strict=True)}


def _read(con: sqlite3.Connection, order: str = "rowid") -> list[dict[str, Any]]:
    return list(_iter(con, order))


def iter_records(run_dir: str | Path, *, order: str = "rowid") -> Iterator[dict[str, Any]]:
    """Like :func:`read_records`, one record at a time (for stores too large to hold in memory)."""
    con = _open_readonly(run_dir)
    try:
        yield from _iter(con, order)
    except sqlite3.Error as e:
        raise StoreError(f"cannot read the run store in {run_dir}: {e}") from None
    except StoreError as e:  # a value the store's encoding cannot hold (a torn blob): name the store
        raise StoreError(f"the run store in {run_dir}: {e}") from None
    finally:
        con.close()


def _open_readonly(run_dir: str | Path) -> sqlite3.Connection:
    path = Path(run_dir)
    path = path / STORE_NAME if path.is_dir() else path
    if not path.is_file():
        raise StoreError(f"no run store at {path}; pass the --out directory of a sweep")
    con = _connect(path, readonly=True)
    try:
        check_schema(con, path)
    except BaseException:
        con.close()
        raise
    return con


def store_columns(run_dir: str | Path) -> list[str]:
    """The names of the store's record columns (``key`` first), in table order: the header of an empty export."""
    con = _open_readonly(run_dir)
    try:
        return [row[1] for row in con.execute(f"PRAGMA table_info({TABLE})")]
    except sqlite3.Error as e:
        raise StoreError(f"cannot read the run store in {run_dir}: {e}") from None
    finally:
        con.close()


def check_schema(con: sqlite3.Connection, path: str | Path) -> None:
    """Raise :class:`StoreError` unless the store's ``schema_version`` is the one this kvroute reads.

    Every reader checks it (the writer does in :meth:`Store.open`): a store of another version is refused,
    never read as if it were this one. A store without a ``meta`` table (hand-made) has no version to check.
    """
    try:
        row = con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    except sqlite3.OperationalError:
        return  # no meta table
    version = None if row is None else row[0]
    if str(version) != SCHEMA_VERSION:
        raise StoreError(f"{path} has store schema version {version!r}; this kvroute reads version "
                         f"{SCHEMA_VERSION}. Read it with the kvroute that wrote it (kvroute export), or start a "
                         "fresh run")


DAMAGED_FIX = ("restore it from a backup, recover what is readable with `sqlite3 {path} .recover > dump.sql`, "
               "or start a fresh run in another --out")


def quick_check(con: sqlite3.Connection, path: str | Path) -> None:
    """Raise :class:`StoreError` naming ``path`` unless SQLite's ``PRAGMA quick_check`` passes on ``con``."""
    try:
        rows = con.execute("PRAGMA quick_check").fetchall()
    except sqlite3.DatabaseError as e:
        os_err = _os_error(e, Path(path))
        if os_err is not None:  # the disk (full, read-only, failing), not the store's pages
            raise os_err from None
        raise StoreError(f"{path} is damaged ({e}); {DAMAGED_FIX.format(path=path)}") from None
    problems = [str(r[0]) for r in rows if r and r[0] != "ok"]
    if problems:
        first = " ".join(problems[0].split())[:200]
        raise StoreError(f"{path} is damaged: SQLite's integrity check found {len(problems)} problem(s), the first: "
                         f"{first}; {DAMAGED_FIX.format(path=path)}")


def check_integrity(run_dir: str | Path) -> None:
    """Check a run store (``RUN_DIR/store.sqlite`` or the file itself) with ``PRAGMA quick_check``; no store, no
    check."""
    path = Path(run_dir)
    path = path / STORE_NAME if path.is_dir() else path
    if not path.is_file():
        return
    con = _connect(path, readonly=True)
    try:
        quick_check(con, path)
    finally:
        con.close()


def read_records(run_dir: str | Path, *, order: str = "rowid") -> list[dict[str, Any]]:
    """Every record of a run store as Python values, read-only and without the lock (safe during a sweep)."""
    return list(iter_records(run_dir, order=order))


def decode_columns(con: sqlite3.Connection, df: Any) -> Any:
    """Decode a DataFrame read with ``SELECT * FROM records`` in place, using the store's ``columns`` table.

    Stores without that table (hand-made or older ones) are returned unchanged.
    """
    for name, kind in _column_kinds(con).items():
        if name in df.columns and kind in ("vector", "json", "bool"):
            df[name] = [None if v is None or (isinstance(v, float) and v != v) else decode_value(kind, v)
                        for v in df[name]]
    return df
