"""gateway/inputs.py: a tool's arguments held to its published schema, refused in words that name the argument."""

from __future__ import annotations

import urllib.request
from typing import Any

import pytest

from gateway.errors import ECHO_CHARS, InvalidArguments
from gateway.inputs import ArgumentValidator, InvalidSchema, PublishedSchemas, did_you_mean

SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["query"],
    "additionalProperties": False,
    "properties": {
        "query": {"type": "string", "minLength": 1, "maxLength": 10, "pattern": r"\S"},
        "limit": {"type": "integer", "minimum": 1, "maximum": 50, "default": 10},
        "offset": {"type": "integer", "minimum": 0},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 2, "default": []},
        "mode": {"enum": ["keyword", "vector"]},
        "filter": {"type": "object", "additionalProperties": False, "properties": {"folder": {"type": "string"}}},
        "exact": {"const": True},
        "id": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
    },
}
VALIDATOR = ArgumentValidator(SCHEMA)


def refusal(arguments: object, validator: ArgumentValidator = VALIDATOR) -> tuple[str, str]:
    with pytest.raises(InvalidArguments) as caught:
        validator.check("t", arguments)
    assert caught.value.tool == "t"
    return caught.value.argument, caught.value.message


@pytest.mark.parametrize(
    ("arguments", "argument", "message"),
    [
        ({}, "query", "is required"),
        ({"qery": "x"}, "qery", "unknown argument; did you mean 'query'?"),
        (
            {"query": "x", "colour": 1},
            "colour",
            "unknown argument (expected: query, limit, offset, tags, mode, filter, exact, id)",
        ),
        ({"query": 3}, "query", "must be a string, got integer 3"),
        ({"query": None}, "query", "must be a string, got null"),
        ({"query": "x", "limit": 1.5}, "limit", "must be an integer, got number 1.5"),
        ({"query": "x", "limit": 0}, "limit", "must be between 1 and 50, got 0"),
        ({"query": "x", "offset": -1}, "offset", "must be at least 0, got -1"),
        ({"query": ""}, "query", "must not be empty"),
        ({"query": "   "}, "query", 'must match the pattern `\\S`, got "   "'),
        ({"query": "x" * 11}, "query", "must be at most 10 characters, got 11"),
        ({"query": "x", "tags": ["a", "b", "c"]}, "tags", "must have at most 2 items, got 3"),
        ({"query": "x", "tags": ["a", 2]}, "tags.1", "must be a string, got integer 2"),
        ({"query": "x", "mode": "deep"}, "mode", 'must be one of "keyword", "vector"; got "deep"'),
        ({"query": "x", "filter": {"foldr": "a"}}, "filter.foldr", "unknown key; did you mean 'folder'?"),
        ({"query": "x", "filter": {"folder": None}}, "filter.folder", "must be a string, got null"),
        ({"query": "x", "id": "abc"}, "id", '"abc" is not valid under any of the given schemas'),  # jsonschema's words
        (["query"], "", 'must be an object, got array ["query"]'),
    ],
)
def test_a_refusal_names_the_argument_and_says_what_it_must_be(arguments: object, argument: str, message: str) -> None:
    assert refusal(arguments) == (argument, message)


def test_an_unknown_argument_is_named_before_a_missing_one_it_may_be_the_misspelling_of() -> None:
    assert refusal({"qery": "x", "limit": 3}) == ("qery", "unknown argument; did you mean 'query'?")


def test_a_value_is_quoted_as_json_and_cut_so_an_error_is_never_as_large_as_the_request() -> None:
    argument, message = refusal({"query": "x", "mode": "y" * 100_000})
    assert argument == "mode"
    assert len(message) < 3 * ECHO_CHARS
    assert message.endswith("… (100,002 characters)")


def test_arguments_the_schema_accepts_pass_and_prepare_fills_defaults_on_a_copy() -> None:
    arguments = {"query": "x", "offset": 2.0}
    prepared = VALIDATOR.prepare("t", arguments)
    assert prepared == {"query": "x", "offset": 2, "limit": 10, "tags": []}
    assert isinstance(prepared["offset"], int)
    assert arguments == {"query": "x", "offset": 2.0}
    prepared["tags"].append("mine")
    assert VALIDATOR.prepare("t", {"query": "x"})["tags"] == []  # each call gets its own copy of a default


