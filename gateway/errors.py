"""The gateway's error tree. It sits at the bottom of the import stack so every layer can raise these.

    GatewayError
    ├── ConfigError            federation.yaml is invalid: names the file, the key path and the line
    ├── BackendError           a provider failed to answer (never a downstream ``isError``, which is an answer)
    │   ├── BackendUnavailable     not connected, disabled, crashed, refused, process could not start
    │   │   └── BackendSaturated       ... every connection to it is busy: the call was never sent (not a failure)
    │   ├── BackendTimeout         no answer within the step's timeout
    │   │   └── OutOfTime              ... the call's budget left no time to try the step (skipped)
    │   ├── BackendProtocolError   the backend answered with something that is not a valid answer
    │   │   ├── BackendRpcError        ... a JSON-RPC error answer (a lone provider's passes through as is)
    │   │   └── BackendAnswerTooLarge  ... an answer over the server's ``max_answer_bytes`` (that call fails alone)
    │   ├── BackendThinResult      an answer a variant declares not worth keeping (degrade to the next rung)
    │   └── VariantNotReady        the variant's probe found it cannot run here (skipped at once, with why)
    ├── ToolNotFound           no tool of that name in the catalog (a JSON-RPC error, not a tool result)
    ├── InvalidArguments       a tool argument failed validation (an ``isError`` answer naming the argument)
    ├── InputRequired          not a failure: the backend answered a round with an input-required result (SEP-2322)
    │   └── TaskCreated            ... or with a task it runs on (the tasks extension, SEP-2663): the call ends there
    └── AuditError             the audit ledger cannot be opened or written

Foreign errors (httpx2, anyio, OSError, mcp) are translated into these at the seam, in ``backends/``. Client input
echoed into a message goes through ``quote`` (cut to ``ECHO_CHARS``); ``did_you_mean`` is the gateway's one guess at
a misspelt name (a tool argument's, a configuration key's or value's).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable

ECHO_CHARS = 120
"""Characters of client input quoted in an error message (a name, a URI, an argument path); the rest is counted."""


URI_CHARS = 2048
"""Characters of a client's URI echoed in an error's data (a real URI fits; a megabyte of one does not)."""


MISSPELT = 0.75
"""How alike (difflib's ratio) a name must be to another to be taken for its misspelling."""


def did_you_mean(
    word: str, choices: Iterable[str], *, most: int = 1, cutoff: float = MISSPELT, by_words: bool = False
) -> list[str]:
    """The ``choices`` that look most like ``word``, best first, at most ``most`` of them (difflib's similarity
    ratio, at least ``cutoff``); empty when none does. ``by_words``: then also a choice whose words (split at ``_``,
    ``-`` and camelCase) are all in ``word``, or all of ``word``'s in it: another program's name for the same thing
    (``token_budget`` or ``--budget`` for ``budget``)."""
    options = list(choices)
    close = difflib.get_close_matches(word, options, n=most, cutoff=cutoff)
    if by_words and len(close) < most:
        said = _words(word)
        for option in options:
            words = _words(option)
            if option not in close and said and words and (words <= said or said <= words):
                close.append(option)
    return close[:most]


def _words(name: str) -> frozenset[str]:
    return frozenset(part.lower() for part in re.findall(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])", name))


def clip(text: str, limit: int = ECHO_CHARS) -> str:
    """``text`` cut to ``limit`` characters, with "…" when it was cut (for echoing client input as data)."""
    return text if len(text) <= limit else text[:limit] + "…"


def quote(text: str, limit: int = ECHO_CHARS) -> str:
    """``text`` quoted for an error message: the one way client input is echoed into an error, so an answer can never
    be made as large as the request that caused it. ``repr`` (control characters and lone surrogates come out
    escaped), cut to ``limit`` characters with the full length said."""
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}… ({len(text):,} characters)"


class GatewayError(Exception):
    """Base class of every error the gateway raises on purpose."""


class ConfigError(GatewayError):
    """federation.yaml (or a value it references) is invalid.

    Attributes:
        file: the configuration file.
        key_path: dotted path of the offending key, e.g. ``servers.memory.timeout_s`` ("" for the whole file).
        line: 1-based line in the file, or None when unknown (e.g. a missing key).
        message: what is wrong, as a sentence.
    """

    def __init__(self, file: str, key_path: str, line: int | None, message: str) -> None:
        self.file = file
        self.key_path = key_path
        self.line = line
        self.message = message
        where = file
        if line is not None:
            where += f":{line}"
        if key_path:
            where += f": {key_path}"
        super().__init__(f"{where}: {message}")

    def __repr__(self) -> str:
        return (
            f"ConfigError(file={self.file!r}, key_path={self.key_path!r}, line={self.line!r}, message={self.message!r})"
        )


