"""`edgefleet fleet ...`: enrollment, credentials, broker files, rollouts and fleet status.

One scheme, two kinds of command:
- credential commands (`enroll`, `revoke`, `broker-files`, `model-add`, `ca-*`) run on the
  cloud host and work on the store directly (`--db URL`, default: the cloud's store);
- operational commands (`deploy`, `deployment`, `status`) go through the cloud's REST API
  when `--api URL --api-key KEY` are given (or EDGEFLEET_API_URL / EDGEFLEET_API_KEY), as
  an operator would from a laptop; `status` also reads the store directly without them.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import httpx
import typer
from rich.console import Console, JustifyMethod
from rich.live import Live
from rich.table import Table

from edgefleet.shared.config import load_settings
from edgefleet.shared.errors import EdgefleetError, InvalidInput, NotFound

if TYPE_CHECKING:
    from edgefleet.fleet.broker_control import BrokerControl
    from edgefleet.fleet.settings import FleetSettings

app = typer.Typer(
    help="Fleet: enroll devices, broker credentials and ACLs, rollouts, status.\n\n"
    "Run enroll, revoke, broker-files, model-add and ca-* on the cloud host (they use its "
    "store); deploy, deployment and status go through the cloud API with --api/--api-key "
    "(or EDGEFLEET_API_URL / EDGEFLEET_API_KEY).\n\n"
    "Example: edgefleet fleet enroll cam-01 --group dock\n\n"
    "Example: edgefleet fleet status --watch",
    no_args_is_help=True,
)
console = Console()

ConfigOpt = Annotated[Path | None, typer.Option("--config", "-c", help="fleet.yaml")]
DbOpt = Annotated[
    str | None, typer.Option("--db", help="store URL (default: the cloud's, from settings)")
]
ApiOpt = Annotated[
    str | None, typer.Option("--api", envvar="EDGEFLEET_API_URL", help="cloud REST base URL")
]
KeyOpt = Annotated[
    str | None, typer.Option("--api-key", envvar="EDGEFLEET_API_KEY", help="operator API key")
]
DeviceArg = Annotated[str, typer.Argument(help="device id, e.g. cam-01")]
DeploymentArg = Annotated[
    str, typer.Argument(help="deployment id, as printed by `edgefleet fleet deploy`")
]
BundlesOpt = Annotated[Path | None, typer.Option(help="bundle directory (overrides settings)")]


def _fail(exc: Exception) -> typer.Exit:
    typer.secho(f"error: {exc}", fg="red", err=True)
    return typer.Exit(2)


def _settings(config: Path | None, db: str | None, **overrides: Any) -> FleetSettings:
    from edgefleet.fleet.settings import FleetSettings

    if db:
        overrides["database_url"] = db
    return load_settings(FleetSettings, config, **overrides)


def _refuse_missing_sqlite(url: str, config: Path | None) -> None:
    """A reading command must not create an empty store where none was: it would show an
    empty fleet instead of saying that it looked in the wrong place."""
    from urllib.parse import unquote, urlparse

    parsed = urlparse(url)
    path = Path(unquote(parsed.path))
    if parsed.scheme == "sqlite" and path.name != ":memory:" and not path.exists():
        where = f"the data_dir of {config}" if config else "the default data_dir"
        raise NotFound(
            f"no device store at {path} ({where})",
            hint="pass -c fleet.yaml or --db URL of the cloud's store, or --api URL to ask "
            "the cloud",
        )


class _Store:
    """The registry (and friends) on the store named by the settings."""

    def __init__(
        self, config: Path | None, db: str | None, *, create: bool = True, **overrides: Any
    ):
        from edgefleet.fleet.registry import DeviceRegistry
        from edgefleet.shared.db import Database

        self.settings = _settings(config, db, **overrides)
        url = self.settings.resolved_database_url()
        if not create:
            _refuse_missing_sqlite(url, config)
        self.db = Database.connect(url)
        self.registry = DeviceRegistry(self.db, master_key=self.settings.master_key())

    @property
    def broker_dir(self) -> Path:
        return self.settings.resolved_broker_dir()

    def write_broker_files(self, *, readable_by_gid: int | None = None) -> Path:
        from edgefleet.fleet.acl import BrokerListener, write_broker_files

        s = self.settings
        listener = BrokerListener(
            s.broker_port,
            s.broker_bind,
            s.broker_plugin,
            s.broker_user,
            max_queued_bytes=s.broker_max_queued_mb * 2**20,
        )
        files = write_broker_files(
            self.registry, self.broker_dir, listener, readable_by_gid=readable_by_gid
        )
        return files.folder

    def broker_control(self) -> BrokerControl | None:
        """The running broker's control API as `ef-admin`; None before `broker-files` ran."""
        from edgefleet.fleet.broker_control import BrokerControl

        secret = self.broker_dir / "admin.secret"
        if not secret.is_file():
            return None
        s = self.settings
        host = s.broker_admin_host or s.broker_host
        return BrokerControl(host, s.broker_port, secret.read_text().strip())

    def apply_live(self, change: Callable[[BrokerControl], object]) -> str:
        """Apply `change(control)` to the running broker; what happened, in words.

        No broker answering is fine (it loads the rewritten file when it starts); a broker
        that answers and refuses raises BrokerRefused.
        """
        from edgefleet.fleet.broker_control import BrokerUnreachable

        control = self.broker_control()
        if control is None:
            return "no ef-admin account yet (`fleet broker-files`): the broker file only"
        try:
            change(control)
        except BrokerUnreachable as exc:
            return f"{exc}: it reads the rewritten file when it starts"
        return f"applied to the running broker at {control.host}:{control.port}"

    def close(self) -> None:
        self.db.close()


