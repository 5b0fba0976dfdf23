"""Who a request comes from, and the credentials a caller's requests carry downstream; never what they may see
(that is core/policies.py).

tokens: the static bearer tokens, compared in constant time; oauth: JWT access tokens from configured issuers (the
gateway as an OAuth 2.1 resource server); cookies: the status page's signed session; secrets: per-caller values for a
server's headers (``${caller.secret:NAME}``); exchange: RFC 8693 downstream tokens; credentials: both, as one
caller's headers to one server.
"""
