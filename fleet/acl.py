"""Broker configuration generated from the registry: Mosquitto (dynamic security) and EMQX.

The rule they encode (ARCHITECTURE.md, "Auth"): a device publishes only its own
`status`, `telemetry`, `escalations` and `reported` (all under `ef/v1/{device}/`),
subscribes to and receives only its own `results` and `desired`, and connects only with
its own client id (`ef-edge-{device}`). The `cloud` service account reads every device's
topics (plainly or through MQTT 5 shared subscriptions) and writes `results` and
`desired`; the `ef-admin` account only drives the broker's control API. Everything else is
denied.

Why the dynamic-security plugin and not `acl_file`: Mosquitto checks an `acl_file` only
when a message is *delivered*, never when a subscription is *made*. A device that
subscribes to the cloud's shared subscription is granted it, is handed its share of the
group's messages, and then has them all refused at delivery: the sender already has its
PUBACK, so those messages are gone. The plugin checks SUBSCRIBE itself and binds a client
id to its username, so a device can neither join the cloud's share group nor take over
another client's session.

The files are regenerated in full from the registry on every change (enroll, revoke) and
written atomically; a running broker gets the same change live through its control API
(`edgefleet.fleet.broker_control`), since the plugin reads its file only at start.
"""

from __future__ import annotations

import base64
import getpass
import json
import logging
import os
import signal
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgefleet.fleet.credentials import parse_mosquitto_hash
from edgefleet.fleet.registry import DeviceRegistry
from edgefleet.shared.errors import ConfigError
from edgefleet.shared.mqtt import device_client_id
from edgefleet.shared.topics import Channel, Topics

log = logging.getLogger(__name__)

DEVICE_PUBLISH = (Channel.STATUS, Channel.TELEMETRY, Channel.ESCALATIONS, Channel.REPORTED)
DEVICE_READ = (Channel.RESULTS, Channel.DESIRED)
CLOUD_WRITE = (Channel.RESULTS, Channel.DESIRED)

# The largest message the broker takes: a case (image and ef-meta) within the cloud's limit.
MAX_PACKET_BYTES = 8 * 2**20
CLOUD_ACCOUNT = "cloud"
ADMIN_ACCOUNT = "ef-admin"
SERVICE_ACCOUNTS = (CLOUD_ACCOUNT, ADMIN_ACCOUNT)
CONTROL_TOPIC = "$CONTROL/dynamic-security/v1"
CONTROL_RESPONSE = CONTROL_TOPIC + "/response"

DYNSEC_FILE = "dynamic-security.json"
CONF_FILE = "mosquitto.conf"
# Where distributions install the plugin (Debian/Ubuntu, eclipse-mosquitto image, others).
PLUGIN_PATHS = (
    "/usr/lib/x86_64-linux-gnu/mosquitto_dynamic_security.so",
    "/usr/lib/aarch64-linux-gnu/mosquitto_dynamic_security.so",
    "/usr/lib/mosquitto_dynamic_security.so",
    "/usr/lib64/mosquitto_dynamic_security.so",
    "/usr/local/lib/mosquitto_dynamic_security.so",
)


@dataclass(frozen=True)
class BrokerFiles:
    config_file: Path
    dynsec_file: Path

    @property
    def folder(self) -> Path:
        return self.config_file.parent


@dataclass(frozen=True)
class BrokerListener:
    """What goes into the generated mosquitto.conf besides the auth."""

    port: int = 1883
    bind: str | None = None  # None: every interface
    plugin: Path | None = None  # None: the first of PLUGIN_PATHS that exists
    user: str | None = None  # the user Mosquitto drops to when started as root; None: ours
    # What the broker holds for one client that is away (in practice the cloud's session
    # while it restarts): 32 messages of the largest size the broker takes. Past it, the
    # broker drops what it would queue (its $SYS counters say so); a device's case is not
    # lost, since its outbox keeps it and sends it again until a verdict comes.
    max_queued_bytes: int = 32 * MAX_PACKET_BYTES


def device_role(device_id: str) -> str:
    return f"ef-device-{device_id}"


def _acl(kind: str, topic: str) -> dict[str, Any]:
    return {"acltype": kind, "topic": topic, "priority": 0, "allow": True}