@contextlib.contextmanager
def _open_store(config: Path | None, db: str | None, **overrides: Any) -> Iterator[_Store]:
    """The store for one credential command, closed after it; its errors exit 2 (`_fail`)."""
    try:
        store = _Store(config, db, **overrides)
        try:
            yield store
        finally:
            store.close()
    except EdgefleetError as exc:
        raise _fail(exc) from None


@app.command()
def enroll(
    device: DeviceArg,
    group: Annotated[str, typer.Option(help="device group (rollouts target groups)")] = "default",
    config: ConfigOpt = None,
    db: DbOpt = None,
    bundles: BundlesOpt = None,
    owner: Annotated[
        str | None,
        typer.Option(
            metavar="UID[:GID]",
            help="give the bundle to this user (needs root); the edge images run as "
            "10001:10001, which cannot read a bundle root owns",
        ),
    ] = None,
) -> None:
    """Create DEVICE: key, broker credential, REST token, ACL entry and its bundle (0600).

    Mount the bundle on the device; the broker's password and ACL files are rewritten.

    Example: sudo edgefleet fleet enroll cam-01 --group dock --owner 10001:10001
    """
    from edgefleet.fleet.broker_control import BrokerRefused
    from edgefleet.fleet.bundle import Owner, write_bundle

    try:
        bundle_owner = Owner.parse(owner) if owner is not None else None
        if bundle_owner is not None:
            bundle_owner.check_can_give()
    except EdgefleetError as exc:
        raise _fail(exc) from None
    with _open_store(config, db) as store:
        enrollment = store.registry.enroll(device, group=group)
        try:
            store.write_broker_files()
            live = store.apply_live(
                lambda control: control.add_device(device, enrollment.broker_password)
            )
        except (BrokerRefused, OSError) as exc:
            # all or nothing: a device the broker does not know must not look enrolled
            store.registry.revoke(device)
            store.write_broker_files()
            raise _fail(exc) from None
        s = store.settings
        out = write_bundle(
            enrollment,
            bundles or s.bundles_dir,
            broker_host=s.broker_host,
            broker_port=s.broker_port,
            public_url=s.public_url,
            mount=s.bundle_mount,
            owner=bundle_owner,
        )
    console.print(f"[green]enrolled[/] {device} in group [bold]{group}[/]")
    if s.master_key() is None:
        typer.secho(
            "warning: no device_master_key: the device key is stored unsealed in the store; "
            "whoever reads the store can sign as this device",
            fg="yellow",
            err=True,
        )
    console.print(
        f"bundle: {out} (the edge container mounts it at /etc/edgefleet; on a host: "
        f"edgefleet edge run -c {out}/edge.yaml)"
    )
    if bundle_owner is None:
        console.print(
            f"owner: uid {os.geteuid()}; the edge images run as 10001 and cannot read it: "
            f"`sudo chown -R 10001:10001 {out}` or enroll with --owner 10001:10001"
        )
    console.print(f"broker: {live}")


