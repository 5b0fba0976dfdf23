"""The gateway's client half: every kind of downstream behind one protocol (base.py ``Backend``).

mcp/: a supervised session to a downstream MCP server (stdio, streamable HTTP, SSE); cli/: a command-line program
spawned once per call; wiki/: file tools over a folder of markdown, in process. processes.py: no spawned process
outlives its owner; backoff.py: how long a backend waits before it tries again. Nothing here reads a client's
request: what a backend learns of it comes as an argument (gateway/calls.py ``Upstream``).
"""
