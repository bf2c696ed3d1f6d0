"""`pram-release verify`: is a published release exactly what was published, and is the audit intact?"""

from __future__ import annotations

import json
from pathlib import Path

from pram_lib.audit import build_manifest, sha256_file, verify_chain


def verify_release(folder: str | Path, audit: str | Path | None = None) -> list[tuple[bool, str]]:
    """Checks in order of trust; each is (ok, message naming the first entry or file that does not match).

    1. the audit chain (when given): every entry's own hash and its link to the entry before;
    2. manifest.json against the audit entry that published the folder (so a rewritten manifest is caught);
    3. every file against manifest.json (altered, missing, or added after publication).
    """
    folder = Path(folder)
    out: list[tuple[bool, str]] = []
    mpath = folder / "manifest.json"
    if audit is not None:
        audit = Path(audit)
        out.append(verify_chain(audit))
        if out[-1][0]:
            out.append(_manifest_vs_audit(folder, audit))
    out.append(_files_vs_manifest(folder, mpath))
    return out


def _manifest_vs_audit(folder: Path, audit: Path) -> tuple[bool, str]:
    mpath = folder / "manifest.json"
    hits = [(n, e) for n, e in enumerate(_entries(audit), start=1) if e.get("folder") == folder.name
            and e.get("manifest_sha256")]
    if not hits:
        return False, f"{audit}: no audit entry for release {folder.name}"
    n, entry = hits[-1]
    if not mpath.is_file():
        return False, f"{mpath}: missing"
    if sha256_file(mpath) != entry["manifest_sha256"]:
        return False, f"{mpath}: altered (its SHA-256 differs from audit entry {n})"
    return True, f"{audit}:{n}: the audit entry for {folder.name} matches manifest.json"


def _entries(audit: Path) -> list[dict]:
    return [json.loads(x) for x in audit.read_bytes().splitlines() if x.strip()]


def _files_vs_manifest(folder: Path, mpath: Path) -> tuple[bool, str]:
    if not mpath.is_file():
        return False, f"{mpath}: missing"
    try:
        listed = json.loads(mpath.read_bytes().decode("utf-8"))["files"]
        items = [(rel, info["sha256"]) for rel, info in listed.items()]
    except (ValueError, KeyError, TypeError, AttributeError):
        return False, f"{mpath}: not a valid manifest (altered or truncated)"
    actual = build_manifest(folder)["files"]
    for rel, digest in items:
        if rel not in actual:
            return False, f"{folder / rel}: listed in the manifest but missing"
        if actual[rel]["sha256"] != digest:
            return False, f"{folder / rel}: SHA-256 differs from the manifest (altered)"
    extra = sorted(set(actual) - set(listed))
    if extra:
        return False, f"{folder / extra[0]}: not listed in the manifest (added after publication)"
    return True, f"{folder}: {len(items)} files match the manifest"