@app.command()
def revoke(
    device: DeviceArg,
    config: ConfigOpt = None,
    db: DbOpt = None,
    bundles: BundlesOpt = None,
) -> None:
    """Remove DEVICE everywhere: credentials, broker files (+ reload), CRL, its bundle.

    Example: edgefleet fleet revoke cam-01
    """
    from edgefleet.fleet.acl import reload_broker
    from edgefleet.fleet.broker_control import BrokerRefused
    from edgefleet.fleet.bundle import remove_bundle
    from edgefleet.fleet.ca import DeviceCA

    with _open_store(config, db) as store:
        store.registry.revoke(device)
        ca_dir = store.settings.ca_dir
        crl_changed = False
        if ca_dir is not None and DeviceCA(ca_dir).exists:
            # no cert issued: nothing to put on the CRL
            with contextlib.suppress(NotFound):
                DeviceCA(ca_dir).revoke(device)
                crl_changed = True
        broker_dir = store.write_broker_files()
        if crl_changed:
            reload_broker(broker_dir)
        removed = remove_bundle(bundles or store.settings.bundles_dir, device)
        try:
            live = store.apply_live(lambda control: _remove_live(control, device))
        except BrokerRefused as exc:
            typer.secho(
                f"error: {device} is revoked in the registry and in {broker_dir}, but the "
                f"running broker refused the change ({exc}); restart the broker now",
                fg="red",
                err=True,
            )
            raise typer.Exit(2) from None
    console.print(f"[yellow]revoked[/] {device}; broker files rewritten in {broker_dir}")
    console.print(f"broker: {live}")
    if removed:
        console.print("its bundle was deleted")


def _remove_live(control: Any, device: str) -> None:
    """Off the running broker: its account (it is disconnected), then what it left retained."""
    control.remove_device(device)
    control.clear_retained(device)


