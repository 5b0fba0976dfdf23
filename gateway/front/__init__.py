"""Where a request enters and its answer leaves: the gateway's server half.

face.py serves every MCP request kind (server.py the SDK server under it); eras.py and bridges.py carry
multi-round-trip requests across the protocol eras; channels.py is the way back to a client; clients.py what each
client is owed besides answers (list changes, log messages, resource updates); exposure.py search mode;
continuation.py the sealed requestState; scope.py what the HTTP edge hands on; stdio.py and http/ the transports.
The front knows the backends only by their protocol.
"""
