"""Background data lifecycle: the jobs that keep bands healthy and cheap to clean.

- ``pacing``: rate limits (bytes/s, items/s) and progress with ETA, shared by all jobs.
- ``drives``: drive states (online, degraded, failed, draining, removed) and the
  redundancy status (how many stripes run with reduced redundancy).
- ``cleaning``: band cleaning by the LFS cost-benefit rule.
- ``scrub``: verify every fragment's checksum and repair from redundancy.
- ``rebuild``: reconstruct the fragments of failed drives elsewhere; drain a drive.
- ``tiering``: hot -> warm -> cold and back, with the extent swap in one transaction.
- ``media`` / ``repair``: fragment appends through the data path's drive writers,
  reconstruction and relocation shared by the jobs above.
- ``jobs``: the jobs as runners for the daemon's job queue.

Plain functions for the CLI and the daemon (long ones take ``progress(done, total, message)``):
    drives.list_drives(catalog), drives.fail_drive(catalog, drive, actor),
    drives.start_drain(catalog, drive, actor), drives.redundancy_status(catalog),
    rebuild.rebuild(datapath, catalog, progress=, actor=, bytes_per_s=),
    rebuild.drain_drive(datapath, catalog, drive, progress=, actor=, bytes_per_s=),
    scrub.scrub(datapath, catalog, progress=, actor=, bytes_per_s=),
    cleaning.clean(datapath, catalog, progress=, actor=, max_zones=, target_free_zones=),
    tiering.tier_run(namespace, datapath, catalog, policy=, reads=, progress=, actor=),
    jobs.runners(namespace, datapath, catalog)
        -> {"tier"|"clean"|"scrub"|"rebuild"|"drain": runner}.
Each returns a report dataclass with ``to_dict()``.
"""