@app.command("broker-files")
def broker_files(
    config: ConfigOpt = None,
    db: DbOpt = None,
    out: Annotated[Path | None, typer.Option(help="broker folder (default: settings)")] = None,
    emqx: Annotated[bool, typer.Option(help="also write the EMQX export")] = False,
    readable_by_gid: Annotated[
        int | None,
        typer.Option(
            help="share the broker folder with group GID (0770, files 0660) for a broker "
            "running as another user (eclipse-mosquitto: 1883); later enroll/revoke keep it"
        ),
    ] = None,
) -> None:
    """Write everything the broker needs into the broker folder (settings: broker_dir).

    mosquitto.conf (listener on broker_port, persistence, the dynamic-security plugin),
    the plugin's state from the registry (devices, the `cloud` and `ef-admin` accounts,
    per-device ACLs on publish *and* subscribe, client ids bound to their device), and
    `cloud.secret` / `admin.secret` (0600) the first time. Start the broker with
    `mosquitto -c <broker folder>/mosquitto.conf`; restart it after running this again.

    Example:
      edgefleet fleet broker-files -c fleet.yaml
      edgefleet fleet broker-files --readable-by-gid 1883 --emqx
    """
    from edgefleet.fleet.acl import ADMIN_ACCOUNT, CLOUD_ACCOUNT, write_emqx_files, write_private

    with _open_store(config, db, **({"broker_dir": out} if out else {})) as store:
        target = store.broker_dir
        target.mkdir(parents=True, exist_ok=True)
        new = {}
        for account in (CLOUD_ACCOUNT, ADMIN_ACCOUNT):
            password = store.registry.accounts.ensure_service(account)
            if password:
                secret = target / f"{'admin' if account == ADMIN_ACCOUNT else account}.secret"
                write_private(secret, password + "\n")
                new[account] = secret
        folder = store.write_broker_files(readable_by_gid=readable_by_gid)
        if emqx:
            write_emqx_files(store.registry, target)
    console.print(f"wrote {folder / 'mosquitto.conf'} and {folder / 'dynamic-security.json'}")
    for account, secret in new.items():
        console.print(f"new `{account}` broker password in {secret} (0600)")
    console.print(f"start the broker with: mosquitto -c {folder / 'mosquitto.conf'}")


@app.command("model-add")
def model_add(
    name: Annotated[str, typer.Argument(help="model name (letters, digits, . _ -)")],
    version: Annotated[str, typer.Argument(help="version; a stored version never changes")],
    file: Annotated[Path, typer.Argument(help="the model file to copy into the store")],
    config: ConfigOpt = None,
    store_dir: Annotated[
        Path | None, typer.Option(help="model store (default data_dir/models)")
    ] = None,
) -> None:
    """Put an ONNX model file in the cloud's model store so deployments can name it
    NAME@VERSION. A file that is not an ONNX model is refused (exit 2).

    Example: edgefleet fleet model-add det 3 det-3.onnx
    """
    from edgefleet.fleet.models import ModelStore
    from edgefleet.fleet.onnx_file import check_onnx

    try:
        check_onnx(file)
        s = _settings(config, None)
        stored = ModelStore(store_dir or s.data_dir / "models", s.public_url).add(
            name, version, file
        )
    except EdgefleetError as exc:
        raise _fail(exc) from None
    console.print(f"{name}@{version}: {stored.size} bytes, sha256 {stored.sha256}")


def _parse_model(text: str) -> dict[str, Any]:
    """`NAME@VER` (from the cloud's model store) or `NAME@VER=URL#SHA256`."""
    ref, _, explicit = text.partition("=")
    name, at, version = ref.partition("@")
    if not name or not at or not version:
        raise InvalidInput(f"--model {text!r}: use NAME@VERSION or NAME@VERSION=URL#SHA256")
    model: dict[str, Any] = {"name": name, "version": version}
    if explicit:
        url, hashmark, sha = explicit.rpartition("#")
        if not hashmark:
            raise InvalidInput(f"--model {text!r}: an explicit URL needs #SHA256 after it")
        model.update(url=url, sha256=sha)
    return model


def _parse_canary(text: str) -> float:
    try:
        value = float(text.strip().rstrip("%"))
    except ValueError:
        raise InvalidInput(f"--canary {text!r}: use a percentage such as 10%") from None
    return value


def _client(api: str | None, api_key: str | None) -> httpx.Client:
    if not api or not api_key:
        raise InvalidInput(
            "this command talks to the cloud API",
            hint="pass --api URL --api-key KEY (or EDGEFLEET_API_URL / EDGEFLEET_API_KEY)",
        )
    return httpx.Client(
        base_url=api.rstrip("/"), headers={"Authorization": f"Bearer {api_key}"}, timeout=30
    )


