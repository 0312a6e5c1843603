"""The compile cache on disk: one SQLite file per cache directory (`cache_dir()/cache.db`), shared safely by every
process using it, with a size cap and least-recently-used eviction.

Entries are `(table, key) -> payload` (a compiled binary, a rendered program): `Compiler.compile_cached`, the CPU
backend's batch objects and the engine's program cache use it through `get`, `put` and `delete`. Each payload is stored
with its sha256 and checked on read: a damaged entry reads as missing, so the caller compiles again and overwrites it.
`CACHELEVEL=0` turns the cache off; `CACHE_MAX_MB` (default 1024) caps its size: when a write takes it over the cap,
the least recently used entries go until it is back under 90% of it. A database file that can't be opened as one (a
stray file, a damaged disk) is moved aside (`cache.db.corrupt-<time>`) and a new one made; if that fails too, the
process runs without the cache and says so once at DEBUG>=1. A database that stays locked past the 60 s busy timeout is
not damaged: it is left alone and the process runs without the cache.
"""
from __future__ import annotations

import os
import sqlite3
import threading
import time
from typing import Callable

from fusegrad.helpers import CACHE_MAX_MB, CACHELEVEL, DEBUG, cache_dir, hash_bytes

DB_NAME = "cache.db"
_SCHEMA = ("CREATE TABLE IF NOT EXISTS entries (tbl TEXT NOT NULL, key TEXT NOT NULL, payload BLOB NOT NULL, "
           "digest TEXT NOT NULL, size INTEGER NOT NULL, used REAL NOT NULL, PRIMARY KEY (tbl, key)) WITHOUT ROWID",
           "CREATE INDEX IF NOT EXISTS entries_used ON entries (used)")
# a read marks its entry used at most this often (a write per read would serialize concurrent processes)
_TOUCH_S = 600.0
# puts between two checks of the total size against the cap
_CHECK_EVERY = 32

_lock = threading.Lock()
_conns: dict[tuple[int, str], sqlite3.Connection | None] = {}   # (pid, path) -> connection; None: unusable here
_puts = 0
_unchecked = 0   # bytes written since the last size check


def db_path() -> str:
    return os.path.join(cache_dir(), DB_NAME)


def _open(path: str) -> sqlite3.Connection:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    conn = sqlite3.connect(path, timeout=60.0, isolation_level=None, check_same_thread=False)
    try:
        conn.execute("PRAGMA journal_mode=WAL")   # readers don't wait for a writer
        conn.execute("PRAGMA synchronous=NORMAL")
        for stmt in _SCHEMA: conn.execute(stmt)
    except sqlite3.Error:
        conn.close()
        raise
    return conn


def _conn() -> sqlite3.Connection | None:
    """This process's connection to the current cache directory's database (a forked child opens its own)."""
    path = db_path()
    k = (os.getpid(), path)
    if k in _conns: return _conns[k]
    conn: sqlite3.Connection | None = None
    try:
        conn = _open(path)
    except sqlite3.OperationalError as e:   # locked or busy past the timeout: a healthy file other processes use
        if DEBUG >= 1: print(f"compile cache {path} unavailable ({e}); running without it")
    except sqlite3.DatabaseError as e:   # not a database (damaged, or some other file): put it aside, start anew
        try:
            os.replace(path, f"{path}.corrupt-{int(time.time())}")
            conn = _open(path)
            if DEBUG >= 1: print(f"compile cache {path} was unreadable ({e}); moved aside, starting a new one")
        except (OSError, sqlite3.Error) as e2:
            if DEBUG >= 1: print(f"compile cache {path} unusable ({e2}); running without it")
    except (OSError, sqlite3.Error) as e:
        if DEBUG >= 1: print(f"compile cache {path} unusable ({e}); running without it")
    _conns[k] = conn
    return conn


def _run(fn: Callable[[sqlite3.Connection], object]) -> object:
    """fn(connection) under the lock; a database error is a miss (None), never an exception to the caller."""
    if CACHELEVEL < 1: return None
    with _lock:
        if (conn := _conn()) is None: return None
        try: return fn(conn)
        except sqlite3.Error as e:
            if DEBUG >= 1: print(f"compile cache {db_path()}: {e}")
            return None


