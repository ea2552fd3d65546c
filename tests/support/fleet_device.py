"""A lightweight device process speaking the real MQTT contract, for rollout tests.

`python -m tests.support.fleet_device --device cam-01 --key HEX --port N --password P
--state DIR` connects to the broker with the device's credentials, publishes a signed
`online` status (last will: `offline`), subscribes to its retained `desired` topic,
verifies each desired state's signature, applies it with the real
`edgefleet.edge.updater.DesiredStateApplier` (ONNX Runtime loads and warms the models; the
"image" runs as a process through `ProcessRuntime`; with `--runtime none` it is not
applied, as on an agent without a container runtime; with `--runtime host` it is handed to
a host updater through `--updater-dir`, the process being the agent of `EDGEFLEET_IMAGE`)
and publishes each signed `reported` state, retained. It is the agent minus video: what a
rollout touches.
"""

from __future__ import annotations

import argparse
import logging
import queue
import signal
import sys
import threading
from pathlib import Path

from edgefleet.edge.host_runtime import HostRuntime
from edgefleet.edge.updater import DesiredStateApplier, NullRuntime, Runtime
from edgefleet.shared.errors import PayloadRejected
from edgefleet.shared.messages import DesiredState, DeviceStatus
from edgefleet.shared.mqtt import (
    MqttSettings,
    connect,
    device_client_id,
    from_paho,
    make_client,
    publish,
)
from edgefleet.shared.topics import Topics
from edgefleet.shared.wire import Verifier, WireMessage, encode
from tests.support.fleet import OnnxControl
from tests.support.process_runtime import ProcessRuntime

log = logging.getLogger("fleet_device")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", required=True)
    parser.add_argument("--key", required=True, help="device key, hex")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--password", required=True)
    parser.add_argument("--state", type=Path, required=True)
    parser.add_argument("--runtime", choices=["process", "none", "host"], default="process")
    parser.add_argument("--updater-dir", type=Path, help="with --runtime host")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format=f"{args.device} %(levelname)s %(message)s")

    key = bytes.fromhex(args.key)
    topics = Topics()
    settings = MqttSettings(port=args.port, username=args.device, password=args.password)
    will = encode(
        DeviceStatus(device_id=args.device, state="offline", agent_version="sim"),
        key,
        topics.status(args.device),
    )
    client = make_client(settings, device_client_id(args.device), will=will)
    verifier = Verifier(
        lambda d: key if d == args.device else None, max_skew_s=10 * 365 * 86400
    )  # a retained desired state may be old when a device comes back: the signature decides
    work: queue.Queue[tuple[DesiredState, WireMessage] | None] = queue.Queue()

    def report(state) -> None:
        publish(client, encode(state, key, topics.reported(args.device)), qos=1, retain=True)

    control = OnnxControl(report)
    process = ProcessRuntime(
        [sys.executable, "-c", "import time\nwhile True: time.sleep(1)"], settle_s=0.2
    )
    runtime: Runtime = process if args.runtime == "process" else NullRuntime()
    if args.runtime == "host":  # the image it is comes from EDGEFLEET_IMAGE, as in a container
        runtime = HostRuntime(args.updater_dir, poll_s=0.1)
    applier = DesiredStateApplier(control, args.state, runtime)

    def on_connect(c, userdata, flags, reason_code, properties) -> None:
        if reason_code.is_failure:
            log.error("broker refused: %s", reason_code)
            return
        c.subscribe(topics.desired(args.device), qos=1)
        online = DeviceStatus(device_id=args.device, state="online", agent_version="sim")
        publish(c, encode(online, key, topics.status(args.device)), qos=1, retain=True)

    def on_message(c, userdata, message) -> None:
        if not message.payload:
            return  # a cleared retained desired state: keep running what runs
        wire = from_paho(message)
        try:
            verified = verifier.verify(wire)
        except PayloadRejected as exc:
            log.warning("rejected desired state: %s", exc)
            return
        if isinstance(verified.message, DesiredState):
            work.put((verified.message, wire))

    client.on_connect = on_connect
    client.on_message = on_message
    stop = threading.Event()
    stop_waiting = getattr(runtime, "stop_waiting", lambda: None)
    signal.signal(signal.SIGTERM, lambda *_: (stop.set(), stop_waiting(), work.put(None)))
    connect(client, settings, clean_start=True)
    while not stop.is_set():
        item = work.get()
        if item is None:
            break
        desired, signed = item
        log.info("applying %s", desired.deployment_id)
        applier.handle(desired, signed=signed)
    process.stop()
    client.disconnect()
    client.loop_stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
