"""A fake OpenAI-compatible model server on 127.0.0.1 for tests and the demo.

Behaviour is chosen per model id, so one server can host a healthy model and a
rate-limited one at the same time. Providers may point at ``/p/<provider>/v1``
instead of ``/v1``; then a mode can also be keyed ``"<provider>/<model>"``.

Title-generation calls (requests without tools, see API doc section 4.4) always
get a quick short answer, so a mode only affects the agent's own calls.

Run it alone with ``python -m sandbox.fake_llm --port N``.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, fields
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType, TracebackType
from typing import Any, Self

MODES = frozenset({"ok", "slow", "429", "500", "404", "401", "hang", "tools"})

DEFAULT_TEXT = "Hello from fake LLM."
DEFAULT_TITLE = "Fake title"

# Path of an API call: "/v1/..." or "/p/<provider>/v1/...".
_PATH_RE = re.compile(r"^(?:/p/(?P<provider>[^/]+))?/v1/(?P<endpoint>chat/completions|models)/?$")


@dataclass(frozen=True)
class Behaviour:
    """How the fake answers agent calls for one model."""

    mode: str = "ok"
    delay: float = 3.0  # slow: seconds the response takes; hang: ignored
    interval: float = 0.5  # slow: seconds between keep-alive frames
    retry_after: float | None = None  # 429/500: Retry-After header in seconds
    text: str = DEFAULT_TEXT
    error_type: str | None = None  # 429: "rate_limit_error" (default) or "FreeUsageLimitError"
    error_message: str | None = None
    # tools: the tool calls to make, in order, one per answer: (name, JSON arguments). A name
    # matches the offered tool whose name ends with it ("status" calls "xafhub_status"). After
    # the last one's result the answer is ``text`` plus the tool results it was given.
    calls: tuple[tuple[str, str], ...] = ()


_OPTION_NAMES = frozenset(f.name for f in fields(Behaviour)) - {"mode"}


def make_behaviour(mode: str, opts: Mapping[str, Any]) -> Behaviour:
    """Validate a mode and its options and build the behaviour."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; expected one of {sorted(MODES)}")
    unknown = set(opts) - _OPTION_NAMES
    if unknown:
        raise ValueError(f"unknown option(s) {sorted(unknown)}; expected {sorted(_OPTION_NAMES)}")
    delay = float(opts.get("delay", Behaviour.delay))
    interval = float(opts.get("interval", Behaviour.interval))
    if delay < 0 or interval <= 0:
        raise ValueError(f"delay must be >= 0 and interval > 0, got {delay}, {interval}")
    ra = opts.get("retry_after")
    text = opts.get("text", DEFAULT_TEXT)
    error_type = opts.get("error_type")
    error_message = opts.get("error_message")
    calls: list[tuple[str, str]] = []
    for item in opts.get("calls") or ():
        if not (isinstance(item, (list, tuple)) and len(item) == 2 and isinstance(item[0], str)):
            raise ValueError("calls must be a list of [tool name, arguments object] pairs")
        calls.append((item[0], json.dumps(item[1] or {})))
    if mode == "tools" and not calls:
        raise ValueError("mode tools needs calls")
    if not isinstance(text, str):
        raise ValueError("text must be a string")
    for name, value in (("error_type", error_type), ("error_message", error_message)):
        if value is not None and not isinstance(value, str):
            raise ValueError(f"{name} must be a string or null")
    return Behaviour(
        mode=mode,
        delay=delay,
        interval=interval,
        retry_after=None if ra is None else float(ra),
        text=text,
        error_type=error_type,
        error_message=error_message,
        calls=tuple(calls),
    )


def error_response(b: Behaviour, model: str) -> tuple[int, dict[str, str], dict[str, Any]]:
    """Return (status, extra headers, JSON body) for an error mode."""
    headers: dict[str, str] = {}
    if b.retry_after is not None and b.mode in ("429", "500"):
        ra = b.retry_after
        headers["Retry-After"] = str(int(ra)) if ra == int(ra) else str(ra)
    if b.mode == "429":
        etype = b.error_type or "rate_limit_error"
        msg = b.error_message or (
            "Rate limit exceeded: free usage limit reached. Please try again later."
        )
        return (
            429,
            headers,
            {
                "error": {
                    "message": msg,
                    "type": etype,
                    "param": None,
                    "code": "rate_limit_exceeded",
                }
            },
        )
    if b.mode == "500":
        msg = b.error_message or "The server had an error while processing your request."
        return (
            500,
            headers,
            {
                "error": {
                    "message": msg,
                    "type": b.error_type or "server_error",
                    "param": None,
                    "code": None,
                }
            },
        )
    if b.mode == "404":
        msg = b.error_message or f"The model `{model}` does not exist or you do not have access."
        return (
            404,
            headers,
            {
                "error": {
                    "message": msg,
                    "type": b.error_type or "invalid_request_error",
                    "param": None,
                    "code": "model_not_found",
                }
            },
        )
    if b.mode == "401":
        msg = b.error_message or "Incorrect API key provided."
        return (
            401,
            headers,
            {
                "error": {
                    "message": msg,
                    "type": b.error_type or "invalid_request_error",
                    "param": None,
                    "code": "invalid_api_key",
                }
            },
        )
    raise ValueError(f"mode {b.mode!r} is not an error mode")


