"""The credential pattern set: each kind is found in running text and redacted whole (a connection string's password
alone), look-alikes are not, and findings carry a kind and a JSON path, never the value."""

from __future__ import annotations

import pytest

from gateway.observe.credentials import KINDS, Finding, find, redact, redact_value, scan_value
from gateway.observe.logs import redactor

# Built from parts, so this file is not itself a list of credentials to a scanner.
SAMPLES = {
    "aws_access_key": "AKIA" + "IOSFODNN7EXAMPLE",
    "aws_secret_key": "aws_secret_access_key = " + "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    "google_api_key": "AIza" + "SyD-abcdefghijklmnopqrstuvwxyz01234",
    "github_token": "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8",
    "gitlab_token": "glpat-" + "xxxxXXXXyyyyYYYY1234",
    "slack_token": "xoxb-" + "123456789012-1234567890123-abcdefABCDEF",
    "slack_webhook": "https://hooks.slack.com/services/" + "T0001/B0002/abcdefABCDEF123456",
    "stripe_key": "sk_live_" + "4eC39HqLyjWDarjtT1zdp7dc",
    "ai_api_key": "sk-ant-" + "api03-abcdefghijklmnopqrstuvwxyz",
    "private_key": "-----BEGIN RSA " + "PRIVATE KEY-----\nMIIEowIBAAKCAQEA\n-----END RSA PRIVATE KEY-----",
    "jwt": "eyJ" + "hbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
    "connection_string": "postgresql://app:" + "s3cr3t-pw@db.internal:5432/prod",
}

SECRET_PART = {"connection_string": "s3cr3t-pw", "private_key": "MIIEowIBAAKCAQEA"}
"""What must be gone after redaction, where it is not the sample's last characters."""


def test_every_kind_has_a_sample() -> None:
    assert set(SAMPLES) == set(KINDS)


@pytest.mark.parametrize("kind", KINDS)
def test_each_kind_is_found_in_running_text_and_redacted(kind: str) -> None:
    text = f"here it is: {SAMPLES[kind]} (do not share)"
    assert find(text) == [kind]
    cleaned = redact(text)
    assert f"[redacted {kind}]" in cleaned and cleaned.startswith("here it is: ")
    assert find(cleaned) == [], cleaned
    assert SECRET_PART.get(kind, SAMPLES[kind][-12:]) not in cleaned


def test_a_connection_string_keeps_all_but_its_password() -> None:
    assert redact(SAMPLES["connection_string"]) == "postgresql://app:[redacted connection_string]@db.internal:5432/prod"


@pytest.mark.parametrize(
    "text",
    [
        "https://example.com/path?q=1",  # a URL without a password
        "postgresql://app:${DB_PASSWORD}@db/prod",  # a placeholder, not a password
        "postgresql://app:[redacted]@db/prod",  # masked already (observe/logs.py's known secrets)
        "AKIA is a prefix; AKIAshort",
        "ghp_tooShort and eyJ alone",
        "commit 3f786850e387550fdab836ed7e6dc881de23001b, id 0123456789abcdef0123456789abcdef",
        "user@example.com wrote: sk-nothing",
        "xAKIA" + "IOSFODNN7EXAMPLE is glued to a word before it",
    ],
)
def test_look_alikes_are_not_credentials(text: str) -> None:
    assert find(text) == [] and redact(text) == text


def test_findings_name_the_path_and_never_the_value() -> None:
    value = {"query": "fine", "items": [{"note": SAMPLES["github_token"]}, 3, None], "ok": True}
    findings = scan_value(value, "arguments")
    assert findings == [Finding("github_token", "arguments.items[0].note")]
    assert (
        SAMPLES["github_token"] not in str(findings) and str(findings[0]) == "github_token at arguments.items[0].note"
    )
    assert redact_value(value) == {"query": "fine", "items": [{"note": "[redacted github_token]"}, 3, None], "ok": True}


def test_the_log_redactor_masks_credentials_it_was_never_told_of() -> None:
    event = {"reason": f"downstream said: bad token {SAMPLES['github_token']}", "n": 3}
    assert redactor(None, "info", dict(event)) == {
        "reason": "downstream said: bad token [redacted github_token]",
        "n": 3,
    }
