"""Helpers of the generate-route tests: a decoder app over the fake backend, served by uvicorn on a
thread (real sockets: streaming and client disconnects as a client sees them), and a strict parser
of OpenAI's server-sent events."""

from __future__ import annotations

import json
import socket
import threading
import time

from tests.decoder.fakes import ByteTokenizer, FakeBackend

from zoi.serve.app import create_app
from zoi.serve.config import ServeConfig
from zoi.serve.decoder_service import DecoderService

MODEL = "fake-decoder"


class LiveServer:
    def __init__(self, backend: FakeBackend | None = None, **config):
        import uvicorn

        self.backend = backend or FakeBackend()
        cfg = ServeConfig(**config)
        self.service = DecoderService(self.backend, ByteTokenizer(), cfg, MODEL)
        self.app = create_app(self.service)
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(self.app, log_level="warning", lifespan="on"))
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [sock]}, daemon=True
        )
        self.thread.start()
        t0 = time.time()
        while not self.server.started:
            if time.time() - t0 > 30 or not self.thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.01)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)
        assert not self.thread.is_alive()


def parse_sse(raw: bytes) -> list:
    """OpenAI's stream, strictly: events `data: <json>\\n\\n`, the last `data: [DONE]\\n\\n`,
    nothing else. Returns the decoded chunks (without [DONE])."""
    text = raw.decode("utf-8")
    assert text.endswith("data: [DONE]\n\n"), text[-200:]
    events = text.split("\n\n")
    assert events[-1] == ""
    events = events[:-1]
    assert events[-1] == "data: [DONE]"
    out = []
    for ev in events[:-1]:
        assert ev.startswith("data: ") and "\n" not in ev, ev
        out.append(json.loads(ev[len("data: ") :]))
    return out