def device_acls(device_id: str, topics: Topics = Topics()) -> list[dict[str, Any]]:
    """Exactly the contract: publish its own four channels, read its own two."""
    acls = [_acl("publishClientSend", topics.for_device(device_id, c)) for c in DEVICE_PUBLISH]
    for channel in DEVICE_READ:
        topic = topics.for_device(device_id, channel)
        acls += [_acl("subscribeLiteral", topic), _acl("publishClientReceive", topic)]
    return acls


def cloud_acls(topics: Topics = Topics()) -> list[dict[str, Any]]:
    root = topics.root
    acls = [
        _acl("subscribePattern", f"{root}/#"),
        _acl("subscribePattern", f"$share/+/{root}/#"),
        _acl("publishClientReceive", f"{root}/#"),
    ]
    return acls + [_acl("publishClientSend", topics.all_devices(c)) for c in CLOUD_WRITE]


def admin_acls(topics: Topics = Topics()) -> list[dict[str, Any]]:
    """The control API, and every device channel for one thing: a revoke clears the
    device's retained messages (`BrokerControl.clear_retained`)."""
    return [
        _acl("publishClientSend", CONTROL_TOPIC),
        _acl("subscribeLiteral", CONTROL_RESPONSE),
        _acl("publishClientReceive", CONTROL_RESPONSE),
    ] + [_acl("publishClientSend", topics.all_devices(c)) for c in Channel]


def _password_fields(encoded: str) -> dict[str, Any]:
    """A `$7$` hash as the plugin stores it: the same PBKDF2-SHA512 digest and 12-byte salt."""
    iterations, salt, digest = parse_mosquitto_hash(encoded)
    if len(salt) != 12 or len(digest) != 64:
        raise ConfigError("a broker hash has a salt or digest the dynamic-security plugin refuses")
    return {
        "password": base64.b64encode(digest).decode(),
        "salt": base64.b64encode(salt).decode(),
        "iterations": iterations,
    }


def render_dynsec(
    devices: Iterable[tuple[str, str]],
    services: Iterable[tuple[str, str]],
    topics: Topics = Topics(),
) -> dict[str, Any]:
    """The plugin's whole state: clients (hashes only), one role per device, deny by default."""
    clients: list[dict[str, Any]] = []
    roles: list[dict[str, Any]] = []
    service_roles = {CLOUD_ACCOUNT: cloud_acls(topics), ADMIN_ACCOUNT: admin_acls(topics)}
    for username, encoded in services:
        if username not in service_roles:
            raise ConfigError(f"unknown service account {username!r} in the registry")
        roles.append({"rolename": username, "acls": service_roles[username]})
        clients.append(
            {"username": username, "roles": [{"rolename": username}], **_password_fields(encoded)}
        )
    for device_id, encoded in devices:
        roles.append({"rolename": device_role(device_id), "acls": device_acls(device_id, topics)})
        clients.append(
            {
                "username": device_id,
                "clientid": device_client_id(device_id),
                "roles": [{"rolename": device_role(device_id)}],
                **_password_fields(encoded),
            }
        )
    return {
        "defaultACLAccess": {
            "publishClientSend": False,
            "publishClientReceive": False,
            "subscribe": False,
            "unsubscribe": True,
        },
        "clients": clients,
        "groups": [],
        "roles": roles,
    }


def reload_broker(folder: Path) -> int | None:
    """SIGHUP the broker of `folder` (its pid file), so TLS listeners re-read their CRL;
    None when no broker runs from it."""
    try:
        pid = int((Path(folder) / "mosquitto.pid").read_text().strip())
        os.kill(pid, signal.SIGHUP)
    except (OSError, ValueError):
        return None
    log.info("reloaded mosquitto", extra={"pid": pid})
    return pid


def find_plugin(configured: Path | None = None) -> Path:
    """The configured path as it is (the broker may run on another host or image), or the
    first usual install path that exists here."""
    if configured is not None:
        return Path(configured)
    for candidate in PLUGIN_PATHS:
        if Path(candidate).is_file():
            return Path(candidate)
    raise ConfigError(
        "Mosquitto's dynamic-security plugin (mosquitto_dynamic_security.so) is not installed",
        hint="apt-get install mosquitto (2.0 or newer), or set broker_plugin to its path",
    )


