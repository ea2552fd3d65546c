"""Live changes to a running Mosquitto through its dynamic-security control API.

The plugin reads its file only when the broker starts, so `enroll` and `revoke` also
tell a running broker, as the `ef-admin` account, on `$CONTROL/dynamic-security/v1`.
Deleting a client makes the broker disconnect it at once: revocation bites immediately.
"""

from __future__ import annotations

import json
import logging
import queue
import secrets
from dataclasses import dataclass, field
from typing import Any

import paho.mqtt.client as mqtt

from edgefleet.fleet.acl import CONTROL_RESPONSE, CONTROL_TOPIC, device_acls, device_role
from edgefleet.shared.errors import EdgefleetError
from edgefleet.shared.mqtt import device_client_id
from edgefleet.shared.topics import Channel, Topics

log = logging.getLogger(__name__)

# Answers that mean "already as asked": deleting what is not there is done.
_ALREADY = ("Client not found", "Role not found")


class BrokerUnreachable(EdgefleetError):
    """No broker answers at the address: it will read the rewritten file when it starts."""


class BrokerRefused(EdgefleetError):
    """The broker answered the control request with an error (or not in time)."""


@dataclass(frozen=True)
class BrokerControl:
    host: str
    port: int
    password: str
    username: str = "ef-admin"
    timeout_s: float = 10.0
    topics: Topics = field(default_factory=Topics)

    def add_device(self, device_id: str, password: str) -> None:
        """Create (or re-create) the device's role and client, bound to its client id."""
        role = device_role(device_id)
        self.run(
            [
                {"command": "deleteClient", "username": device_id},
                {"command": "deleteRole", "rolename": role},
                {
                    "command": "createRole",
                    "rolename": role,
                    "acls": device_acls(device_id, self.topics),
                },
                {
                    "command": "createClient",
                    "username": device_id,
                    "password": password,
                    "clientid": device_client_id(device_id),
                    "roles": [{"rolename": role}],
                },
            ]
        )

    def remove_device(self, device_id: str) -> None:
        """Delete the device's client (the broker disconnects it) and its role."""
        self.run(
            [
                {"command": "deleteClient", "username": device_id},
                {"command": "deleteRole", "rolename": device_role(device_id)},
            ]
        )

    def clear_retained(self, device_id: str) -> None:
        """Remove every retained message on the device's topics (a zero-length retained
        publish each): nothing it left behind is replayed to anyone after a revoke."""
        answers: queue.Queue[Any] = queue.Queue()
        client = self._connected(answers)
        try:
            for channel in Channel:
                topic = self.topics.for_device(device_id, channel)
                client.publish(topic, b"", qos=1, retain=True)
                rc = self._expect(answers, "puback")
                if rc.is_failure:
                    raise BrokerRefused(f"the broker refused to clear {topic}: {rc}")
        finally:
            client.disconnect()
            client.loop_stop()
        log.info("retained messages cleared", extra={"device_id": device_id})

    def _connected(self, answers: queue.Queue[Any]) -> mqtt.Client:
        """An admin client, connected, whose broker answers go to `answers`."""
        client = mqtt.Client(
            mqtt.CallbackAPIVersion.VERSION2,
            client_id=f"ef-admin-{secrets.token_hex(4)}",
            protocol=mqtt.MQTTv5,
        )
        client.username_pw_set(self.username, self.password)
        client.on_connect = lambda c, u, f, rc, p: answers.put(("connack", rc))
        client.on_subscribe = lambda c, u, mid, rcs, p: answers.put(("suback", rcs))
        client.on_message = lambda c, u, msg: answers.put(("response", msg.payload))
        client.on_publish = lambda c, u, mid, rc, p: answers.put(("puback", rc))
        try:
            client.connect(self.host, self.port, keepalive=30, clean_start=True)
        except OSError as exc:
            raise BrokerUnreachable(
                f"no broker at {self.host}:{self.port} ({exc.strerror or exc})"
            ) from None
        client.loop_start()
        try:
            rc = self._expect(answers, "connack")
        except BaseException:
            client.loop_stop()
            raise
        if rc.is_failure:
            client.disconnect()
            client.loop_stop()
            raise BrokerRefused(
                f"the broker refused the {self.username} account: {rc}",
                hint="run `edgefleet fleet broker-files` and restart the broker with it",
            )
        return client

    def run(self, commands: list[dict[str, Any]]) -> None:
        """Send the commands in one request; BrokerRefused names the first that failed."""
        answers: queue.Queue[Any] = queue.Queue()
        client = self._connected(answers)
        try:
            client.subscribe(CONTROL_RESPONSE, qos=1)
            [granted] = self._expect(answers, "suback")
            if granted.is_failure:
                raise BrokerRefused(f"the broker does not let {self.username} read its answers")
            client.publish(CONTROL_TOPIC, json.dumps({"commands": commands}), qos=1)
            body = json.loads(self._expect(answers, "response", skip="puback"))
        finally:
            client.disconnect()
            client.loop_stop()
        for response in body.get("responses", []):
            error = response.get("error")
            if error and error not in _ALREADY:
                raise BrokerRefused(f"broker control {response.get('command')}: {error}")
        log.info("broker control applied", extra={"commands": [c["command"] for c in commands]})

    def _expect(self, answers: queue.Queue[Any], kind: str, skip: str = "") -> Any:
        try:
            got, value = answers.get(timeout=self.timeout_s)
            while got == skip:
                got, value = answers.get(timeout=self.timeout_s)
        except queue.Empty:
            raise BrokerRefused(f"the broker sent no {kind} within {self.timeout_s:g} s") from None
        if got != kind:
            raise BrokerRefused(f"expected {kind} from the broker, got {got}")
        return value