def get(table: str, key: str, valid: Callable[[bytes], bool] | None = None) -> bytes | None:
    """The payload stored under (table, key), or None: missing, damaged (its checksum fails), or rejected by `valid`
    (then it is deleted, so it gets redone)."""
    def read(conn: sqlite3.Connection) -> bytes | None:
        row = conn.execute("SELECT payload, digest, used FROM entries WHERE tbl=? AND key=?", (table, key)).fetchone()
        if row is None: return None
        payload, digest, used = bytes(row[0]), row[1], row[2]
        if hash_bytes(payload) != digest or (valid is not None and not valid(payload)):
            if DEBUG >= 1: print(f"unusable compile cache entry {table}/{key}, evicting")
            conn.execute("DELETE FROM entries WHERE tbl=? AND key=?", (table, key))
            return None
        if (now := time.time()) - used > _TOUCH_S:
            conn.execute("UPDATE entries SET used=? WHERE tbl=? AND key=?", (now, table, key))
        return payload
    out = _run(read)
    return out if isinstance(out, bytes) else None


def put(table: str, key: str, payload: bytes) -> None:
    """Store `payload` under (table, key) (replacing what was there), then keep the whole under the size cap."""
    global _puts

    def write(conn: sqlite3.Connection) -> None:
        global _puts, _unchecked
        conn.execute("INSERT OR REPLACE INTO entries VALUES (?, ?, ?, ?, ?, ?)",
                     (table, key, payload, hash_bytes(payload), len(payload), time.time()))
        _puts += 1
        _unchecked += len(payload)
        cap = int(CACHE_MAX_MB.value) * (1 << 20)
        # every _CHECK_EVERY writes, and whenever an eighth of the cap was written since the last check: a count alone
        # let a run of large entries pass the cap by up to _CHECK_EVERY of them, depending on where the process-wide
        # count happened to stand
        if _puts % _CHECK_EVERY == 1 or _unchecked > cap // 8:
            _unchecked = 0
            _evict(conn, cap)
    _run(write)


def delete(table: str, key: str) -> None:
    """Remove an entry (one that passed its checksum but turned out unusable); missing is fine."""
    _run(lambda conn: conn.execute("DELETE FROM entries WHERE tbl=? AND key=?", (table, key)))


def _evict(conn: sqlite3.Connection, cap: int) -> None:
    """Drop the least recently used entries until the total is under 90% of `cap` bytes (when it is over `cap`)."""
    total = conn.execute("SELECT COALESCE(SUM(size), 0) FROM entries").fetchone()[0]
    if total <= cap: return
    goal = total - int(cap * 0.9)
    while goal > 0:
        rows = conn.execute("SELECT tbl, key, size FROM entries ORDER BY used LIMIT 256").fetchall()
        if not rows: break
        conn.execute("BEGIN IMMEDIATE")
        try:
            for tbl, key, size in rows:
                conn.execute("DELETE FROM entries WHERE tbl=? AND key=?", (tbl, key))
                goal -= size
                if goal <= 0: break
            conn.execute("COMMIT")
        except sqlite3.Error:
            conn.execute("ROLLBACK")
            raise


def stats() -> tuple[int, int, dict[str, tuple[int, int]]] | None:
    """(entries, bytes, {table: (entries, bytes)}) of the current cache directory's database; None without one."""
    if not os.path.exists(db_path()): return None
    def read(conn: sqlite3.Connection) -> tuple[int, int, dict[str, tuple[int, int]]]:
        rows = conn.execute("SELECT tbl, COUNT(*), COALESCE(SUM(size), 0) FROM entries GROUP BY tbl").fetchall()
        per = {t: (n, s) for t, n, s in rows}
        return sum(n for n, _ in per.values()), sum(s for _, s in per.values()), per
    out = _run(read)
    return out if isinstance(out, tuple) else None


def close_all() -> None:
    """Close this process's connections (tests switching cache directories; a clean exit)."""
    with _lock:
        for k, conn in list(_conns.items()):
            if conn is not None and k[0] == os.getpid(): conn.close()
            del _conns[k]