def render_mosquitto_conf(folder: Path, listener: BrokerListener) -> str:
    """A complete mosquitto.conf: `mosquitto -c <folder>/mosquitto.conf` is the whole set-up."""
    bind = f" {listener.bind}" if listener.bind else ""
    user = listener.user or getpass.getuser()
    return "\n".join(
        [
            "# Generated by `edgefleet fleet broker-files`; do not edit (it is rewritten).",
            "per_listener_settings false",
            "allow_anonymous false",
            f"listener {listener.port}{bind}",
            "protocol mqtt",
            f"user {user}",
            "# Auth and ACLs, SUBSCRIBE included, and client ids bound to their username.",
            f"plugin {find_plugin(listener.plugin)}",
            f"plugin_opt_config_file {folder / DYNSEC_FILE}",
            "# In-flight and queued QoS 1 messages and persistent sessions survive a restart.",
            "persistence true",
            f"persistence_location {folder / 'data'}/",
            "autosave_interval 30",
            "persistent_client_expiration 14d",
            "# What one absent client's session may hold (docs/operations.md, 'Broker limits').",
            "max_queued_messages 100000",
            f"max_queued_bytes {listener.max_queued_bytes}",
            f"max_packet_size {MAX_PACKET_BYTES}",
            "max_inflight_messages 200",
            "max_keepalive 300",
            "set_tcp_nodelay true",
            f"log_dest file {folder / 'mosquitto.log'}",
            "log_type error",
            "log_type warning",
            "log_type notice",
            "# SIGHUP (after `fleet revoke` with a device CA) re-reads the CRL of TLS listeners.",
            f"pid_file {folder / 'mosquitto.pid'}",
            "# Extra listeners (e.g. the mutual-TLS block `fleet ca-broker` prints) go here.",
            f"include_dir {folder / 'conf.d'}",
            "",
        ]
    )


