"""A real RTSP camera for the tests: GStreamer's RTSP server (gst-rtsp-server, the library
behind most software RTSP cameras) serving a live H.264 test pattern at rtsp://127.0.0.1:PORT/live.

It runs under Debian's python3, whose `gi` bindings reach the system's GStreamer (the
project's virtual environment has neither), so it imports nothing of the project:

    /usr/bin/python3 -I tests/support/rtsp_server.py PORT   (-I: its folder holds a types.py)

It prints `ready` once the port is bound.
"""

from __future__ import annotations

import sys

import gi

gi.require_version("Gst", "1.0")
gi.require_version("GstRtspServer", "1.0")
from gi.repository import GLib, Gst, GstRtspServer  # noqa: E402

# A keyframe every 10 frames (1 s): a client that reconnects decodes within a second.
LAUNCH = (
    "( videotestsrc is-live=true pattern=ball ! video/x-raw,width=320,height=240,framerate=10/1"
    " ! x264enc tune=zerolatency speed-preset=ultrafast key-int-max=10"
    " ! rtph264pay name=pay0 pt=96 config-interval=1 )"
)


def main(port: int) -> None:
    Gst.init(None)
    server = GstRtspServer.RTSPServer()
    server.set_address("127.0.0.1")
    server.set_service(str(port))
    factory = GstRtspServer.RTSPMediaFactory()
    factory.set_launch(LAUNCH)
    factory.set_shared(True)  # one encoder for every client, as a camera has
    server.get_mount_points().add_factory("/live", factory)
    if server.attach(None) == 0:
        sys.exit(f"could not bind 127.0.0.1:{port}")
    print("ready", flush=True)
    GLib.MainLoop().run()


if __name__ == "__main__":
    main(int(sys.argv[1]))
