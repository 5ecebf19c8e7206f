"""Can a unit's service user execute its ExecStart= inside the unit's sandbox?

systemd starts ExecStart= as User= after setting up the sandbox: ProtectHome=yes (or
tmpfs) hides /home, /root and /run/user, PrivateTmp=yes gives an empty /tmp and
/var/tmp. A launcher, its #! interpreter or a venv's base Python in one of them, or a
folder on the way that the user may not search, ends in 203/EXEC. This module follows
the chain (launcher -> #! interpreter -> symlinks -> a venv's pyvenv.cfg home) as the
target host sees it and says what the user cannot reach; `shingle install` refuses such
units and `shingle doctor` fails on them.
"""

from __future__ import annotations

import grp
import os
import pwd
import shlex
import stat
from dataclasses import dataclass
from pathlib import Path

PROTECT_HOME_HIDES = (Path("/home"), Path("/root"), Path("/run/user"))
PRIVATE_TMP_HIDES = (Path("/tmp"), Path("/var/tmp"))
EXEC, READ = 0o1, 0o4


@dataclass
class ServiceSandbox:
    """The parts of a service's settings that decide what its ExecStart= can reach."""

    exec_start: list[str]
    user: str | None
    supplementary_groups: list[str]
    hidden: list[Path]


def read_service(texts: list[str]) -> ServiceSandbox:
    """A unit's text followed by its drop-ins' (later settings win, as in systemd)."""
    values: dict[str, str] = {}
    groups: list[str] = []
    for text in texts:
        section = ""
        for line in text.splitlines():
            line = line.strip()
            if line.startswith("[") and line.endswith("]"):
                section = line[1:-1]
            elif section == "Service" and "=" in line and not line.startswith(("#", ";")):
                key, value = (part.strip() for part in line.split("=", 1))
                if key == "SupplementaryGroups":
                    groups = groups + value.split() if value else []
                elif key != "ExecStart" or value:  # an empty ExecStart= resets the list
                    values[key] = value
    argv = shlex.split(values.get("ExecStart", ""))
    if argv:
        argv[0] = argv[0].lstrip("@-:+!")
    hidden: list[Path] = []
    if values.get("ProtectHome", "no") in ("yes", "true", "tmpfs"):
        hidden += PROTECT_HOME_HIDES
    if values.get("PrivateTmp", "no") in ("yes", "true"):
        hidden += PRIVATE_TMP_HIDES
    return ServiceSandbox(argv, values.get("User"), groups, hidden)


@dataclass
class Identity:
    """Who runs the command: uid and every gid it holds (None: a user not created yet, who
    owns nothing and is in no group of the files' owners)."""

    name: str
    uid: int | None
    gids: frozenset[int]

    @classmethod
    def of(cls, user: str | None, supplementary: list[str]) -> Identity:
        name = user or "root"
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            return cls(name, None, frozenset())
        gids = {entry.pw_gid, *(g.gr_gid for g in grp.getgrall() if name in g.gr_mem)}
        for group in supplementary:
            try:
                gids.add(grp.getgrnam(group).gr_gid)
            except KeyError:
                pass
        return cls(name, entry.pw_uid, frozenset(gids))

    def may(self, st: os.stat_result, want: int) -> bool:
        if self.uid == 0:
            return want != EXEC or bool(st.st_mode & 0o111) or stat.S_ISDIR(st.st_mode)
        if st.st_uid == self.uid:
            bits = st.st_mode >> 6
        elif st.st_gid in self.gids:
            bits = st.st_mode >> 3
        else:
            bits = st.st_mode
        return bits & want == want


def _hidden_by(path: Path, hidden: list[Path]) -> Path | None:
    return next((h for h in hidden if path == h or path.is_relative_to(h)), None)


