"""The drive agent: the one process that writes a storage host's drives (server.py)."""
