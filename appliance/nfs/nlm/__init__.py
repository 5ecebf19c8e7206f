"""NLM v4 (network lock manager, program 100021) and NSM (status monitor, program 100024)
for NFSv3 clients: their fcntl locks are byte-range locks of the NFSv4 state table, so they
conflict with NFSv4 locks on the same file. ``types`` declares the XDR, ``manager`` applies
requests to the state table, ``program`` and ``nsm`` answer the RPC programs."""
