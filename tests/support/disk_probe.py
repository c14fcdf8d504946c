"""What a directory really occupies: a private tmpfs mounted there for one child process tree.

``du`` or a listing misses files that were unlinked while still mapped or open (an evicted
shard that a stream still maps holds its blocks until the map goes). A tmpfs given to the
server alone counts everything: committed files, staged downloads, unlinked-but-held files and
the cache's small bookkeeping files. The mount lives in the child's own mount namespace (made
in ``preexec``: as root directly, otherwise inside a user namespace), so nothing on the host
changes and it goes with the last process of the tree; the parent reads the file system's
usage through ``/proc/<pid>/root``.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from collections.abc import Callable

__all__ = ["private_tmpfs", "private_tmpfs_works", "used_bytes"]

_CLONE_NEWNS = 0x00020000
_CLONE_NEWUSER = 0x10000000
_MS_REC = 0x4000
_MS_PRIVATE = 1 << 18


def private_tmpfs(path: str, size: int) -> Callable[[], None]:
    """A ``preexec_fn`` mounting a tmpfs of ``size`` bytes at ``path`` (which must exist) for
    the child and its descendants only."""

    # resolved here, not in the forked child (no dynamic loading between fork and exec)
    libc = ctypes.CDLL(None, use_errno=True)
    unshare, mount = libc.unshare, libc.mount
    uid, gid = os.getuid(), os.getgid()
    target, options = path.encode(), f"size={size}".encode()
    maps = (("setgroups", "deny"), ("uid_map", f"0 {uid} 1"), ("gid_map", f"0 {gid} 1"))

    def preexec() -> None:
        if unshare(_CLONE_NEWNS) != 0:  # not allowed here: as root of a user namespace
            if unshare(_CLONE_NEWUSER | _CLONE_NEWNS) != 0:
                raise OSError(ctypes.get_errno(), "unshare")
            for name, text in maps:
                with open(f"/proc/self/{name}", "w") as f:
                    f.write(text)
        if mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE, None) != 0:
            raise OSError(ctypes.get_errno(), "mount --make-rprivate /")
        if mount(b"tmpfs", target, b"tmpfs", 0, options) != 0:
            raise OSError(ctypes.get_errno(), f"mount tmpfs {path}")

    return preexec


def private_tmpfs_works(path: str) -> bool:
    """Whether :func:`private_tmpfs` can mount here (namespaces may be off in a container)."""
    try:
        subprocess.run([sys.executable, "-c", "pass"], preexec_fn=private_tmpfs(path, 1 << 20), check=True,
                       timeout=60)
    except (subprocess.SubprocessError, OSError):
        return False
    return True


def used_bytes(pid: int, path: str) -> int:
    """Bytes in use on the file system mounted at ``path`` in ``pid``'s mount namespace."""
    st = os.statvfs(f"/proc/{pid}/root{path}")
    return (st.f_blocks - st.f_bfree) * st.f_frsize
