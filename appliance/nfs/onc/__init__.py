"""ONC RPC over TCP, the layer under every NFS version: declarative XDR (xdr),
RPC messages and credentials (rpc), record marking and replies per connection
(connection). Nothing here knows NFS."""
