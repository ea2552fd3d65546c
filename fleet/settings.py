"""Settings of the `edgefleet fleet` commands (YAML via `-c` plus `EDGEFLEET_FLEET_...`)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import SettingsConfigDict

from shared.config import EdgefleetSettings


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
        None, description="where Mosquitto password/acl files go; none = data_dir/broker"
    )
    broker_pid_file: Path | None = Field(
        None, description="Mosquitto pid file: enroll/revoke send SIGHUP so it reloads the files"
    )
    broker_host: str = Field("127.0.0.1", description="broker host written into device bundles")
    broker_port: int = Field(1883, ge=1, le=65535, description="broker port for device bundles")
    public_url: str = Field(
        "http://127.0.0.1:8080", description="the cloud's URL as devices reach it (downloads)"
    )
    ca_dir: Path | None = Field(
        None, description="device CA for mutual TLS; revoke also puts the device's certs on its CRL"
    )
    bundle_mount: str = Field(
        "/etc/edgefleet", description="where the edge container mounts its bundle"
    )

    @field_validator("data_dir", "bundles_dir")
    @classmethod
    def _absolute(cls, value: Path) -> Path:
        return value.expanduser().resolve()

    def resolved_database_url(self) -> str:
        return self.database_url or f"sqlite:///{self.data_dir / 'cloud.db'}"

    def resolved_broker_dir(self) -> Path:
        return self.broker_dir or self.data_dir / "broker"

    def master_key(self) -> str | None:
        return self.device_master_key.get_secret_value() if self.device_master_key else None
