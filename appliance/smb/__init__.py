"""SMB for shingle: the local POSIX mount of the namespace (mount.py, FUSE through pyfuse3) and
Samba sharing it (samba.py: smb.conf, passwords, smbd supervised by the daemon). Shares and SMB
users are catalog rows managed through engine/admin/smb.py (CLI: appliance/cli/smb.py, web UI:
webui/smb.py).

A daemon running as root mounts and runs smbd itself. One that is not (shingle-nfsd.service runs
as the service user) cannot: it writes smb.conf and serves the mount that shingle-smbd.service
(`shingle smbd`, root) makes and hands over (unit.py)."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from appliance.smb.mount import FuseMount
    from appliance.smb.samba import SmbdSupervisor
    from appliance.smb.unit import FuseHandover

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
        smbd_unit: bool | None = None,
    ):
        from appliance.smb.samba import SambaLayout

        self.appliance = appliance
        self.layout = SambaLayout.for_data_dir(appliance.config.data_dir)
        self.port, self.host = port, host
        self.mountpoint = Path(mountpoint) if mountpoint else self.layout.mount
        # smbd acts as each SMB user: only root runs it; otherwise shingle-smbd.service does
        if smbd_unit is None:
            who = appliance.config.get("smb.smbd")
            smbd_unit = who == "unit" or (who == "auto" and os.geteuid() != 0)
        self.smbd_unit = smbd_unit
        self.mount: FuseMount | None = None
        self.supervisor: SmbdSupervisor | None = None
        self.handover: FuseHandover | None = None

    def start(self) -> None:
        from appliance.smb.mount import FuseMount
        from appliance.smb.samba import SmbdSupervisor
        from engine.admin import smb as smb_service

        self.layout.create()
        if self.port is not None and self.smbd_unit:
            self._start_for_unit()
            return
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
        deadline = time.monotonic() + 30
        while not supervisor.started_ok.wait(0.2):
            if supervisor.problem is not None:
                return  # the supervisor logged it and reports it (status, alerts, /metrics)
            if time.monotonic() > deadline:
                log.error(
                    "smbd is not accepting connections on %s:%d yet (see %s)",
                    self.host,
                    self.port,
                    supervisor.layout.log_file,
                )
                return

    def _start_for_unit(self) -> None:
        from appliance.smb.samba import SmbdSupervisor
        from appliance.smb.unit import FuseHandover
        from engine.admin import smb as smb_service

        assert self.port is not None  # start() checked
        smb_service.ensure_default_share(self.appliance.catalog, self._default_export_path())
        self.supervisor = SmbdSupervisor(
            self.appliance.catalog,
            self.layout,
            mount=self.layout.mount,
            host=self.host,
            port=self.port,
            run_smbd=False,
        )
        self.supervisor.refresh()  # smb.conf before the unit looks for it
        self.supervisor.start()
        handover = self.handover = FuseHandover(
            self.appliance.namespace, self.layout, on_mount=self._unit_mounted
        )
        handover.listen()
        handover.start()

    def _unit_mounted(self, mountpoint: Path) -> None:
        """smb.conf names the unit's mount point before smbd starts on it."""
        assert self.supervisor is not None
        self.supervisor.set_mount(mountpoint)

    def _default_export_path(self) -> str:
        from engine.admin import exports as export_service

        for export in export_service.list_exports(self.appliance.catalog):
            if export.name == export_service.DEFAULT_NAME:
                return export.path
        return "/"

    def healthy(self) -> bool:
        """The mount serves and the supervisor runs (smbd itself is restarted when it exits)."""
        if self.handover is not None:  # the unit's mount comes and goes with the unit
            return self.handover.is_alive() and (
                self.supervisor is not None and self.supervisor.is_alive()
            )
        return (
            self.mount is not None
            and self.mount.alive()
            and (self.supervisor is None or self.supervisor.is_alive())
        )

    def stop(self) -> None:
        if self.handover is not None:
            self.handover.stop()
            self.handover = None
        if self.supervisor is not None:
            self.supervisor.stop()
            self.supervisor = None
        if self.mount is not None:
            self.mount.stop()
            self.mount = None
