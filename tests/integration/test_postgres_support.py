"""Where no PostgreSQL answers, the tests start a disposable one: the scale path never skips."""

from __future__ import annotations

import pytest

from tests.support import postgres


@pytest.mark.slow
def test_a_disposable_server_is_started_when_none_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    import psycopg

    # given no server where the tests look first (port 1: nothing listens there)
    monkeypatch.setattr(postgres, "LOCAL", "postgresql://postgres@127.0.0.1:1/test")
    with postgres.postgres_server() as url:
        # then a real one answers, with the `test` database the fixtures use
        assert ":1/" not in url
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT current_database()").fetchone() == ("test",)
    # and it is gone afterwards
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(url, connect_timeout=3)
