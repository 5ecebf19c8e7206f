"""NFS state: clients, sessions and their slot tables (the reply cache), open and lock
stateids, share reservations, byte-range locks, leases and the grace period after a restart,
for NFSv4.0, 4.1 and 4.2 clients and NLM hosts alike (one table: their opens and locks
conflict).

This package's face is what it exports here, and two modules of rules on the table:
``clients`` (NFSv4.1 client records: EXCHANGE_ID's cases, confirmation, lease expiry) and
``v40`` (what only NFSv4.0 keeps: SETCLIENTID records, owners and their seqids). The table
(``StateTable``, table.py) is a small core (core.py) with parts that each own their data:
records.py, sessions.py, replies.py, grace.py, leases.py, shares.py, locks.py, nlm.py. It
speaks NFSv4's statuses and XDR (appliance.nfs.v4.const and types) and imports nothing else of
v4/."""

from appliance.nfs.state.heads import HeadRegistry, head_name, nsm_hosts_key
from appliance.nfs.state.locks import INF, is_write, lock_range
from appliance.nfs.state.model import Client, LockState, NfsError, OpenState, Session, Slot
from appliance.nfs.state.table import StateTable

__all__ = [
    "INF",
    "Client",
    "HeadRegistry",
    "LockState",
    "NfsError",
    "OpenState",
    "Session",
    "Slot",
    "StateTable",
    "head_name",
    "nsm_hosts_key",
    "is_write",
    "lock_range",
]