def last_user_text(messages: Any) -> str:
    """Return the text of the last user message in an OpenAI ``messages`` list."""
    if not isinstance(messages, list):
        return ""
    for msg in reversed(messages):
        if not isinstance(msg, dict) or msg.get("role") != "user":
            continue
        content = msg.get("content")
        if isinstance(content, str):
            return content
        if isinstance(content, list):
            texts = [p.get("text", "") for p in content if isinstance(p, dict)]
            return "\n".join(t for t in texts if isinstance(t, str))
        return ""
    return ""


def tool_results(messages: Any) -> list[str]:
    """The tool results sent back since the last user message, oldest first."""
    if not isinstance(messages, list):
        return []
    out: list[str] = []
    for msg in messages:
        if not isinstance(msg, dict):
            continue
        if msg.get("role") == "user":
            out = []
        elif msg.get("role") == "tool":
            content = msg.get("content")
            if isinstance(content, list):
                content = "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
            out.append(str(content))
    return out


def split_text(text: str) -> list[str]:
    """Split text into stream deltas that join back to exactly ``text``."""
    return re.findall(r"\S+\s*|\s+", text) or [""]


class Running:
    """``with x:`` runs ``x.start()``, and ``x.stop()`` on the way out, however it is left."""

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class FakeLLM(Running):
    """A fake OpenAI-compatible server; behaviour is set per model id."""

    def __init__(self, port: int = 0, host: str = "127.0.0.1") -> None:
        self._host = host
        self._port = port
        self._lock = threading.Lock()
        self._modes: dict[str | None, Behaviour] = {None: Behaviour()}
        self._log: list[dict[str, Any]] = []
        self._stopping = threading.Event()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        """Bind the port and serve in a background thread."""
        if self._server is not None:
            raise RuntimeError("FakeLLM already started")
        self._stopping.clear()
        server = _QuietServer((self._host, self._port), _make_handler(self))
        # Join handler threads on close; they all watch self._stopping, so this ends.
        server.daemon_threads = True
        server.block_on_close = True
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.1},
            name=f"fake-llm:{server.server_address[1]}",
            daemon=True,
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop serving, release in-flight slow/hang responses and join every thread."""
        server, thread = self._server, self._thread
        if server is None:
            return
        self._stopping.set()
        server.shutdown()
        server.server_close()  # joins handler threads (block_on_close)
        if thread is not None:
            thread.join(timeout=5)
        self._server = None
        self._thread = None

    @property
    def port(self) -> int:
        """Return the bound port."""
        if self._server is None:
            raise RuntimeError("FakeLLM is not running")
        return int(self._server.server_address[1])

    @property
    def base_url(self) -> str:
        """Return ``http://127.0.0.1:PORT`` without the ``/v1`` suffix."""
        return f"http://{self._host}:{self.port}"

    @property
    def url(self) -> str:
        """Return the OpenAI base URL (``.../v1``) to put in a provider's baseURL."""
        return f"{self.base_url}/v1"

    # -- control ---------------------------------------------------------------------------

    def set_mode(self, model: str | None, mode: str, **opts: Any) -> None:
        """Set the behaviour for ``model`` (``None`` = the default for all models)."""
        b = make_behaviour(mode, opts)
        with self._lock:
            self._modes[model] = b

    def reset(self) -> None:
        """Forget all per-model modes and the request log."""
        with self._lock:
            self._modes = {None: Behaviour()}
            self._log.clear()

    def behaviour_for(self, provider: str | None, model: str) -> Behaviour:
        """Return the behaviour for a call: ``provider/model``, then ``model``, then default."""
        with self._lock:
            if provider is not None and f"{provider}/{model}" in self._modes:
                return self._modes[f"{provider}/{model}"]
            return self._modes.get(model, self._modes[None])

    def requests(self) -> list[dict[str, Any]]:
        """Return a copy of the request log."""
        with self._lock:
            return [dict(r) for r in self._log]

    def clear_log(self) -> None:
        """Empty the request log."""
        with self._lock:
            self._log.clear()

    def _record(self, entry: dict[str, Any]) -> None:
        with self._lock:
            self._log.append(entry)

    def _known_models(self) -> list[str]:
        with self._lock:
            names = {k.split("/", 1)[-1] for k in self._modes if k is not None}
        return sorted(names | {"fake-model"})

    def wait_stopping(self, seconds: float | None) -> bool:
        """Sleep up to ``seconds`` (None = until stop); return True if stopping."""
        return self._stopping.wait(seconds)


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        """Ignore clients that went away; report anything else the stdlib way."""
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, TimeoutError)):
            return
        super().handle_error(request, client_address)


