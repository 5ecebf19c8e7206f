"""Background data lifecycle: the jobs that keep bands healthy and cheap to clean.

- ``pacing``: rate limits (bytes/s, items/s) and progress with ETA, shared by all jobs.
- ``drives``: drive states (online, degraded, failed, draining, removed) and the
  redundancy status (how many stripes run with reduced redundancy).
- ``cleaning``: band cleaning by the LFS cost-benefit rule.
- ``scrub``: verify every fragment's checksum and repair from redundancy.
- ``rebuild``: reconstruct the fragments of failed or draining drives elsewhere.
- ``tiering``: hot -> warm -> cold and back, with the extent swap in one transaction.

Modules import the data path lazily where they need it, so retention and the
web UI can use ``drives`` without opening any drive.
"""
