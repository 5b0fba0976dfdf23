"""A federated MCP gateway: one MCP endpoint in front of many downstream MCP servers, command-line adapters and the
built-in wiki.

The house, by layers (each imports only from its own layer or below; tests/test_layering.py enforces it):

  front/      where a request enters and its answer leaves: the MCP face (one method per request kind), the two
              protocol eras, each client's notifications, search exposure, stdio, and http/ (guard, sessions, limits)
  core/       where a request is routed: the catalog, the router and its one record per request, breakers, budget,
              policies, the context gate, the runtime that owns every backend's lifetime, reload
  backends/   where it leaves for a downstream: the Backend protocol, and the mcp/, cli/ and wiki/ families
  search/     ranking and the tool index      auth/     who a caller is      observe/, ledger/   logs, metrics,
  config/     federation.yaml                 calls.py  the values every layer passes (Caller, Upstream, ...)
  cli/        the ``gateway`` command          testing.py  a FakeBackend and an in-process gateway for tests
"""
