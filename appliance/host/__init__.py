"""Putting the appliance on a host: install and uninstall (install.py), the venv the units run
(venv.py), what a unit may execute in its sandbox (unitexec.py), the host check (doctor.py),
systemd's notify protocol and watchdog (sdnotify.py), the web UI's self-signed certificate
(tls.py)."""
