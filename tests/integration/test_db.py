"""shared/db.py against SQLite on disk and the real PostgreSQL server of this machine."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from edgefleet.shared.db import Database, StoreUnavailable, to_pg_placeholders
from edgefleet.shared.errors import Conflict


@pytest.fixture(params=["sqlite", "postgresql"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'store.db'}"
    else:
        url = request.getfixturevalue("pg_url")
    database = Database.connect(url)
    yield database
    database.close()


def _schema(db: Database) -> list[str]:
    t = db.types
    return [
        f"CREATE TABLE parent (id {t.autoid}, name TEXT NOT NULL UNIQUE, at {t.timestamp})",
        f"CREATE TABLE child (id {t.autoid}, parent_id {t.bigint} NOT NULL "
        f"REFERENCES parent(id), data {t.blob}, ok {t.boolean}, score {t.double})",
    ]


def test_migrate_is_idempotent_and_recorded(db: Database) -> None:
    # given a fresh database, when the same migration runs twice
    assert db.migrate("001_init", _schema(db)) is True
    assert db.migrate("001_init", _schema(db)) is False
    # then it applied once and is recorded
    assert db.applied_migrations() == ["001_init"]
    assert db.query("SELECT * FROM parent") == []


def test_round_trip_types_and_utc(db: Database) -> None:
    db.migrate("001_init", _schema(db))
    at = datetime(2026, 3, 1, 12, 30, 5, 123456, tzinfo=timezone(timedelta(hours=2)))
    assert db.execute("INSERT INTO parent (name, at) VALUES (?, ?)", ("a", at)) == 1
    parent = db.query_one("SELECT id, name, at FROM parent WHERE name = ?", ("a",))
    assert parent is not None
    # stored as UTC, returned timezone-aware in UTC, same instant
    assert parent["at"] == at
    assert parent["at"].utcoffset() == timedelta(0)
    db.execute(
        "INSERT INTO child (parent_id, data, ok, score) VALUES (?, ?, ?, ?)",
        (parent["id"], b"\x00\xffbytes", True, 0.25),
    )
    child = db.query_one("SELECT data, ok, score FROM child")
    assert child is not None
    assert bytes(child["data"]) == b"\x00\xffbytes"
    assert bool(child["ok"]) is True
    assert child["score"] == pytest.approx(0.25)
    # a literal percent sign and a question mark inside a string literal survive
    rows = db.query("SELECT name FROM parent WHERE name LIKE 'a%' AND name <> '?'")
    assert [r["name"] for r in rows] == ["a"]


def test_naive_datetime_is_refused(db: Database) -> None:
    db.migrate("001_init", _schema(db))
    if db.dialect == "sqlite":
        with pytest.raises(ValueError, match="UTC"):
            db.execute("INSERT INTO parent (name, at) VALUES (?, ?)", ("n", datetime(2026, 1, 1)))


def test_constraints_raise_conflict(db: Database) -> None:
    db.migrate("001_init", _schema(db))
    db.execute("INSERT INTO parent (name) VALUES (?)", ("dup",))
    with pytest.raises(Conflict):
        db.execute("INSERT INTO parent (name) VALUES (?)", ("dup",))
    with pytest.raises(Conflict):  # foreign keys are enforced on both engines
        db.execute("INSERT INTO child (parent_id) VALUES (?)", (999_999,))
    assert db.execute("INSERT INTO parent (name) VALUES (?) ON CONFLICT DO NOTHING", ("dup",)) == 0


def test_transaction_commits_or_rolls_back(db: Database) -> None:
    db.migrate("001_init", _schema(db))
    with pytest.raises(RuntimeError), db.transaction():
        db.execute("INSERT INTO parent (name) VALUES (?)", ("x",))
        raise RuntimeError("abort")
    assert db.query("SELECT name FROM parent") == []
    with db.transaction():
        db.execute("INSERT INTO parent (name) VALUES (?)", ("y",))
        with db.transaction():  # nested joins the outer one
            db.execute("INSERT INTO parent (name) VALUES (?)", ("z",))
    assert sorted(r["name"] for r in db.query("SELECT name FROM parent")) == ["y", "z"]


def test_many_threads_write_without_losing_rows(db: Database) -> None:
    db.migrate("001_init", _schema(db))
    errors: list[BaseException] = []

    def writer(n: int) -> None:
        try:
            for i in range(25):
                with db.transaction():
                    db.execute("INSERT INTO parent (name) VALUES (?)", (f"t{n}-{i}",))
        except BaseException as exc:  # collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert errors == []
    assert db.query_one("SELECT COUNT(*) AS n FROM parent") == {"n": 200}
    assert db.execute_many(
        "INSERT INTO parent (name) VALUES (?)", [(f"bulk{i}",) for i in range(50)]
    ) in (50, 1)  # sqlite reports the total, psycopg the last statement's count
    assert db.query_one("SELECT COUNT(*) AS n FROM parent") == {"n": 250}


def test_two_connections_migrate_concurrently(db: Database) -> None:
    # given a second Database object on the same store (another replica)
    other = Database.connect(db.url)
    try:
        results: list[bool] = []
        threads = [
            threading.Thread(target=lambda d=d: results.append(d.migrate("001_init", _schema(d))))
            for d in (db, other)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        # then exactly one applied it
        assert sorted(results) == [False, True]
    finally:
        other.close()


def test_placeholder_translation() -> None:
    assert to_pg_placeholders("a = ? AND b LIKE 'x%?' AND c = ?") == (
        "a = %s AND b LIKE 'x%%?' AND c = %s"
    )


def test_bad_urls_are_typed_errors(tmp_path: Path) -> None:
    with pytest.raises(Exception, match="unsupported database url"):
        Database.connect("mysql://x")
    with pytest.raises(StoreUnavailable):
        Database.connect("postgresql://postgres@127.0.0.1:1/none", connect_timeout_s=1.0)
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises((StoreUnavailable, OSError)):
        Database.connect(f"sqlite:///{blocker}/sub/x.db")


def test_connections_of_ended_threads_are_closed(tmp_path: Path) -> None:
    import psutil

    # given a SQLite store, and a thread pool whose threads come and go (a web server's)
    db = Database.connect(f"sqlite:///{tmp_path}/threads.db")
    db.execute("CREATE TABLE t (a INTEGER)")
    db.execute_many("INSERT INTO t VALUES (?)", [(i,) for i in range(1000)])
    me = psutil.Process()
    before = me.num_fds()
    # when 60 short-lived threads each read from it
    for _ in range(60):
        thread = threading.Thread(target=lambda: db.query("SELECT SUM(a) FROM t"))
        thread.start()
        thread.join()
    # then their connections (each holding files and a page cache) closed with them
    assert me.num_fds() - before <= 6
    # and the store still works, and closes what is left
    assert db.query_one("SELECT COUNT(*) AS n FROM t")["n"] == 1000
    db.close()
