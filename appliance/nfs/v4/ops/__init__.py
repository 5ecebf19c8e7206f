"""NFSv4.1 operations by area; importing this package registers every handler in
appliance.nfs.v4.registry. common holds the helpers several areas use."""
from appliance.nfs.v4.ops import fs, io, locks, session  # noqa: F401
