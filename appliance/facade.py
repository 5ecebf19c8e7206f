"""What the web UI may use of appliance/: the one door between the two siblings over engine/.

webui/ and appliance/ both sit on engine/ (docs/ARCHITECTURE.md, "Layers"); the web UI still
needs a few facts only the appliance knows (its config file, its parts opened without a data
path, the status summary and the cluster's leader, Samba's files and smbd's state, the log
format). They are named here, so a change on the appliance side shows which of them the web UI
relies on, and tests/test_layers.py keeps every other appliance module out of webui/.
"""

from __future__ import annotations

from appliance import log
from appliance.config import Config, ConfigError, load, parse_size
from appliance.runtime import Appliance
from appliance.smb.samba import SambaLayout, SambaPassdb, smb_status
from appliance.status import SPACE_STATES, gather, leader_report, smb_report, space_by_state

__all__ = [
    "SPACE_STATES",
    "Appliance",
    "Config",
    "ConfigError",
    "SambaLayout",
    "SambaPassdb",
    "gather",
    "leader_report",
    "load",
    "log",
    "parse_size",
    "smb_report",
    "smb_status",
    "space_by_state",
]
