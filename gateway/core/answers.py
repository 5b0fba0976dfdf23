"""Token budgets for answers: how large an answer a call may return to this client and caller, the cut at a clean
boundary when it is larger, where the rest is kept, and each caller's daily allowance (docs/configuration.md,
"Budgets").

The budget of a call is the smallest of: ``clients.budget.answer_share`` of the window the client declared (or
``unknown_window`` when it declared none; none at all for a large client while ``exempt_large``),
``clients.budget.answer_tokens``, and the caller's policy's ``budget.answer_tokens``. An answer over it is cut by
``cut``: whole hits of a search result (or whole items of a structured result's one list; the text stays the JSON
of what is shown), else whole paragraphs (a paragraph larger than the budget at lines, then words); a last text
block says how much was left out and how to read the rest, and a structured result carries the same in ``more``.
The rest is kept (core/kept.py) for the caller who made the call, readable in pages by ``resources/read`` of
``gateway://results/ID?page=N`` and by the built-in tool ``read_result``. Images and other non-text blocks pass
whole; a structured result with no list passes whole beside its cut text.

A caller's policy may set ``budget.daily_tokens``: the tokens of answers it received since midnight UTC are counted
in this process (per replica), and a call over the allowance is refused with the time it resets.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

import mcp_types as types

from gateway.calls import CallContext
from gateway.config import Federation
from gateway.core.kept import READ_TOOL, SCHEME, Kept, KeptResults, Page, owner_of, split_unit
from gateway.core.policies import policy_for
from gateway.search.tokens import count_tokens, within

__all__ = ["Answers", "Cut"]

_NOTE_TOKENS = 120
"""Kept free in every budget for the line that says what was left out."""


@dataclass(frozen=True, slots=True)
class Cut:
    """What a budget did to an answer: the answer to send, and the tokens shown and in all."""

    result: types.CallToolResult
    shown: int
    total: int
    kept: Kept | None


class Answers:
    """The budgets of the running configuration (``config`` is read at each call, so a reload applies at once)."""

    def __init__(self, config: Callable[[], Federation], count: Callable[[str], int] = count_tokens) -> None:
        self._config = config
        self._count = count
        budget = config().clients.budget
        self.kept = KeptResults(
            count,
            keep_s=budget.keep_s if budget is not None else 900.0,
            keep_bytes=budget.keep_bytes if budget is not None else 64 * 1024 * 1024,
        )
        self._spent: dict[str, int] = {}
        self._day = _today()

    @property
    def on(self) -> bool:
        """Whether answers are budgeted at all (``clients.budget`` is set)."""
        return self._config().clients.budget is not None

    # -- how much -------------------------------------------------------------------------------------------------

    def budget(self, ctx: CallContext) -> int | None:
        """The most tokens an answer may take for this call; None: not budgeted."""
        config = self._config()
        clients, spec = config.clients, config.clients.budget
        found: list[int] = []
        if spec is not None:
            declared = ctx.declared.tokens
            large = declared is not None and declared >= clients.large_context_tokens
            window = declared if declared is not None else spec.unknown_window
            if not (large and spec.exempt_large):
                if window is not None:
                    found.append(int(window * spec.answer_share))
                if spec.answer_tokens is not None:
                    found.append(spec.answer_tokens)
        caller_budget = self._caller_budget(config, ctx)
        if caller_budget is not None and caller_budget.answer_tokens is not None:
            found.append(caller_budget.answer_tokens)
        return max(min(found), _NOTE_TOKENS * 2) if found else None

    def _caller_budget(self, config: Federation, ctx: CallContext) -> Any:
        if not config.policies:
            return None
        policy = config.policies.get(policy_for(config.policies, ctx.caller))
        return policy.budget if policy is not None else None

    # -- the daily allowance --------------------------------------------------------------------------------------

    def refusal(self, ctx: CallContext, tool: str) -> types.CallToolResult | None:
        """An isError refusal when the caller is over its daily allowance, else None."""
        budget = self._caller_budget(self._config(), ctx)
        if budget is None or budget.daily_tokens is None:
            return None
        spent = self._spent_today(ctx)
        if spent < budget.daily_tokens:
            return None
        resets = time.strftime("%Y-%m-%d 00:00 UTC", time.gmtime((self._day + 1) * 86400))
        text = (
            f"{tool} was not called: this caller has received {spent:,} tokens of answers today, its daily allowance "
            f"is {budget.daily_tokens:,} tokens; it resets at {resets}."
        )
        return types.CallToolResult(content=[types.TextContent(text=text)], is_error=True)

    def spend(self, ctx: CallContext, tokens: int) -> None:
        """Count ``tokens`` of an answer against the caller's day."""
        key = _caller_key(ctx)
        self._spent_today(ctx)
        self._spent[key] = self._spent.get(key, 0) + tokens

    def _spent_today(self, ctx: CallContext) -> int:
        today = _today()
        if today != self._day:
            self._day, self._spent = today, {}
        return self._spent.get(_caller_key(ctx), 0)

    # -- the cut --------------------------------------------------------------------------------------------------

    def deliver(
        self, result: types.CallToolResult, status: str, ctx: CallContext, tool: str
    ) -> tuple[types.CallToolResult, int]:
        """The answer of a call that ended with ``status``, within its budget, and its tokens as delivered (counted
        against the caller's day)."""
        budget = self.budget(ctx) if status in ("ok", "degraded", "error") else None
        tokens = -1
        if budget is not None:
            cut = self.cut(result, budget, ctx, tool)
            result, tokens = cut.result, cut.shown
        if tokens < 0:
            tokens = self._count("\n\n".join(b.text for b in result.content if isinstance(b, types.TextContent)))
        self.spend(ctx, tokens)
        return result, tokens

    def cut(self, result: types.CallToolResult, budget: int, ctx: CallContext, tool: str) -> Cut:
        """``result`` within ``budget`` tokens (see the module docstring); ``result`` itself when it fits."""
        texts = [b for b in result.content if isinstance(b, types.TextContent)]
        whole = "\n\n".join(b.text for b in texts)
        if result.is_error or within(whole, budget):
            return Cut(result, -1, -1, None)
        total = self._count(whole)
        if total <= budget:
            return Cut(result, total, total, None)
        room = budget - _NOTE_TOKENS
        listed = _listed(result)
        units: list[str]
        if listed is not None:
            units = [json.dumps(item, ensure_ascii=False) for item in listed[1]]
            hits = True
        else:
            units, hits = _paragraphs(whole), False
        shown, used = self._head(units, room)
        if shown == 0 and hits:  # one hit larger than the budget: cut its JSON as text
            units, hits = [whole], False
        if shown == 0:
            units = [*split_unit(units[0], room, self._count), *units[1:]]
            shown, used = self._head(units, room)
        self.kept.configure(**self._bounds())
        kept = self.kept.keep(
            owner_of(ctx.caller), tool, units, hits=hits, page_tokens=room, first_page=shown,
            tokens=total,
        )  # fmt: skip
        head = units[:shown]
        note = _note(kept, shown, len(units), hits, used, total, budget)
        return Cut(_rebuilt(result, head, hits, listed, note, kept, used, total), used + self._count(note), total, kept)

    def _head(self, units: list[str], room: int) -> tuple[int, int]:
        """How many whole units fit in ``room`` tokens, and their tokens."""
        used = 0
        for n, unit in enumerate(units):
            cost = self._count(unit) + 2
            if used + cost > room:
                return n, used
            used += cost
        return len(units), used

    def _bounds(self) -> dict[str, Any]:
        spec = self._config().clients.budget
        return {"keep_s": spec.keep_s, "keep_bytes": spec.keep_bytes} if spec is not None else {}

    # -- reading the rest ------------------------------------------------------------------------------------------

    def read(self, ctx: CallContext, ident: str, page: int) -> Page | None:
        """Page ``page`` of the caller's kept answer ``ident`` (an id or its URI); None when it is not there."""
        ident, asked = _parse(ident)
        item = self.kept.get(owner_of(ctx.caller), ident)
        return self.kept.page(item, asked or page) if item is not None else None

    def read_tool(self, ctx: CallContext, arguments: Mapping[str, Any]) -> types.CallToolResult:
        """The built-in ``read_result`` tool's answer."""
        ident, page = arguments.get("id"), arguments.get("page", 2)
        if not isinstance(ident, str) or not ident or not isinstance(page, int) or isinstance(page, bool) or page < 1:
            text = f"{READ_TOOL} needs an id (a string) and a page (an integer, 1 or more)."
            return types.CallToolResult(content=[types.TextContent(text=text)], is_error=True)
        found = self.read(ctx, ident, page)
        if found is None:
            text = (
                f"No kept result {ident!r} page {page} for this caller: it expired, was never kept, or has fewer pages."
            )
            return types.CallToolResult(content=[types.TextContent(text=text)], is_error=True)
        tail = _page_line(found, _parse(ident)[0])
        structured = {"results": found.structured, "more": tail[1]} if found.structured is not None else None
        return types.CallToolResult(
            content=[types.TextContent(text=found.text), types.TextContent(text=tail[0])],
            structured_content=structured,
        )

    def resource(self, ctx: CallContext, uri: str) -> types.ReadResourceResult | None:
        """``resources/read`` of a kept answer's page; None when this caller has no such result."""
        found = self.read(ctx, uri, 1)
        if found is None:
            return None
        mime = "application/json" if found.hits else "text/plain"
        return types.ReadResourceResult(
            contents=[types.TextResourceContents(uri=uri, text=found.text, mime_type=mime)],
            _meta={"mcp-gateway/page": _page_line(found, _parse(uri)[0])[1]},
        )

    def resources(self, ctx: CallContext) -> list[dict[str, Any]]:
        """The caller's kept answers as ``resources/list`` entries (wire shape)."""
        listed = []
        for item in self.kept.listed(owner_of(ctx.caller)):
            listed.append(
                {
                    "uri": SCHEME + item.id,
                    "name": f"{item.tool} result {item.id}",
                    "description": f"The whole answer of a {item.tool} call cut to a budget (~{item.tokens:,} tokens).",
                    "mimeType": "application/json" if item.hits else "text/plain",
                    "size": item.size,
                }
            )
        return listed