def _check(resp: httpx.Response) -> dict[str, Any]:
    if resp.status_code >= 400:
        try:
            err = resp.json()["error"]
            message = f"{err['code']}: {err['message']}"
        except (ValueError, KeyError, TypeError):
            message = resp.text[:500]
        raise EdgefleetError(f"HTTP {resp.status_code} {message}")
    body: dict[str, Any] = resp.json()
    return body


@app.command()
def deploy(
    group: Annotated[str, typer.Option(help="device group")],
    image: Annotated[
        str,
        typer.Option(help="image by digest (repo@sha256:...) or tag; a tag is resolved once"),
    ],
    model: Annotated[list[str], typer.Option(help="NAME@VER or NAME@VER=URL#SHA256")] = [],  # noqa: B006
    canary: Annotated[str, typer.Option(help="share of the group that goes first")] = "10%",
    auto_rollback: Annotated[
        bool,
        typer.Option("--auto-rollback/--no-auto-rollback", help="roll canaries back on failure"),
    ] = True,
    soak: Annotated[float, typer.Option(help="seconds canaries must stay healthy")] = 30.0,
    min_fps: Annotated[float | None, typer.Option(help="canary bound: total fps at least")] = None,
    max_p95: Annotated[float | None, typer.Option(help="canary bound: p95 latency ms")] = None,
    pipeline: Annotated[Path | None, typer.Option(help="pipeline config YAML")] = None,
    wait: Annotated[
        bool,
        typer.Option(help="follow progress until it ends; exit 1 unless it completed"),
    ] = False,
    api: ApiOpt = None,
    api_key: KeyOpt = None,
) -> None:
    """Roll an image + models + pipeline config out to GROUP: canaries first, then the rest.

    A tag is resolved to its digest by the fleet, against the registry the image names, and
    the devices are sent that digest. Needs the cloud API (--api/--api-key or
    EDGEFLEET_API_URL / EDGEFLEET_API_KEY). With --wait the exit status is 0 only when the
    rollout completed (1 when it was rolled back, failed or halted), so a script can stop
    on a bad model.

    Examples:
      edgefleet fleet deploy --group dock --image registry.acme:5000/edge:1.4.2 --model det@3
      edgefleet fleet deploy --group dock --image registry.acme:5000/edge@sha256:<hex> --wait
    """
    import yaml

    try:
        body = {
            "group": group,
            "image": image,
            "models": [_parse_model(m) for m in model],
            "config": yaml.safe_load(pipeline.read_text()) or {} if pipeline else {},
            "canary_percent": _parse_canary(canary),
            "auto_rollback": auto_rollback,
            "soak_s": soak,
            "min_fps": min_fps,
            "max_latency_p95_ms": max_p95,
        }
        with _client(api, api_key) as client:
            dep = _check(client.post("/v1/deployments", json=body))
            console.print(f"deployment [bold]{dep['id']}[/]: image {dep['image']}")
            console.print(f"canaries {', '.join(dep['canaries'])}")
            while wait and dep["status"] in ("canary", "rolling"):
                time.sleep(2)
                dep = _check(client.get(f"/v1/deployments/{dep['id']}"))
                console.print(f"  {dep['status']}: {_counts(dep['counts'])}")
    except (EdgefleetError, OSError, httpx.HTTPError) as exc:
        raise _fail(exc) from None
    colour = "green" if dep["status"] in ("canary", "rolling", "completed") else "red"
    console.print(
        f"status: [{colour}]{dep['status']}[/]" + (f" ({dep['error']})" if dep.get("error") else "")
    )
    if wait and dep["status"] != "completed":
        raise typer.Exit(1)


def _counts(counts: dict[str, int]) -> str:
    """Targets per state as an operator reads them: `2 healthy, 1 applying`."""
    return ", ".join(f"{n} {state}" for state, n in counts.items() if n) or "no targets"


def _deployment_call(method: str, deployment_id: str, api: str | None, key: str | None) -> Any:
    """One request on /v1/deployments/{id}; its errors exit 2 (`_fail`)."""
    try:
        with _client(api, key) as client:
            return _check(client.request(method, f"/v1/deployments/{deployment_id}"))
    except (EdgefleetError, httpx.HTTPError) as exc:
        raise _fail(exc) from None


