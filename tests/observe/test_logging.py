"""The log pipeline: the redacting processor, and ``configure_logging`` writing JSON lines to stderr off a TTY."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import structlog

from gateway.observe.logs import MASK, Redactor, configure_logging, redactor


def test_a_registered_secret_is_removed_from_nested_values() -> None:
    r = Redactor()
    r.add(["s3cr3t-token", "hunter22"])
    event = {
        "event": "tool.call",
        "note": "sent s3cr3t-token twice: s3cr3t-token",
        "args": {"query": ["ok", "hunter22 here", ("deep", {"inner": "x s3cr3t-token y"})]},
        "count": 3,
        "flag": None,
    }
    out = r(None, "info", dict(event))
    assert out["note"] == f"sent {MASK} twice: {MASK}"
    assert out["args"] == {"query": ["ok", f"{MASK} here", ("deep", {"inner": f"x {MASK} y"})]}
    assert (out["count"], out["flag"], out["event"]) == (3, None, "tool.call")
    assert "s3cr3t" not in json.dumps(out) and "hunter22" not in json.dumps(out)


@pytest.mark.parametrize("key", ["authorization", "Authorization", "TOKEN", "password", "secret", "api_key", "Cookie"])
def test_a_sensitive_key_is_masked_whatever_its_value_at_the_top_or_nested(key: str) -> None:
    r = Redactor()
    out = r(None, "info", {"event": "e", key: "unregistered-value", "headers": {key: "unregistered-value", "ok": "v"}})
    assert out[key] == MASK
    assert out["headers"] == {key: MASK, "ok": "v"}


@pytest.mark.parametrize("key", ["proxy-authorization", "x-api-key", "access_token"])
def test_common_variants_of_sensitive_keys_are_masked(key: str) -> None:
    out = Redactor()(None, "info", {"event": "e", "headers": {key: "unregistered-value"}})
    assert out["headers"][key] == MASK


def test_values_shorter_than_four_characters_are_not_registered_as_secrets() -> None:
    r = Redactor()
    r.add(["", "abc", "abcd"])
    assert r.scrub("abc abcd") == f"abc {MASK}"


def test_a_secret_that_contains_another_secret_is_removed_whole() -> None:
    leaks = []
    for i in range(32):  # set order varies with the hash seed; over 32 pairs the wrong order all but surely occurs
        long_secret = f"tok-{i:02d}-the-long-remainder"
        r = Redactor()
        r.add([long_secret, long_secret[:8]])
        scrubbed = r.scrub(f"header {long_secret}")
        if "remainder" in scrubbed:
            leaks.append(scrubbed)
    assert leaks == []


@pytest.fixture
def restore_logging() -> Iterator[None]:
    """configure_logging changes process-wide state: put structlog and the root logger back afterwards."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    structlog.reset_defaults()
    for handler in list(root.handlers):
        if handler not in handlers:
            root.removeHandler(handler)
    root.setLevel(level)


@pytest.mark.usefixtures("restore_logging")
def test_configure_logging_writes_redacted_json_lines_to_stderr_when_not_a_tty(
    capsys: pytest.CaptureFixture[str],
) -> None:
    secret = f"planted-{uuid.uuid4().hex}"
    redactor.add([secret])
    configure_logging("info")  # stderr is captured, so not a TTY: JSON
    log = structlog.get_logger("test")

    log.info("tool.call", status="ok", note=f"bearer {secret}", headers={"Authorization": "Bearer anything"})
    log.debug("too.chatty", note="filtered at info")
    try:
        raise RuntimeError(f"downstream said {secret}")
    except RuntimeError:
        log.exception("tool.crashed")

    captured = capsys.readouterr()
    assert captured.out == ""  # stdout carries the MCP protocol in `serve --stdio`
    assert secret not in captured.err
    lines: list[dict[str, Any]] = [json.loads(line) for line in captured.err.splitlines() if line.strip()]
    assert [line["event"] for line in lines] == ["tool.call", "tool.crashed"]
    call, crash = lines
    assert (call["level"], call["status"], call["note"]) == ("info", "ok", f"bearer {MASK}")
    assert call["headers"] == {"Authorization": MASK}
    assert "timestamp" in call
    assert crash["level"] == "error"
    assert "RuntimeError" in crash["exception"] and MASK in crash["exception"]


@pytest.mark.usefixtures("restore_logging")
def test_configure_logging_can_be_forced_to_the_console_renderer(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("debug", json=False)
    structlog.get_logger("test").debug("console.event", key="value")
    err = capsys.readouterr().err
    assert "console.event" in err and "key" in err
    with pytest.raises(json.JSONDecodeError):
        json.loads(err.splitlines()[0])


@pytest.mark.spawns
def test_a_programs_output_becomes_structured_events_with_tips_at_debug() -> None:
    printed = (
        "Creating collection 'docs'...\n\n"
        "\x1b[33mRun 'qmd embed' to update embeddings (5 unique hashes need vectors)\x1b[0m\n"
        "Tip: set GEMINI_API_KEY or GOOGLE_API_KEY to use Gemini for semantic extraction.\n"
        "error: graph file not found\n"
    )

    def relayed(level: str) -> list[tuple[str, str]]:
        done = subprocess.run(
            [sys.executable, "-m", "gateway.observe.logs", "prepare", level],
            input=printed, capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        assert done.returncode == 0 and done.stdout == "", done.stderr
        events = [json.loads(line) for line in done.stderr.splitlines()]
        assert {(e["event"], e["program"]) for e in events} == {("program.output", "prepare")}
        return [(e["level"], e["line"]) for e in events]

    assert relayed("debug") == [
        ("info", "Creating collection 'docs'..."),
        ("debug", "Run 'qmd embed' to update embeddings (5 unique hashes need vectors)"),
        ("debug", "Tip: set GEMINI_API_KEY or GOOGLE_API_KEY to use Gemini for semantic extraction."),
        ("warning", "error: graph file not found"),
    ]
    assert relayed("info") == [("info", "Creating collection 'docs'..."), ("warning", "error: graph file not found")]
