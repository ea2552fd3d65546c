"""The broker's accounts: each active device's (from its enrollment) and the services'
(the cloud's `cloud` user, an operator's), as `$7$` hashes for the broker's password file."""

from __future__ import annotations

from edgefleet.fleet.credentials import mosquitto_hash, new_password
from edgefleet.shared.db import Database
from edgefleet.shared.messages import utcnow


class BrokerAccounts:
    def __init__(self, db: Database):
        self.db = db

    def devices(self) -> list[tuple[str, str]]:
        """(username, `$7$` hash) of every active device."""
        rows = self.db.query(
            "SELECT device_id, broker_hash FROM fleet_devices "
            "WHERE revoked_at IS NULL AND broker_hash IS NOT NULL ORDER BY device_id"
        )
        return [(r["device_id"], r["broker_hash"]) for r in rows]

    def services(self) -> list[tuple[str, str]]:
        """(username, `$7$` hash) of every service account."""
        rows = self.db.query(
            "SELECT username, broker_hash FROM fleet_service_accounts ORDER BY username"
        )
        return [(r["username"], r["broker_hash"]) for r in rows]

    def set_service_password(self, username: str, password: str) -> None:
        """Store (the hash of) a service account's broker password, e.g. the `cloud` user."""
        encoded = mosquitto_hash(password)
        with self.db.transaction():
            self.db.execute("DELETE FROM fleet_service_accounts WHERE username = ?", (username,))
            self.db.execute(
                "INSERT INTO fleet_service_accounts (username, broker_hash, created_at) "
                "VALUES (?, ?, ?)",
                (username, encoded, utcnow()),
            )

    def ensure_service(self, username: str = "cloud") -> str | None:
        """Create the account with a new password (returned once); None if it exists."""
        if self.db.query_one(
            "SELECT username FROM fleet_service_accounts WHERE username = ?", (username,)
        ):
            return None
        password = new_password()
        self.set_service_password(username, password)
        return password