def exec_problems(
    sandbox: ServiceSandbox, root: Path = Path("/"), identity: Identity | None = None
) -> tuple[list[Path], list[str]]:
    """(the chain of files the start executes, what keeps the user from executing it);
    paths as the target host sees them, looked up under ``root``."""
    identity = identity or Identity.of(sandbox.user, sandbox.supplementary_groups)
    if not sandbox.exec_start:
        return [], ["no ExecStart="]
    chain: list[Path] = []
    problems: list[str] = []
    pending = [(Path(sandbox.exec_start[0]), EXEC)]
    while pending and len(chain) < 16:
        path, want = pending.pop(0)
        if not path.is_absolute():
            problems.append(f"{path} is not an absolute path (ExecStart= needs one)")
            break
        if path in chain:
            continue
        chain.append(path)
        where = _hidden_by(path, sandbox.hidden)
        if where is not None:
            problems.append(f"{path} is under {where}, which the unit's sandbox hides")
            break
        host = root / path.relative_to("/")
        if root != Path("/") and not os.path.lexists(host):
            break  # a staging root holds only what shingle lays out; the image brings the rest
        problem = _reach(root, path, identity, want)
        if problem:
            problems.append(problem)
            break
        if host.is_symlink():
            target = Path(os.readlink(host))
            target = target if target.is_absolute() else path.parent / target
            pending.append((Path(os.path.normpath(target)), want))
            continue
        if want == EXEC:
            interpreter = _shebang(host)
            if interpreter is not None:
                pending.append((interpreter, EXEC))
                continue
            # a binary: a venv's copied python runs the base interpreter's library
            config = host.parent.parent / "pyvenv.cfg"
            if host.parent.name == "bin" and config.is_file():
                base = _venv_home(config)
                if base is not None:
                    pending.append((base, EXEC))
    return chain, problems


def _reach(root: Path, path: Path, identity: Identity, want: int) -> str:
    """Why ``identity`` cannot reach ``path`` with ``want`` ("" when it can): every folder
    on the way needs x, the file itself x (and r for a script)."""
    current = Path("/")
    for part in path.parts[1:]:
        host = root / current.relative_to("/")
        try:
            st = os.stat(host)
        except OSError as exc:
            return f"{current}: {exc.strerror}"
        # a staging root's own folder (a temp dir) is not the target's /
        staged_root = current == Path("/") and root != Path("/")
        if not staged_root and not identity.may(st, EXEC):
            return (
                f"{identity.name} may not enter {current} (mode {stat.filemode(st.st_mode)}, "
                f"owner {st.st_uid}:{st.st_gid})"
            )
        current = current / part
    host = root / path.relative_to("/")
    if host.is_symlink():
        return ""  # the link's target is checked next
    try:
        st = os.stat(host)
    except OSError as exc:
        return f"{path}: {exc.strerror}"
    if stat.S_ISDIR(st.st_mode):
        return f"{path} is a folder, not a program"
    needed = want | (READ if want == EXEC and _shebang(host) is not None else 0)
    if not identity.may(st, needed):
        what = "execute" if want == EXEC else "read"
        return f"{identity.name} may not {what} {path} (mode {stat.filemode(st.st_mode)})"
    return ""


def _shebang(path: Path) -> Path | None:
    try:
        with open(path, "rb") as f:
            first = f.readline(256)
    except OSError:
        return None
    words = first[2:].split() if first.startswith(b"#!") else []
    return Path(words[0].decode(errors="replace")) if words else None


def _venv_home(config: Path) -> Path | None:
    """The base interpreter a venv's python runs (pyvenv.cfg `executable`, else `home`)."""
    values = {}
    for line in config.read_text(errors="replace").splitlines():
        key, sep, value = line.partition("=")
        if sep:
            values[key.strip()] = value.strip()
    if values.get("executable"):
        return Path(values["executable"])
    if values.get("home"):
        return Path(values["home"]) / "python3"
    return None


def may_read_folder(identity: Identity, folder: Path) -> bool:
    """Whether ``identity`` may enter every folder down to ``folder`` and list it."""
    current = Path("/")
    for part in (*folder.parts[1:], None):
        try:
            st = os.stat(current)
        except OSError:
            return False
        if not identity.may(st, EXEC if part is not None else EXEC | READ):
            return False
        if part is not None:
            current = current / part
    return True
