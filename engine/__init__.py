"""shingle's storage engine: catalog, namespace, data path and lifecycle.

Knows nothing of NFS, SMB or HTTP (see docs/ARCHITECTURE.md)."""