class BackendError(GatewayError):
    """A provider failed to produce an answer.

    Attributes:
        backend: the backend's name as declared in federation.yaml.
        reason: what happened, in plain words ("timed out after 15 s", "process exited with code 1: ...").
        cause: what failures with one cause share (e.g. the lost session of a crash that failed every call in flight
            on it), so the circuit breaker counts them once; None when each failure stands alone.
        answered: the provider did answer, only the answer failed the step (a JSON-RPC error, a thin or an oversized
            answer): a sign of life, which the circuit breaker counts as a success.
    """

    outcome = "error"
    answered = False
    verdict = True

    def __init__(self, backend: str, reason: str, *, cause: object = None) -> None:
        self.backend = backend
        self.reason = reason
        self.cause = cause
        super().__init__(f"backend {backend!r}: {reason}")

    def __repr__(self) -> str:
        return f"{type(self).__name__}(backend={self.backend!r}, reason={self.reason!r})"


class BackendUnavailable(BackendError):
    outcome = "unavailable"


class CredentialMissing(BackendUnavailable):
    """The caller has no credential for this server (a sign-in not done, a secret not given, an exchange refused):
    the call was never sent. Says nothing of the backend's health: the circuit breaker neither counts it nor resets.
    The reason says what the caller must do; ``link``: for an OAuth server, the page where they sign in."""

    verdict = False

    def __init__(self, backend: str, reason: str, *, link: str | None = None) -> None:
        super().__init__(backend, reason)
        self.link = link


class BackendSaturated(BackendUnavailable):
    """No connection to the backend came free for this call in time (its ``max_connections`` are busy): the call was
    never sent. Says nothing of the backend's health: the circuit breaker neither counts it nor resets."""

    outcome = "saturated"
    verdict = False


class BackendTimeout(BackendError):
    outcome = "timeout"


class BackendProtocolError(BackendError):
    outcome = "protocol_error"


class BackendThinResult(BackendError):
    outcome = "thin"
    answered = True


class BackendRpcError(BackendProtocolError):
    """The backend answered with a JSON-RPC error; kept whole so a lone provider's error can pass through."""

    outcome = "rpc_error"
    answered = True

    def __init__(self, backend: str, code: int, message: str, data: object = None) -> None:
        self.code = code
        self.message = message
        self.data = data
        super().__init__(backend, f"the server answered with error {code}: {message}")


class BackendAnswerTooLarge(BackendProtocolError):
    """One answer was larger than the server's ``max_answer_bytes``: that call fails, its session keeps serving.

    Attributes:
        size: the answer's size in bytes (one JSON-RPC message as it arrived).
        limit: the limit it exceeded.
    """

    outcome = "too_large"
    answered = True

    def __init__(self, backend: str, size: int, limit: int) -> None:
        self.size = size
        self.limit = limit
        super().__init__(backend, f"the answer is {size:,} bytes, over this server's max_answer_bytes of {limit:,}")


class ToolNotFound(GatewayError):
    """No tool of that name is served to this caller; ``why`` says whose it is and why it is off, when the
    configuration declares it (a disabled backend's tool)."""

    def __init__(self, name: str, why: str | None = None) -> None:
        self.name = name
        self.why = why
        super().__init__(f"Unknown tool: {quote(name)}: {why}." if why else f"Unknown tool: {quote(name)}.")


class InvalidArguments(GatewayError):
    """Arguments failed validation; ``argument`` names the offending one (a dotted path, or "" for the whole)."""

    def __init__(self, tool: str, argument: str, message: str) -> None:
        self.tool = tool
        self.argument = argument
        self.message = message
        target = f"argument {quote(argument)}" if argument else "arguments"
        super().__init__(f"Invalid {target} for tool {quote(tool)}: {message}")


class AuditError(GatewayError):
    pass


class VariantNotReady(BackendError):
    """The variant asked for was found unable to run here (its probe said why): skipped at once, not a failure."""

    outcome = "not_ready"
    answered = True


class OutOfTime(BackendTimeout):
    """The call's budget left no time for this step: skipped without being tried, not a failure of the backend."""

    answered = True


class InputRequired(GatewayError):
    """A backend answered with an input-required result (MCP 2026-07-28): the client must answer ``result``'s input
    requests and retry. ``backend`` and ``tool`` (its own name for the tool, prompt or resource) say who asked, so
    the retry can be routed back there (front/continuation.py). Not a failure: nothing falls back past it.
    ``status`` is how the request's ledger row ends."""

    status = "input_required"

    def __init__(self, result: object, *, backend: str, tool: str) -> None:
        self.result = result
        self.backend = backend
        self.tool = tool
        super().__init__(f"backend {backend!r} asks the client for input before it can answer {quote(tool)}")


class TaskCreated(InputRequired):
    """A backend answered a ``tools/call`` with a task (``resultType: "task"``, the tasks extension, SEP-2663):
    ``result`` is its flat ``CreateTaskResult`` as it came. The call ends there, handed to the client as a task of
    the gateway's (front/tasks.py); like an input-required round, not a failure, and nothing falls back past it.
    ``published`` is the tool's name as the client reached it, once the face knows it (search exposure's call tool
    wraps it)."""

    status = "task"

    def __init__(self, result: dict[str, object], *, backend: str, tool: str) -> None:
        super().__init__(result, backend=backend, tool=tool)
        self.result: dict[str, object] = result
        self.published: str | None = None
