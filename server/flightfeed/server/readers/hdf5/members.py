"""The members of an HDF5 group as the served file reaches them: through hard, soft and external
links alike.

A dataset reached through a link is addressed by its *link path* in the served file (``/x`` for
``x = ExternalLink("other.h5", "/y")``), never by the name it has in the target (``/y``, which in
the served file may be another dataset). A link whose target cannot be opened (a missing file or
object) is *dangling*: reported with the file, the link and its target, never silently dropped.
"""

from __future__ import annotations

from dataclasses import dataclass

import h5py

__all__ = ["Member", "group_members", "link_path", "dangling_error", "is_pytables_index"]


@dataclass(frozen=True)
class Member:
    key: str  # the name in its group
    path: str  # the link path in the served file
    obj: h5py.Dataset | h5py.Group | None  # None: dangling link (see ``missing``)
    link: str  # "" for a hard link, else e.g. "external link to other.h5:/y"
    missing: str = ""  # why a dangling link's target cannot be opened

    @property
    def dataset(self) -> h5py.Dataset | None:
        return self.obj if isinstance(self.obj, h5py.Dataset) else None


def link_path(group_path: str, key: str) -> str:
    return f"{group_path.rstrip('/')}/{key}"


def _describe(link: object) -> str:
    if isinstance(link, h5py.ExternalLink):
        return f"external link to {link.filename}:{link.path}"
    if isinstance(link, h5py.SoftLink):
        return f"soft link to {link.path}"
    return ""


def group_members(group: h5py.Group, group_path: str) -> list[Member]:
    """Every member of ``group`` (reached as ``group_path`` in the served file), links resolved."""
    out = []
    for key in group:
        path = link_path(group_path, key)
        try:
            link = group.get(key, getlink=True)
        except (KeyError, OSError, ValueError) as exc:  # pragma: no cover - a corrupt link message
            out.append(Member(key, path, None, "unreadable link", str(exc)))
            continue
        text = _describe(link)
        try:
            obj = group[key]
        except (KeyError, OSError, ValueError) as exc:
            out.append(Member(key, path, None, text or "link", _reason(exc)))
            continue
        if isinstance(obj, (h5py.Dataset, h5py.Group)):
            out.append(Member(key, path, obj, text))
    return out


def _reason(exc: BaseException) -> str:
    text = str(exc).strip("'\"")
    if "can't open file" in text or "unable to open file" in text.lower():
        return "its target file cannot be opened (missing, or not where the link says)"
    if "component not found" in text or "doesn't exist" in text:
        return "its target object does not exist"
    return text


def dangling_error(uri: str, members: list[Member]) -> str | None:
    """The message for ``members``' dangling links, or None when there are none."""
    bad = [m for m in members if m.obj is None]
    if not bad:
        return None
    shown = "; ".join(f"{m.path} ({m.link}: {m.missing})" for m in bad)
    return (
        f"HDF5 shard {uri}: dangling link(s) {shown}. Such a link would be a column with no data: "
        "make the target available (external link targets are looked for relative to the linking file's "
        "directory and the current directory), remove the link, or serve another group with --hdf5-group"
    )


def is_pytables_index(group: h5py.Group) -> bool:
    """PyTables' table indexes (``_i_table`` groups): bookkeeping, never data to serve."""
    cls = group.attrs.get("CLASS")
    return isinstance(cls, bytes) and cls in (b"TINDEX", b"INDEX")
