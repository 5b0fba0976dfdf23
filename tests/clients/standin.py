"""A loopback stand-in for the model APIs of Claude Code (Anthropic Messages) and Gemini CLI (Gemini
``streamGenerateContent``), so the agent CLIs make real MCP tool calls through their own stack without a key.

``ModelStandin(script)`` serves on a free loopback port in a thread. ``script`` is the list of tool calls the "model"
asks for, in order (``(tool, arguments)``; ``tool`` is matched against the end of the names the CLI declares, since
each CLI prefixes MCP tools its own way). Each answer to a request that declares that tool asks for the next call of
the script; once every call has been asked for, the answer is plain text and the conversation ends. What the CLI sends
back for each call (Anthropic ``tool_result``, Gemini ``functionResponse``) is what a model would read: it is kept in
``results``, one ``Reading`` per call, in order. A request that declares no tool of the script (a side call: a title,
a summary, a routing check) gets a short plain-text answer.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

FINAL_TEXT = "done"


@dataclass
class Reading:
    """What the CLI gave the model for one tool call: the tool's declared name, the text the model reads, and
    whether the CLI marked it as an error."""

    tool: str
    text: str
    error: bool


@dataclass
class ModelStandin:
    script: Sequence[tuple[str, dict[str, Any]]]
    results: list[Reading] = field(default_factory=list)
    declared: list[list[str]] = field(default_factory=list)
    """The tool names each request declared (a request per entry), for the assertion that the CLI listed them."""
    _server: ThreadingHTTPServer | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def url(self) -> str:
        assert self._server is not None
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def __enter__(self) -> ModelStandin:
        standin = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # quiet: pytest shows what fails
                pass

            def do_GET(self) -> None:  # health or model lookups: an empty, well-formed answer
                self._json(200, {"data": [], "models": []})

            def do_HEAD(self) -> None:
                self.send_response(200)
                self.end_headers()

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                if "/v1/messages" in self.path:
                    if self.path.rstrip("/").endswith("count_tokens"):
                        self._json(200, {"input_tokens": 1})
                    else:
                        self._anthropic(body)
                elif ":streamGenerateContent" in self.path or ":generateContent" in self.path:
                    self._gemini(body, stream=":streamGenerateContent" in self.path)
                elif ":countTokens" in self.path:
                    self._json(200, {"totalTokens": 1})
                else:
                    self._json(404, {"error": {"message": f"the stand-in does not serve {self.path}"}})

            def _json(self, status: int, document: Any) -> None:
                data = json.dumps(document).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _sse(self, events: Iterator[tuple[str | None, Any]]) -> None:
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("cache-control", "no-cache")
                self.end_headers()
                for name, data in events:
                    head = f"event: {name}\n" if name else ""
                    self.wfile.write(f"{head}data: {json.dumps(data)}\n\n".encode())
                self.wfile.flush()
                self.close_connection = True

            def _anthropic(self, body: dict[str, Any]) -> None:
                names = [str(tool.get("name", "")) for tool in body.get("tools") or []]
                step = standin._next(names, _anthropic_results(body.get("messages") or []))
                if not body.get("stream"):
                    content: list[dict[str, Any]] = [{"type": "text", "text": FINAL_TEXT}]
                    if step is not None:
                        content = [{"type": "tool_use", "id": _use_id(), "name": step[0], "input": step[1]}]
                    self._json(200, _anthropic_message(content, "tool_use" if step else "end_turn"))
                    return
                self._sse(_anthropic_stream(step))

            def _gemini(self, body: dict[str, Any], *, stream: bool) -> None:
                names = [
                    str(declaration.get("name", ""))
                    for tool in body.get("tools") or []
                    for declaration in tool.get("functionDeclarations") or []
                ]
                step = standin._next(names, _gemini_results(body.get("contents") or []))
                part: dict[str, Any] = {"text": FINAL_TEXT}
                config = body.get("generationConfig") or {}
                schema = config.get("responseJsonSchema") or config.get("responseSchema")
                if step is None and schema is not None:  # a side call wanting JSON (routing, next speaker)
                    part = {"text": json.dumps(_example(schema))}
                if step is not None:
                    part = {"functionCall": {"name": step[0], "args": step[1]}}
                chunk = {
                    "candidates": [{"content": {"role": "model", "parts": [part]}, "finishReason": "STOP", "index": 0}],
                    "usageMetadata": {"promptTokenCount": 1, "candidatesTokenCount": 1, "totalTokenCount": 2},
                }
                if stream:
                    self._sse(iter([(None, chunk)]))
                else:
                    self._json(200, chunk)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, name="model-standin", daemon=True).start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def _next(self, names: list[str], results: list[Reading]) -> tuple[str, dict[str, Any]] | None:
        """The next scripted call as this request names it, or None (plain text). Records the results the request
        carries back (the conversation so far: the longest one seen is the whole of it)."""
        with self._lock:
            wanted = {tool for tool, _ in self.script}
            if not any(_declared(names, tool) for tool in wanted):
                return None
            self.declared.append(names)
            if len(results) > len(self.results):
                self.results[:] = results
            if len(results) >= len(self.script):
                return None
            tool, arguments = self.script[len(results)]
            name = _declared(names, tool)
            return (name, arguments) if name else None


def _declared(names: list[str], tool: str) -> str | None:
    """The declared name that stands for ``tool`` (Claude Code: ``mcp__SERVER__tool``; Gemini: ``tool`` or
    ``SERVER__tool``)."""
    for name in names:
        if name == tool or name.endswith(f"__{tool}") or name.endswith(f"_{tool}"):
            return name
    return None


def _example(schema: Any) -> Any:
    """A value of the JSON schema ``schema``, the first that fits (a side call's structured answer)."""
    if not isinstance(schema, dict):
        return None
    if schema.get("enum"):
        return schema["enum"][0]
    kind = str(schema.get("type", "object")).lower()
    if kind == "object":
        properties = schema.get("properties") or {}
        return {name: _example(sub) for name, sub in properties.items()}
    if kind == "array":
        return []
    if kind in ("number", "integer"):
        return schema.get("minimum", 1)
    if kind == "boolean":
        return False
    return "standin"


def _use_id() -> str:
    return f"toolu_{uuid.uuid4().hex[:16]}"


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(_text_of(item) for item in content)
    if isinstance(content, dict):
        if "text" in content:
            return str(content["text"])
        return json.dumps(content, sort_keys=True)
    return json.dumps(content)


def _anthropic_results(messages: list[dict[str, Any]]) -> list[Reading]:
    uses: dict[str, str] = {}
    results: list[Reading] = []
    for message in messages:
        content = message.get("content")
        if not isinstance(content, list):
            continue
        for block in content:
            if block.get("type") == "tool_use":
                uses[str(block.get("id"))] = str(block.get("name"))
            elif block.get("type") == "tool_result":
                tool = uses.get(str(block.get("tool_use_id")), "")
                results.append(Reading(tool, _text_of(block.get("content")), bool(block.get("is_error"))))
    return results


def _gemini_results(contents: list[dict[str, Any]]) -> list[Reading]:
    results: list[Reading] = []
    for content in contents:
        for part in content.get("parts") or []:
            response = part.get("functionResponse")
            if response is not None:
                answer = response.get("response") or {}
                error = isinstance(answer, dict) and "error" in answer
                results.append(Reading(str(response.get("name")), _text_of(answer), error))
    return results


def _anthropic_message(content: list[dict[str, Any]], stop: str) -> dict[str, Any]:
    return {
        "id": "msg_standin",
        "type": "message",
        "role": "assistant",
        "model": "claude-standin",
        "content": content,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": {"input_tokens": 1, "output_tokens": 1},
    }


def _anthropic_stream(step: tuple[str, dict[str, Any]] | None) -> Iterator[tuple[str | None, Any]]:
    start = _anthropic_message([], "")
    start["stop_reason"] = None
    yield "message_start", {"type": "message_start", "message": start}
    if step is None:
        block: dict[str, Any] = {"type": "text", "text": ""}
        delta: dict[str, Any] = {"type": "text_delta", "text": FINAL_TEXT}
    else:
        block = {"type": "tool_use", "id": _use_id(), "name": step[0], "input": {}}
        delta = {"type": "input_json_delta", "partial_json": json.dumps(step[1])}
    yield "content_block_start", {"type": "content_block_start", "index": 0, "content_block": block}
    yield "content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}
    yield "content_block_stop", {"type": "content_block_stop", "index": 0}
    stop = "tool_use" if step is not None else "end_turn"
    yield (
        "message_delta",
        {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None}, "usage": {"output_tokens": 1}},
    )
    yield "message_stop", {"type": "message_stop"}