@app.command()
def deployment(
    deployment_id: DeploymentArg,
    api: ApiOpt = None,
    api_key: KeyOpt = None,
) -> None:
    """Show one deployment's status and each target device's role, state and error.

    Needs the cloud API (--api/--api-key or EDGEFLEET_API_URL / EDGEFLEET_API_KEY).

    Example: edgefleet fleet deployment dep-3f2a9c1b7e04
    """
    dep = _deployment_call("GET", deployment_id, api, api_key)
    table = Table(title=f"{dep['id']} · {dep['group']} · {dep['image']} · {dep['status']}")
    for col in ("device", "role", "state", "error"):
        table.add_column(col)
    for t in dep["targets"]:
        table.add_row(t["device_id"], t["role"], t["state"], t["error"] or "")
    console.print(table)


@app.command()
def rollback(
    deployment_id: DeploymentArg,
    api: ApiOpt = None,
    api_key: KeyOpt = None,
) -> None:
    """Stop an active rollout: every device it reached gets its previous state back.

    Needs the cloud API (--api/--api-key or EDGEFLEET_API_URL / EDGEFLEET_API_KEY).

    Example: edgefleet fleet rollback dep-3f2a9c1b7e04
    """
    dep = _deployment_call("DELETE", deployment_id, api, api_key)
    console.print(f"[yellow]{dep['id']}[/] {dep['status']}: {dep['error']}")


def _ago(value: str | None) -> str:
    if not value:
        return "never"
    seen = datetime.fromisoformat(value.replace("Z", "+00:00"))
    s = (datetime.now(timezone.utc) - seen).total_seconds()
    return (
        f"{s:.0f}s ago" if s < 120 else f"{s / 60:.0f}m ago" if s < 7200 else f"{s / 3600:.0f}h ago"
    )


def status_table(devices: list[dict[str, Any]]) -> Table:
    """The fleet as a rich table, coloured by health."""
    table = Table(title=f"{len(devices)} devices", header_style="bold")
    columns: tuple[tuple[str, JustifyMethod], ...] = (
        ("device", "left"),
        ("group", "left"),
        ("online", "left"),
        ("deployment", "left"),
        ("fps", "right"),
        ("temp °C", "right"),
        ("outbox", "right"),
        ("last seen", "right"),
    )
    for col, justify in columns:
        table.add_column(col, justify=justify)
    for d in devices:
        online = "[green]● online[/]" if d["online"] else "[red]○ offline[/]"
        status = d.get("deployment_status")
        dcol = {"healthy": "green", "applying": "yellow", "failed": "red"}.get(status or "", "dim")
        dep = f"[{dcol}]{d['deployment_id']} {status}[/]" if d.get("deployment_id") else "–"
        temp = d.get("gpu_temp")
        tcol = "red" if temp and temp >= 85 else "yellow" if temp and temp >= 75 else "default"
        outbox = d.get("outbox_depth")
        ocol = (
            "red"
            if outbox and outbox >= 1000
            else "yellow"
            if outbox and outbox >= 100
            else "default"
        )
        table.add_row(
            d["device_id"],
            d["group"],
            online,
            dep,
            f"{d['fps']:.1f}" if d.get("fps") is not None else "–",
            f"[{tcol}]{temp:.0f}[/]" if temp is not None else "–",
            f"[{ocol}]{outbox}[/]" if outbox is not None else "–",
            _ago(d.get("last_seen")),
        )
    return table