def write_broker_files(
    registry: DeviceRegistry,
    folder: Path,
    listener: BrokerListener = BrokerListener(),
    topics: Topics = Topics(),
    *,
    readable_by_gid: int | None = None,
) -> BrokerFiles:
    """Write `mosquitto.conf` and the plugin's state under `folder` from the registry.

    The folder is 0700 (0770 for group `gid`) and the files 0600 (0660): the plugin writes
    its state back to its file, so a broker running as another user (Mosquitto's own
    container runs as uid/gid 1883) needs group write where `readable_by_gid` is given.
    Without it, a rewrite keeps the group access the folder already has.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "data").mkdir(exist_ok=True)
    (folder / "conf.d").mkdir(exist_ok=True)
    gid = readable_by_gid if readable_by_gid is not None else _group_access(folder)
    mode = 0o600 if gid is None else 0o660
    for path in (folder, folder / "data", folder / "conf.d"):
        if gid is not None:
            os.chown(path, -1, gid)
        os.chmod(path, 0o700 if gid is None else 0o770)
    files = BrokerFiles(folder / CONF_FILE, folder / DYNSEC_FILE)
    devices = registry.accounts.devices()
    services = registry.accounts.services()
    state = render_dynsec(devices, services, topics)
    write_private(files.dynsec_file, json.dumps(state, indent=2) + "\n", mode=mode, gid=gid)
    write_private(files.config_file, render_mosquitto_conf(folder, listener), mode=mode, gid=gid)
    log.info(
        "wrote broker files",
        extra={"devices": len(devices), "service_accounts": len(services), "dir": str(folder)},
    )
    return files


# --- EMQX (5.x) built-in authentication and file authorization ---------------------------

EMQX_HASH_ALGORITHM = {"name": "pbkdf2", "mac_fun": "sha512", "iterations": 101, "dk_length": 64}


def emqx_users(
    accounts: Iterable[tuple[str, str]], superusers: Iterable[str] = ()
) -> list[dict[str, Any]]:
    """Records for EMQX's built-in database authenticator ("Import users", JSON format).

    Configure the authenticator with `password_hash_algorithm` = EMQX_HASH_ALGORITHM and
    `salt_position` irrelevant for pbkdf2; `password_hash` is lowercase hex and `salt` the
    salt text, the same PBKDF2-SHA512 digests the Mosquitto state carries.
    """
    supers = set(superusers)
    users = []
    for username, encoded in accounts:
        iterations, salt, digest = parse_mosquitto_hash(encoded)
        if iterations != EMQX_HASH_ALGORITHM["iterations"]:
            raise ConfigError(f"{username}: {iterations} iterations; the export assumes 101")
        users.append(
            {
                "user_id": username,
                "password_hash": digest.hex(),
                "salt": salt.decode("ascii"),
                "is_superuser": username in supers,
            }
        )
    return users


def render_emqx_acl(
    devices: Iterable[str], service_users: Iterable[str], topics: Topics = Topics()
) -> str:
    """EMQX `acl.conf` (file authorizer, Erlang terms) with the same rules as Mosquitto's.

    A device's rules hold only for its own username *and* client id, and it may not
    subscribe to any shared subscription.
    """

    def quoted(items: Iterable[str]) -> str:
        return ", ".join(json.dumps(i) for i in items)

    root = topics.root
    out = ["%% Generated by `edgefleet fleet` from the device registry; do not edit."]
    for user in service_users:
        if user != CLOUD_ACCOUNT:
            continue
        filters = [root + "/#", f"$share/+/{root}/#"]
        out.append(f'{{allow, {{username, "{user}"}}, subscribe, [{quoted(filters)}]}}.')
        writes = [topics.all_devices(c) for c in CLOUD_WRITE]
        out.append(f'{{allow, {{username, "{user}"}}, publish, [{quoted(writes)}]}}.')
    for device in devices:
        user, client = json.dumps(device), json.dumps(device_client_id(device))
        who = f"{{'and', [{{username, {user}}}, {{clientid, {client}}}]}}"
        pubs = [topics.for_device(device, c) for c in DEVICE_PUBLISH]
        reads = [json.dumps(topics.for_device(device, c)) for c in DEVICE_READ]
        subs = ", ".join(f"{{eq, {topic}}}" for topic in reads)
        out.append(f"{{allow, {who}, publish, [{quoted(pubs)}]}}.")
        out.append(f"{{allow, {who}, subscribe, [{subs}]}}.")
    out.append("{deny, all}.")
    return "\n".join(out) + "\n"


def write_emqx_files(registry: DeviceRegistry, out_dir: Path, topics: Topics = Topics()) -> Path:
    """`emqx-users.json` (built-in database import) and `emqx-acl.conf` under `out_dir`."""
    devices = registry.accounts.devices()
    services = [s for s in registry.accounts.services() if s[0] == CLOUD_ACCOUNT]
    out_dir.mkdir(parents=True, exist_ok=True)
    users = emqx_users([*services, *devices])
    write_private(out_dir / "emqx-users.json", json.dumps(users, indent=2) + "\n")
    write_private(
        out_dir / "emqx-acl.conf",
        render_emqx_acl([d for d, _ in devices], [u for u, _ in services], topics),
    )
    return out_dir


def write_private(
    path: Path, text: str, *, mode: int = 0o600, gid: int | None = None, uid: int | None = None
) -> None:
    """Atomic write with mode 0600: a reader sees the old file or the new one, never half.

    `mode` may add group access (0640, 0660) for a broker in another container; `gid` is
    then that group (the writer must be root or a member of it). `uid` gives the file to
    another user (a container's), which needs root.
    """
    if mode & 0o007:
        raise ConfigError(f"{path}: mode {mode:o} would let others read or write a secret")
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    try:
        if gid is not None or uid is not None:
            os.chown(tmp, -1 if uid is None else uid, -1 if gid is None else gid)
        os.chmod(tmp, mode)
    except PermissionError as exc:
        tmp.unlink(missing_ok=True)
        whom = f"uid {uid}" if uid is not None else f"group {gid}"
        raise ConfigError(
            f"cannot give {whom} access to {path}: {exc}",
            hint="run as root, or as a member of that group",
        ) from None
    os.replace(tmp, path)


def _group_access(folder: Path) -> int | None:
    """The group an existing broker folder is shared with (group-writable, 0770), or None."""
    try:
        st = folder.stat()
    except FileNotFoundError:
        return None
    return st.st_gid if stat.S_IMODE(st.st_mode) & 0o020 else None
