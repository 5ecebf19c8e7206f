"""NFSv4.1 operations by area, NFSv4.0's own (v40) and NFSv4.2's (v42); importing this package
registers every handler in appliance.nfs.v4.registry. common holds the helpers several areas
use."""

from appliance.nfs.v4.ops import fs, io, locks, pnfs, session, v40, v42  # noqa: F401