@app.command()
def status(
    group: Annotated[str | None, typer.Option(help="only this group")] = None,
    watch: Annotated[bool, typer.Option(help="refresh until Ctrl-C")] = False,
    interval: Annotated[float, typer.Option(help="refresh period (s) with --watch")] = 2.0,
    config: ConfigOpt = None,
    db: DbOpt = None,
    api: ApiOpt = None,
    api_key: KeyOpt = None,
) -> None:
    """Table of devices: group, online, deployment, fps, temperature, outbox, last seen.

    Reads the cloud API when --api (or EDGEFLEET_API_URL) is set, else the store (-c, --db).

    Example: edgefleet fleet status --group dock --watch
    """
    try:
        if api:
            client = _client(api, api_key)
            params = {"group": group} if group else {}

            def fetch() -> list[dict[str, Any]]:
                devices: list[dict[str, Any]] = _check(client.get("/v1/devices", params=params))[
                    "devices"
                ]
                return devices
        else:
            store = _Store(config, db, create=False)

            def fetch() -> list[dict[str, Any]]:
                return [d.model_dump(mode="json") for d in store.registry.list_devices(group)]

        if not watch:
            console.print(status_table(fetch()))
            return
        if not console.is_terminal:  # a pipe or a log: a live view would show nothing
            while True:
                console.print(status_table(fetch()))
                time.sleep(interval)
        with Live(status_table(fetch()), console=console, refresh_per_second=4) as live:
            while True:
                time.sleep(interval)
                live.update(status_table(fetch()))
    except KeyboardInterrupt:
        return
    except (EdgefleetError, httpx.HTTPError) as exc:
        raise _fail(exc) from None


@app.command("ca-init")
def ca_init(
    directory: Annotated[Path, typer.Option(help="CA directory")] = Path("edgefleet-ca"),
) -> None:
    """Create the device CA for mutual TLS (EC P-256, key 0600).

    Example: edgefleet fleet ca-init --directory /etc/edgefleet/ca
    """
    from edgefleet.fleet.ca import DeviceCA

    try:
        path = DeviceCA(directory).init()
    except EdgefleetError as exc:
        raise _fail(exc) from None
    console.print(f"CA certificate: {path}")


@app.command("ca-issue")
def ca_issue(
    device: DeviceArg,
    directory: Annotated[Path, typer.Option(help="CA directory")] = Path("edgefleet-ca"),
    out: Annotated[Path, typer.Option(help="where the cert and key go")] = Path("."),
) -> None:
    """Issue DEVICE a client certificate (CN = device id) signed by the device CA.

    Run `edgefleet fleet ca-init` first; the device presents the cert and key to the broker.

    Example:
      edgefleet fleet ca-issue cam-01 --directory /etc/edgefleet/ca --out cam-01
    """
    from edgefleet.fleet.ca import DeviceCA

    try:
        cert, key = DeviceCA(directory).issue_device(device, out)
    except EdgefleetError as exc:
        raise _fail(exc) from None
    console.print(f"{cert}\n{key}")


@app.command("ca-broker")
def ca_broker(
    hosts: Annotated[list[str], typer.Argument(help="broker host names or IPs devices dial")],
    directory: Annotated[Path, typer.Option(help="CA directory")] = Path("edgefleet-ca"),
    out: Annotated[Path, typer.Option(help="where the cert and key go")] = Path("."),
    port: Annotated[int, typer.Option(help="TLS listener port")] = 8883,
) -> None:
    """Issue the broker's certificate for HOSTS and print the Mosquitto listener block.

    Put the printed block in conf.d/ of the broker folder; devices then connect with mutual
    TLS (certificate plus their username and password).

    Example:
      edgefleet fleet ca-broker broker.lan 10.0.0.5 --out /etc/mosquitto/tls
    """
    from edgefleet.fleet.ca import DeviceCA, mosquitto_tls_listener

    try:
        ca = DeviceCA(directory)
        cert, key = ca.issue_server(hosts, out)
    except EdgefleetError as exc:
        raise _fail(exc) from None
    console.print(mosquitto_tls_listener(port, ca, cert, key), highlight=False)
