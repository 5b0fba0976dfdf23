"""Where a request is routed: the merged catalog (catalog.py, listings.py) and the router (router.py) with its one
record per request (record.py), breakers, budget, result shapes, the context gate, costs and policies; what downstreams
are trusted to say (pins.py, poisoning.py, shadowing.py, leaks.py); runtime.py owns the gateway's lifetime and every
backend's (stopping.py: in order), reload.py what an edit of federation.yaml changes.
"""
