"""Settings of the `edgefleet fleet` commands (YAML via `-c` plus `EDGEFLEET_FLEET_...`)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import SettingsConfigDict

from edgefleet.shared.config import EdgefleetSettings


class FleetSettings(EdgefleetSettings):
    """Where the registry lives and what a device bundle points at.

    Defaults match `edgefleet cloud serve`'s: the registry is in the cloud's store.
    """

    model_config = SettingsConfigDict(
        env_prefix="EDGEFLEET_FLEET_", extra="forbid", env_nested_delimiter="__"
    )

    data_dir: Path = Field(Path("./edgefleet-data"), description="the cloud's data directory")
    database_url: str | None = Field(
        None, description="sqlite:///abs/path.db or postgresql://...; none = data_dir/cloud.db"
    )
    device_master_key: SecretStr | None = Field(
        None, description="Fernet key sealing device HMAC keys (the cloud's device_master_key)"
    )
    bundles_dir: Path = Field(
        Path("./edgefleet-bundles"), description="where `enroll` writes device bundles"
    )
    broker_dir: Path | None = Field(
        None,
        description="the broker's folder: mosquitto.conf, its dynamic-security state, its "
        "persistence and the service account secrets; none = data_dir/broker",
    )
    broker_host: str = Field(
        "127.0.0.1",
        description="broker host written into device bundles; enroll/revoke also reach the "
        "running broker there to apply the change at once",
    )
    broker_port: int = Field(
        1883, ge=1, le=65535, description="broker port: the bundles' and the listener's"
    )
    broker_admin_host: str | None = Field(
        None,
        description="where enroll/revoke reach the broker's control API when the fleet "
        "commands see it at another address than devices do; none = broker_host",
    )
    broker_bind: str | None = Field(
        None, description="address the generated listener binds; none = every interface"
    )
    broker_plugin: Path | None = Field(
        None,
        description="Mosquitto's mosquitto_dynamic_security.so; none = the usual install paths",
    )
    broker_user: str | None = Field(
        None,
        description="user Mosquitto drops to when started as root (it must read the broker "
        "folder); none = the user running `fleet broker-files`",
    )
    broker_max_queued_mb: int = Field(
        256,
        ge=1,
        description="MiB the broker holds for one absent client's session (the cloud's while "
        "it restarts); past it new messages for that client are dropped, and devices resend "
        "their unanswered cases from their outbox",
    )
    public_url: str = Field(
        "http://127.0.0.1:8080", description="the cloud's URL as devices reach it (downloads)"
    )
    ca_dir: Path | None = Field(
        None, description="device CA for mutual TLS; revoke also puts the device's certs on its CRL"
    )
    bundle_mount: str | None = Field(
        None,
        description="a folder written into the bundle's device_key_file; none = `secrets.yaml`, "
        "read beside edge.yaml wherever the bundle is (the container's /etc/edgefleet or a "
        "host folder)",
    )

    @field_validator("data_dir", "bundles_dir")
    @classmethod
    def _absolute(cls, value: Path) -> Path:
        return value.expanduser().resolve()

    def resolved_database_url(self) -> str:
        return self.database_url or f"sqlite:///{self.data_dir / 'cloud.db'}"

    def resolved_broker_dir(self) -> Path:
        return (self.broker_dir or self.data_dir / "broker").expanduser().resolve()

    def master_key(self) -> str | None:
        return self.device_master_key.get_secret_value() if self.device_master_key else None
