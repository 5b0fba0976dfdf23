"""The gateway's one search engine: ranking parts (ranking.py: BM25, the static embedding model, fusion) and the
tool index over tool definitions (tools.py), pure and blocking. The wiki's search uses the same parts."""