def _today() -> int:
    return int(time.time() // 86400)


def _caller_key(ctx: CallContext) -> str:
    caller = ctx.caller
    return f"{caller.issuer or ''}\x00{caller.subject or ''}\x00{caller.name or ''}"


def _parse(ident: str) -> tuple[str, int | None]:
    """An id or a ``gateway://results/ID?page=N`` URI -> (id, page or None)."""
    if not ident.startswith(SCHEME):
        return ident, None
    parts = urlsplit(ident)
    page = parse_qs(parts.query).get("page", [None])[0]
    return ident[len(SCHEME) :].split("?", 1)[0], int(page) if page is not None and page.isdigit() else None


def _paragraphs(text: str) -> list[str]:
    """``text`` cut at blank lines, a fenced code block (```) kept whole with the paragraph it is in."""
    out: list[str] = []
    fenced = False
    for part in text.split("\n\n"):
        if fenced and out:
            out[-1] += "\n\n" + part
        elif part.strip():
            out.append(part)
        fences = sum(1 for line in part.split("\n") if line.lstrip().startswith("```"))
        fenced = fenced != (fences % 2 == 1)
    return out


def _listed(result: types.CallToolResult) -> tuple[str, list[Any]] | None:
    """The key and items of a structured result's one list (a search's ``results``), if it has one."""
    structured = result.structured_content
    if not isinstance(structured, dict):
        return None
    if isinstance(structured.get("results"), list):
        return "results", structured["results"]
    lists = [(k, v) for k, v in structured.items() if isinstance(v, list)]
    return lists[0] if len(lists) == 1 else None


def _note(kept: Kept | None, shown: int, units: int, hits: bool, used: int, total: int, budget: int) -> str:
    what = (
        f"{'hits' if hits else 'parts'} 1-{shown} of {units}"
        if shown
        else f"none of {units} {'hits' if hits else 'parts'}"
    )
    head = f"[Cut to this client's budget of {budget:,} tokens: {what} shown (~{used:,} of ~{total:,} tokens)."
    if kept is None:
        return head + " The rest was too large to keep.]"
    return (
        f"{head} The rest, page by page: resources/read {SCHEME}{kept.id}?page=2, or the tool {READ_TOOL} with "
        f'{{"id": "{kept.id}", "page": 2}}. Kept for {_duration(kept)}.]'
    )


def _duration(kept: Kept) -> str:
    left = max(0, round(kept.expires - time.monotonic()))
    return f"{left // 60} min" if left >= 120 else f"{left} s"


def _page_line(page: Page, ident: str) -> tuple[str, dict[str, Any]]:
    more: dict[str, Any] = {"page": page.number, "first": page.first + 1, "last": page.last, "of": page.units}
    where = f"[Page {page.number}: parts {page.first + 1}-{page.last} of {page.units}"
    if page.last >= page.units:
        return f"{where}, the last.]", more
    nxt = page.number + 1
    more["next"] = f"{SCHEME}{ident}?page={nxt}"
    return f'{where}; next: {READ_TOOL} {{"id": "{ident}", "page": {nxt}}}.]', more


def _rebuilt(
    result: types.CallToolResult,
    head: list[str],
    hits: bool,
    listed: tuple[str, list[Any]] | None,
    note: str,
    kept: Kept | None,
    used: int,
    total: int,
) -> types.CallToolResult:
    """``result`` with its text (and its structured list) cut to ``head``, and ``note`` as a last text block."""
    others = [b for b in result.content if not isinstance(b, types.TextContent)]
    structured = result.structured_content
    if hits and listed is not None:
        text = "[\n" + ",\n".join(head) + "\n]" if head else "[]"
        more: dict[str, Any] = {"shown": len(head), "of": len(listed[1]), "tokens_shown": used, "tokens": total}
        if kept is not None:
            more["uri"] = f"{SCHEME}{kept.id}?page=2"
        structured = {**(structured or {}), listed[0]: [json.loads(u) for u in head], "more": more}
    else:
        text = "\n\n".join(head)
    content: list[Any] = [types.TextContent(text=text), *others, types.TextContent(text=note)]
    return result.model_copy(update={"content": content, "structured_content": structured})
