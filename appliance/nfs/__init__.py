"""shingle's userspace NFS server: NFSv4.1, NFSv3 and MOUNT v3 on one port.

Entry points: ``appliance.nfs.server.NfsServer`` (asyncio) and
``appliance.nfs.server.NfsServerThread`` (its own thread and loop, for tests
and ``shingle serve``); ``appliance.nfs.exports.ensure_default_export``.

Layers, each importing only the ones below it:
  onc/      ONC RPC over TCP: XDR (xdr), RPC messages (rpc), record marking (connection)
  fh, exports, access, stats
            shared by every version: signed file handles, the exports table and
            pseudo-root, handle -> export -> access -> generation checks and the
            status maps (access), counters
  state/    the NFS state table v4/ and nlm/ share (clients, sessions, opens, locks);
            of v4/ it uses the protocol's numbers and XDR types (const, types) only
  v4/       NFSv4.0-4.2: const, types, attrs, registry (each operation's facts and
            handlers), context, compound, compound40, ops/, program
  v3/       NFSv3 and MOUNT: types, context, procedures, program, mount
  server    wiring: the listener, the programs by number, workers, housekeeping
"""
