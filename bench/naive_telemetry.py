"""The naive telemetry consumer, as its own process, for `bench fleet-load --mode drain`.

What a user would write first: one plain paho MQTT 5 client (paho's own property
decoding), auto-ack, every message verified and stored in its own transaction by the same
registry the cloud uses. It keeps a persistent session, so the broker queues for it while
it is paused, exactly as for a replica.
"""

from __future__ import annotations

from multiprocessing.sharedctypes import Synchronized
from multiprocessing.synchronize import Event


def consume(host: str, port: int, db_url: str, stored: Synchronized, subscribed: Event) -> None:
    """Run until killed: count every telemetry message stored in `stored`."""
    import paho.mqtt.client as mqtt
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    from edgefleet.fleet.registry import DeviceRegistry
    from edgefleet.shared.db import Database
    from edgefleet.shared.mqtt import from_paho
    from edgefleet.shared.topics import Channel, Topics
    from edgefleet.shared.wire import Verifier

    registry = DeviceRegistry(Database.connect(db_url))
    verifier = Verifier(key_for_device=registry.device_key)
    topics = Topics()
    client = mqtt.Client(
        mqtt.CallbackAPIVersion.VERSION2, client_id="naive-telemetry", protocol=mqtt.MQTTv5
    )

    def on_message(c: mqtt.Client, userdata: object, message: mqtt.MQTTMessage) -> None:
        verified = verifier.verify(from_paho(message))
        registry.record_telemetry(verified.message)  # type: ignore[arg-type]
        with stored.get_lock():
            stored.value += 1

    def on_connect(c: mqtt.Client, *args: object) -> None:
        c.subscribe(topics.all_devices(Channel.TELEMETRY), qos=1)

    client.on_message = on_message
    client.on_connect = on_connect
    client.on_subscribe = lambda *args: subscribed.set()
    props = Properties(PacketTypes.CONNECT)
    props.SessionExpiryInterval = 600
    client.connect(host, port, clean_start=False, properties=props)
    client.loop_forever()