def test_null_for_an_optional_argument_is_taken_as_not_given_and_a_required_one_is_refused_by_name() -> None:
    """Models often send null for what they leave out: the check does not refuse it (the provider, which receives it
    as sent, judges it as without the gateway); the gateway's own tools take it as absent (their default), unless
    the property's schema takes null itself. A required argument's null is refused, naming it."""
    sent = {"query": "x", "limit": None, "exact": None, "mode": None, "id": None}
    VALIDATOR.check("t", sent)
    assert PublishedSchemas().problem("t", SCHEMA, sent) is None
    assert VALIDATOR.prepare("t", sent) == {"query": "x", "id": None, "limit": 10, "tags": []}
    assert sent["limit"] is None  # the caller's own arguments are left as they came
    assert refusal({"query": None, "limit": None}) == ("query", "must be a string, got null")


def test_an_invalid_schema_is_refused_once_when_compiled() -> None:
    with pytest.raises(InvalidSchema, match="not a valid JSON Schema"):
        ArgumentValidator({"type": "objekt"})


def test_a_remote_reference_is_never_fetched_and_the_call_says_why_it_cannot_be_checked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_fetch(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the validator fetched a remote schema")

    monkeypatch.setattr(urllib.request, "urlopen", no_fetch)
    validator = ArgumentValidator({"type": "object", "properties": {"a": {"$ref": "http://127.0.0.1:9/a.json"}}})
    assert refusal({"a": 1}, validator) == (
        "",
        "cannot be checked: the tool's input schema refers to 'http://127.0.0.1:9/a.json', which the gateway "
        "cannot resolve",
    )
    local = ArgumentValidator({"$defs": {"q": {"type": "string"}}, "properties": {"q": {"$ref": "#/$defs/q"}}})
    assert refusal({"q": 1}, local) == ("q", "must be a string, got integer 1")


def test_published_schemas_refuse_what_breaks_a_schema_and_leave_what_they_cannot_judge_to_the_provider() -> None:
    schemas = PublishedSchemas()
    refused = schemas.problem("t", SCHEMA, {"query": "x", "limit": 0})
    assert refused is not None and (refused.argument, refused.message) == ("limit", "must be between 1 and 50, got 0")
    assert schemas.problem("t", SCHEMA, {"query": "x"}) is None
    assert schemas.problem("u", {"type": "objekt"}, {"anything": 1}) is None  # not a schema it can compile
    remote = {"type": "object", "properties": {"a": {"$ref": "http://127.0.0.1:9/a.json"}}}
    assert schemas.problem("v", remote, {"a": 1}) is None  # a $ref it cannot resolve: never fetched, not refused
    changed = {**SCHEMA, "required": ["query", "mode"]}
    missing = schemas.problem("t", changed, {"query": "x"})  # the catalog publishes a new schema: compiled anew
    assert missing is not None and (missing.argument, missing.message) == ("mode", "is required")


def test_an_argument_under_another_programs_name_is_mapped_to_the_published_one() -> None:
    schema = {"type": "object", "additionalProperties": False, "properties": {"question": {}, "budget": {}}}
    assert refusal({"question": "q", "token_budget": 5}, ArgumentValidator(schema)) == (
        "token_budget",
        "unknown argument; did you mean 'budget'?",
    )
    assert did_you_mean("--budget", ["question", "budget"], by_words=True) == ["budget"]
    assert did_you_mean("maxResults", ["query", "max_results"], by_words=True) == ["max_results"]
    assert did_you_mean("context_filter", ["question", "budget"], by_words=True) == []
    assert did_you_mean("token_budget", ["question", "budget"]) == []  # only when asked to compare words


def test_did_you_mean_offers_the_closest_names_best_first_and_nothing_unlike() -> None:
    assert did_you_mean("qery", ["limit", "query", "queries"]) == ["query"]
    assert did_you_mean("qery", ["limit", "querying", "query"], most=2, cutoff=0.6) == ["query", "querying"]
    assert did_you_mean("colour", ["limit", "query"]) == []
