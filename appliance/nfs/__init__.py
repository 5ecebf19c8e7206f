"""shingle's userspace NFSv4.1 server.

Entry points: ``appliance.nfs.server.NfsServer`` (asyncio) and
``appliance.nfs.server.NfsServerThread`` (its own thread and loop, for tests
and ``shingle serve``); ``appliance.nfs.exports.ensure_default_export``.

Modules: xdr (declarative XDR codecs), types4 (the NFSv4.1 declarations),
const (protocol numbers), rpc (ONC RPC over TCP), compound (the COMPOUND
executor), ops_session / ops_fs / ops_state (operations by area), state
(clients, sessions, stateids, locks, leases, grace), attrs (fattr4), fh
(persistent signed file handles), exports (catalog exports, pseudo-root).
"""
