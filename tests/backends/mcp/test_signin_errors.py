"""What a sign-in's failure says: never a value it was given (a token an authorization server answered, a secret)."""

from __future__ import annotations

import pydantic
import pytest
from mcp.shared.auth import OAuthToken

from gateway.backends.mcp.signin import _plain


def test_a_refused_token_answer_names_the_field_not_the_token() -> None:
    with pytest.raises(pydantic.ValidationError) as refused:
        OAuthToken.model_validate({"access_token": 918273645546372819, "token_type": "Bearer"})
    said = _plain(refused.value)
    assert "918273645546372819" not in said
    assert said == "ValidationError: OAuthToken refused at access_token"


def test_any_other_error_keeps_its_first_words() -> None:
    assert _plain(ValueError("the token endpoint answered 500: internal")) == (
        "ValueError: the token endpoint answered 500"
    )
