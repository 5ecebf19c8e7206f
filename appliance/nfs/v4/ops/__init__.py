"""NFSv4.1 operations by area, and NFSv4.0's own (v40); importing this package registers
every handler in appliance.nfs.v4.registry. common holds the helpers several areas use."""
from appliance.nfs.v4.ops import fs, io, locks, session, v40  # noqa: F401
