"""The sign-in to a remote server as its users do it: in headless Chromium (Debian's ``chromium`` driven by
Playwright), from the gateway's Connections page or from the link a call answered, through the tests' OpenID
provider's login and consent pages and back to the gateway's callback; each caller's next call is served with their
own account.
Around it the real parts of tests/backends/mcp/test_signin.py: the provider, the protected server, the gateway."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.backends.mcp.test_signin import gateway, oauth_world, ready, whoami
from tests.fixtures.identity import holds_jwt
from tests.fixtures.procs import RunningServer
from tests.front.http.test_ui import CHROMIUM_ARGS

pytestmark = [pytest.mark.anyio, pytest.mark.spawns]

ALICE, BOB = "tok-alice-0123456789", "tok-bob-0123456789"


async def sign_in(page: Any, gw: RunningServer, token: str, account: str, link: str | None) -> None:
    """Sign in to the gateway's page with ``token``, then to the server ``remote`` as ``account``: from ``link``
    (what a call answered), else from the Connections page's list of servers."""
    await page.goto(gw.url("/ui/login"))
    await page.fill("#token", token)
    await page.click("button[type=submit]")
    await page.wait_for_url(gw.url("/ui/"))
    if link is None:
        await page.goto(gw.url("/ui/connections"))
        await page.click("a[href$='/connect/remote']")
    else:
        await page.goto(link)
    await page.wait_for_selector("input[name=login]")  # the provider's page, not the gateway's
    assert not page.url.startswith(gw.url())
    await page.fill("input[name=login]", account)
    await page.fill("input[name=password]", "any")
    await page.click("button[type=submit]")
    callback = re.compile(re.escape(gw.url("/ui/connect/callback")) + ".*")
    for _ in range(3):  # the provider's consent page, when it asks
        if callback.match(page.url):
            break
        consent = page.locator("button[type=submit]")
        if await consent.count():
            await consent.first.click()
        await page.wait_for_load_state()
    await page.wait_for_url(callback)


async def test_in_chromium_callers_sign_in_from_the_page_and_from_the_link_and_are_served(tmp_path: Path) -> None:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("Debian's `chromium` is not installed (apt-get install chromium)")
    api = pytest.importorskip("playwright.async_api", reason="Playwright's Python package is not installed")
    visited: list[str] = []
    with oauth_world(tmp_path) as (_idp, server, port), gateway(tmp_path, server, port) as gw:
        async with api.async_playwright() as playwright:
            browser = await playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
            try:
                # alice, the first: from the Connections page of the gateway's /ui
                alice = await browser.new_page()
                alice.set_default_timeout(15_000)
                alice.on("request", lambda request: visited.append(request.url))
                await sign_in(alice, gw, ALICE, "alice-account", None)
                await api.expect(alice.locator("body")).to_contain_text("alice is signed in to remote")
                await ready(gw)
                # bob: his call answers with the link (what the model reads and hands its user), he opens it
                refused, text = await whoami(gw, BOB)
                link = re.search(r"http://\S+/ui/connect/remote", text)
                assert refused and link is not None, text
                bob = await browser.new_context()
                page = await bob.new_page()
                page.set_default_timeout(15_000)
                page.on("request", lambda request: visited.append(request.url))
                await sign_in(page, gw, BOB, "bob-account", link.group(0))
                await api.expect(page.locator("body")).to_contain_text("bob is signed in to remote")
                await page.goto(gw.url("/ui/connections"))
                await api.expect(page.locator("body")).to_contain_text("bob -> remote")
                await api.expect(page.locator("body")).not_to_contain_text("alice -> remote")  # not an operator
            finally:
                await browser.close()
        assert (await whoami(gw, ALICE)) == (False, "account: alice-account")
        assert (await whoami(gw, BOB)) == (False, "account: bob-account")
        log = gw.output()
    assert not [url for url in visited if ALICE in url or BOB in url]  # a caller's token never in a URL
    assert not holds_jwt(log), "a JWT reached the gateway's log"
