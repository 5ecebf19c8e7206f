"""SMB for shingle: the local POSIX mount of the namespace (mount.py, FUSE through pyfuse3) and
Samba sharing it (samba.py: smb.conf, passwords, smbd supervised by the daemon). Shares and SMB
users are catalog rows managed through engine/smb.py (CLI: appliance/cli_smb.py, web UI:
webui/smb.py)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from appliance.smb.mount import FuseMount
    from appliance.smb.samba import SmbdSupervisor

log = logging.getLogger("shingle.smb")


class SmbService:
    """What ``shingle serve --smb-port P`` (or ``--mount DIR``) adds to the daemon: the mount,
    and with a port smbd sharing it; stopped in the reverse order (smbd holds files open)."""

    def __init__(
        self,
        appliance,
        *,
        port: int | None,
        host: str = "127.0.0.1",
        mountpoint: Path | str | None = None,
    ):
        from appliance.smb.samba import SambaLayout

        self.appliance = appliance
        self.layout = SambaLayout.for_data_dir(appliance.config.data_dir)
        self.port, self.host = port, host
        self.mountpoint = Path(mountpoint) if mountpoint else self.layout.mount
        self.mount: FuseMount | None = None
        self.supervisor: SmbdSupervisor | None = None

    def start(self) -> None:
        from appliance.smb.mount import FuseMount
        from appliance.smb.samba import SmbdSupervisor
        from engine import smb as smb_service

        self.layout.create()
        mount = self.mount = FuseMount(self.appliance.namespace, self.mountpoint)
        mount.start()
        if self.port is None:
            return
        smb_service.ensure_default_share(self.appliance.catalog, self._default_export_path())
        supervisor = self.supervisor = SmbdSupervisor(
            self.appliance.catalog,
            self.layout,
            mount=self.mountpoint,
            host=self.host,
            port=self.port,
            mount_alive=mount.alive,
        )
        supervisor.start()
        if not supervisor.started_ok.wait(30):
            log.error(
                "smbd is not accepting connections on %s:%d yet (see %s)",
                self.host,
                self.port,
                supervisor.layout.log_file,
            )

    def _default_export_path(self) -> str:
        from engine import exports as export_service

        for export in export_service.list_exports(self.appliance.catalog):
            if export.name == export_service.DEFAULT_NAME:
                return export.path
        return "/"

    def healthy(self) -> bool:
        """The mount serves and the supervisor runs (smbd itself is restarted when it exits)."""
        return (
            self.mount is not None
            and self.mount.alive()
            and (self.supervisor is None or self.supervisor.is_alive())
        )

    def stop(self) -> None:
        if self.supervisor is not None:
            self.supervisor.stop()
            self.supervisor = None
        if self.mount is not None:
            self.mount.stop()
            self.mount = None