def _make_handler(llm: FakeLLM) -> type[BaseHTTPRequestHandler]:
    class Handler(_Handler):
        fake = llm

    return Handler


class _Handler(BaseHTTPRequestHandler):
    # HTTP/1.0: one request per connection, so no thread idles on a keep-alive socket.
    protocol_version = "HTTP/1.0"
    # Bound every socket read/write so a dead peer cannot pin a thread.
    timeout = 30
    fake: FakeLLM

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        """Stay quiet; the request log is available at /_log."""

    # -- plumbing --------------------------------------------------------------------------

    def _send_json(self, status: int, body: Any, headers: Mapping[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def _read_json(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        return json.loads(raw or b"{}")

    # -- routes ----------------------------------------------------------------------------

    def do_GET(self) -> None:
        """Serve /v1/models and /_log."""
        path = self.path.split("?", 1)[0]
        if path == "/_log":
            self._send_json(200, self.fake.requests())
            return
        m = _PATH_RE.match(path)
        if m and m.group("endpoint") == "models":
            now = int(time.time())
            data = [
                {"id": name, "object": "model", "created": now, "owned_by": "fake"}
                for name in self.fake._known_models()
            ]
            self._send_json(200, {"object": "list", "data": data})
            return
        self._send_json(404, {"error": {"message": f"no route {path}", "type": "not_found"}})

    def do_POST(self) -> None:
        """Serve chat completions and the control endpoints."""
        path = self.path.split("?", 1)[0]
        try:
            body = self._read_json()
        except (ValueError, UnicodeDecodeError):
            self._send_json(400, {"error": {"message": "invalid JSON", "type": "bad_request"}})
            return
        if path == "/_control":
            self._control(body)
            return
        if path == "/_log/clear":
            self.fake.clear_log()
            self._send_json(200, {"ok": True})
            return
        m = _PATH_RE.match(path)
        if m and m.group("endpoint") == "chat/completions" and isinstance(body, dict):
            self._chat(m.group("provider"), body)
            return
        self._send_json(404, {"error": {"message": f"no route {path}", "type": "not_found"}})

    def _control(self, body: Any) -> None:
        if not isinstance(body, dict):
            self._send_json(400, {"error": "expected a JSON object"})
            return
        opts = dict(body)
        if opts.pop("reset", False):
            self.fake.reset()
            if "mode" not in opts:
                self._send_json(200, {"ok": True})
                return
        model = opts.pop("model", None)
        mode = opts.pop("mode", None)
        if not isinstance(mode, str) or not (model is None or isinstance(model, str)):
            self._send_json(400, {"error": "need 'mode' (string) and optional 'model' (string)"})
            return
        try:
            self.fake.set_mode(model, mode, **opts)
        except (ValueError, TypeError) as exc:
            self._send_json(400, {"error": str(exc)})
            return
        self._send_json(200, {"ok": True})

    def _chat(self, provider: str | None, body: dict[str, Any]) -> None:
        model = str(body.get("model", ""))
        stream = bool(body.get("stream", False))
        tools = body.get("tools")
        n_tools = len(tools) if isinstance(tools, list) else 0
        is_title = n_tools == 0
        b = self.fake.behaviour_for(provider, model)
        self.fake._record(
            {
                "model": model,
                "provider": provider,
                "stream": stream,
                "n_tools": n_tools,
                "title_call": is_title,
                "mode": "ok" if is_title else b.mode,
                "last_user_text": last_user_text(body.get("messages")),
                "tool_results": tool_results(body.get("messages")),
                "auth": self.headers.get("Authorization"),
                "time": time.time(),
            }
        )
        if is_title:
            self._answer(model, DEFAULT_TITLE, stream, delay=0.0, interval=b.interval)
        elif b.mode == "ok":
            self._answer(model, b.text, stream, delay=0.0, interval=b.interval)
        elif b.mode == "tools":
            done = tool_results(body.get("messages"))
            if len(done) < len(b.calls):
                want, arguments = b.calls[len(done)]
                offered = [str((t.get("function") or {}).get("name", "")) for t in tools or []
                           if isinstance(t, dict)]
                name = next((n for n in offered if n == want or n.endswith("_" + want)), want)
                self._call_tool(model, name, arguments, stream)
            else:
                self._answer(model, "\n".join([b.text, *done]), stream, delay=0.0,
                             interval=b.interval)
        elif b.mode == "slow":
            self._answer(model, b.text, stream, delay=b.delay, interval=b.interval)
        elif b.mode == "hang":
            # Never answer; stop() sets the event so this thread ends and can be joined.
            self.fake.wait_stopping(None)
        else:
            status, headers, err = error_response(b, model)
            self._send_json(status, err, headers)

    def _call_tool(self, model: str, name: str, arguments: str, stream: bool) -> None:
        created = int(time.time())
        cid = f"chatcmpl-fake{time.monotonic_ns()}"
        call = {"id": f"call_{time.monotonic_ns()}", "type": "function",
                "function": {"name": name, "arguments": arguments}}
        usage = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
        if not stream:
            self._send_json(200, {
                "id": cid, "object": "chat.completion", "created": created, "model": model,
                "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                    "role": "assistant", "content": None, "tool_calls": [call]}}],
                "usage": usage,
            })
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()

        def send(obj: Any) -> None:
            payload = obj if isinstance(obj, str) else json.dumps(obj)
            self.wfile.write(f"data: {payload}\n\n".encode())
            self.wfile.flush()

        def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
            return {"id": cid, "object": "chat.completion.chunk", "created": created,
                    "model": model, "choices": [{"index": 0, "delta": delta,
                                                 "finish_reason": finish}]}

        try:
            send(chunk({"role": "assistant", "content": None,
                        "tool_calls": [{"index": 0, **call}]}))
            send(chunk({}, "tool_calls"))
            send({"id": cid, "object": "chat.completion.chunk", "created": created,
                  "model": model, "choices": [], "usage": usage})
            send("[DONE]")
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            return

    def _answer(self, model: str, text: str, stream: bool, delay: float, interval: float) -> None:
        created = int(time.time())
        cid = f"chatcmpl-fake{time.monotonic_ns()}"
        usage = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
        if not stream:
            if delay and self.fake.wait_stopping(delay):
                return
            self._send_json(
                200,
                {
                    "id": cid,
                    "object": "chat.completion",
                    "created": created,
                    "model": model,
                    "choices": [
                        {
                            "index": 0,
                            "finish_reason": "stop",
                            "message": {"role": "assistant", "content": text},
                        }
                    ],
                    "usage": usage,
                },
            )
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()

        def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
            return {
                "id": cid,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            }

        def send(obj: Any) -> None:
            payload = obj if isinstance(obj, str) else json.dumps(obj)
            self.wfile.write(f"data: {payload}\n\n".encode())
            self.wfile.flush()

        try:
            send(chunk({"role": "assistant", "content": ""}))
            # Slow: SSE comment frames keep the stream open (the session stays busy)
            # without adding text, and reveal a client that went away.
            deadline = time.monotonic() + delay
            while (left := deadline - time.monotonic()) > 0:
                if self.fake.wait_stopping(min(interval, left)):
                    return
                self.wfile.write(b": tick\n\n")
                self.wfile.flush()
            for piece in split_text(text):
                send(chunk({"content": piece}))
            send(chunk({}, "stop"))
            send(
                {
                    "id": cid,
                    "object": "chat.completion.chunk",
                    "created": created,
                    "model": model,
                    "choices": [],
                    "usage": usage,
                }
            )
            send("[DONE]")
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            # The client aborted (e.g. opencode's abort); nothing left to do.
            return


def main(argv: list[str] | None = None) -> int:
    """Run the fake server in the foreground until SIGINT/SIGTERM."""
    parser = argparse.ArgumentParser(
        prog="python -m sandbox.fake_llm",
        description=__doc__.splitlines()[0] if __doc__ else None,
    )
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (0 = random)")
    parser.add_argument("--mode", default="ok", choices=sorted(MODES), help="default mode")
    parser.add_argument("--delay", type=float, default=None, help="seconds for the slow mode")
    args = parser.parse_args(argv)
    done = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        done.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    opts: dict[str, Any] = {} if args.delay is None else {"delay": args.delay}
    with FakeLLM(port=args.port) as llm:
        llm.set_mode(None, args.mode, **opts)
        # The demo reads this line to learn the URL.
        print(f"fake llm listening on {llm.url}", flush=True)
        while not done.wait(0.5):
            pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
