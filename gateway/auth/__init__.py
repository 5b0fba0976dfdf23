"""Identity and access, in one family: who a request comes from and what it may see, call and send on.

* ``auth.tokens``: the static bearer tokens (``GATEWAY_TOKENS``), compared in constant time;
* ``auth.oauth``: JWT access tokens from configured issuers (the gateway as an OAuth 2.1 resource server);
* ``auth.policies``: the ``policies:`` section: each caller's view of the catalog (tools, resources, prompts),
  pre-serialised once per policy and catalog;
* ``auth.secrets``: per-caller secrets for a server's headers (``${caller.secret:NAME}``);
* ``auth.exchange``: OAuth 2.0 Token Exchange (RFC 8693), a downstream token per caller;
* ``auth.credentials``: both of those, as one caller's headers to one server;
* ``auth.cookies``: the status page's signed session cookie.

The modules sit in different layers (tests/test_layering.py): tokens and cookies below config; oauth, secrets,
exchange and credentials above the log's redactor; policies next to the catalog it filters. This file imports none
of them, so importing one never drags in the others.
"""
