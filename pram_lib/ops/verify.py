"""`pram-release verify`: is a published release exactly what was published, and is the audit intact?"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from pram_lib.ops.audit import sha256_file, verify_chain, verify_head

AUDIT_LOG = "audit.jsonl"


def verify_release(folder: str | Path, audit: str | Path | None = None,
                   head: str | Path | None = None) -> list[tuple[bool | None, str]]:
    """Checks in order of trust; each is (ok, message naming the first entry or file that does not match),
    ok being True (OK), False (FAIL) or None (WARN: nothing found wrong, but something could not be vouched).

    1. the audit chain (when given): every entry's own hash and its link to the entry before;
    2. the chain's end against its head file (or `head`, a copy kept elsewhere): entries removed at the end;
    3. manifest.json against the one audit entry that published the folder (so a rewritten manifest is
       caught, and so is a second entry vouching for the folder again);
    4. the folder holds regular files only (no symlink, device, fifo or socket anywhere in it), exactly the
       files manifest.json lists, each with its hash (altered, missing, or added after publication).
    """
    folder = Path(folder)
    out: list[tuple[bool | None, str]] = []
    mpath = folder / "manifest.json"
    if audit is not None:
        audit = Path(audit)
        out.append(verify_chain(audit))
        if out[-1][0]:
            out.append(verify_head(audit, head))
            out.append(_manifest_vs_audit(folder, audit))
    out.append(_files_vs_manifest(folder, mpath))
    return out


def audit_for_spec(spec_path: str | Path) -> Path:
    """The audit log of the spec's private store (raises SpecError for a spec that does not load)."""
    from pram_lib.spec import load_spec

    spec = load_spec(spec_path)
    return spec.resolve(spec.private_store) / AUDIT_LOG


def find_audit(folder: str | Path, cwd: str | Path | None = None) -> tuple[Path | None, str]:
    """Look for the audit log that vouches for a release folder: a spec whose resolved `output` is the
    folder's parent, among `specs/*.yaml` and `*.yaml` in `cwd` and in the output folder's parent and its
    sibling folders. Returns (log, how it was found) or (None, where it looked)."""
    from pram_lib.spec import SpecError, load_spec

    folder = Path(folder).resolve()
    output = folder.parent
    cwd = Path.cwd() if cwd is None else Path(cwd)
    dirs = [cwd / "specs", cwd, output.parent]
    try:
        dirs += sorted(d for d in output.parent.iterdir() if d.is_dir() and d != output)
    except OSError:
        pass
    seen, found = set(), []
    for d in dirs:
        for spec_path in sorted(d.glob("*.yaml")) + sorted(d.glob("*.yml")):
            key = spec_path.resolve()
            if key in seen:
                continue
            seen.add(key)
            try:
                spec = load_spec(spec_path)
            except (SpecError, OSError, ValueError):
                continue
            if spec.resolve(spec.output) == output:
                found.append((spec.resolve(spec.private_store) / AUDIT_LOG, spec_path))
    looked = ", ".join(sorted({str(d) for d in dirs}))
    if not found:
        return None, f"no spec with output {output} in {looked}"
    logs = [(log, sp) for log, sp in found if log.is_file()]
    if not logs:
        return None, (f"the spec(s) {', '.join(str(sp) for _, sp in found)} publish to {output}, but their "
                      f"audit log {found[0][0]} does not exist")
    naming = [(log, sp) for log, sp in logs if folder.name.encode() in log.read_bytes()]
    log, sp = (naming or logs)[0]
    return log, f"found via spec {sp}"


def _manifest_vs_audit(folder: Path, audit: Path) -> tuple[bool, str]:
    mpath = folder / "manifest.json"
    hits = [(n, e) for n, e in enumerate(_entries(audit), start=1) if e.get("folder") == folder.name
            and e.get("manifest_sha256")]
    if not hits:
        return False, f"{audit}: no audit entry for release {folder.name}"
    if len(hits) > 1:
        lines = ", ".join(str(n) for n, _ in hits)
        return False, (f"{audit}: entries {lines} each vouch for release {folder.name}: a release is published "
                       f"once, so every entry after the first was added later (a second manifest for an existing "
                       f"folder)")
    n, entry = hits[0]
    if not mpath.is_file():
        return False, f"{mpath}: missing"
    if sha256_file(mpath) != entry["manifest_sha256"]:
        return False, f"{mpath}: altered (its SHA-256 differs from audit entry {n})"
    how = " (written on recovery by a later run: the release was published)" if entry.get("recovered") else ""
    return True, (f"{audit}:{n}: the audit entry for {folder.name} ({entry.get('event')}{how}) matches "
                  f"manifest.json")


def _entries(audit: Path) -> list[dict]:
    return [json.loads(x) for x in audit.read_bytes().splitlines() if x.strip()]


def _release_files(folder: Path) -> tuple[dict[str, Path], set[str], str | None]:
    """The regular files under `folder` by relative name (os.walk, links not followed), its sub-folders; or
    the first entry that is not a regular file or a folder (a symlink, device, fifo or socket), described."""
    try:
        if stat.S_ISLNK(os.lstat(folder).st_mode):
            return {}, set(), (f"{folder}: the release folder is a symlink (to {os.readlink(folder)}): a release "
                               "is a real folder")
    except OSError as exc:
        return {}, set(), f"{folder}: cannot read the release folder ({exc.strerror})"
    files: dict[str, Path] = {}
    subfolders: set[str] = set()
    errors: list[OSError] = []
    for root, dirs, names in os.walk(folder, onerror=errors.append):
        for name in sorted(dirs) + sorted(names):
            path = Path(root) / name
            mode = os.lstat(path).st_mode
            if stat.S_ISLNK(mode):
                return files, subfolders, (f"{path}: a symlink (to {os.readlink(path)}) inside the release: a "
                                           "release holds regular files only, and a link may lead anywhere (the "
                                           "private store included)")
            if stat.S_ISREG(mode):
                files[path.relative_to(folder).as_posix()] = path
            elif stat.S_ISDIR(mode):
                subfolders.add(path.relative_to(folder).as_posix())
            else:
                return files, subfolders, f"{path}: not a regular file (a device, fifo or socket) inside the release"
    if errors:
        return files, subfolders, f"{errors[0].filename}: cannot be read ({errors[0].strerror})"
    return files, subfolders, None


def _files_vs_manifest(folder: Path, mpath: Path) -> tuple[bool, str]:
    actual, subfolders, problem = _release_files(folder)
    if problem is not None:
        return False, problem
    if "manifest.json" not in actual:
        return False, f"{mpath}: missing"
    try:
        listed = json.loads(mpath.read_bytes().decode("utf-8"))["files"]
        items = [(rel, info["sha256"]) for rel, info in listed.items()]
    except (ValueError, KeyError, TypeError, AttributeError):
        return False, f"{mpath}: not a valid manifest (altered or truncated)"
    for rel, digest in items:
        if rel not in actual:
            return False, f"{folder / rel}: listed in the manifest but missing"
        if sha256_file(actual[rel]) != digest:
            return False, f"{folder / rel}: SHA-256 differs from the manifest (altered)"
    extra = sorted(set(actual) - set(listed) - {"manifest.json"})
    if extra:
        return False, f"{folder / extra[0]}: not listed in the manifest (added after publication)"
    holding = {parent.as_posix() for rel in listed for parent in Path(rel).parents if parent != Path(".")}
    empty = sorted(subfolders - holding)
    if empty:
        return False, f"{folder / empty[0]}: a folder that holds no file of the manifest (added after publication)"
    return True, f"{folder}: {len(items)} files match the manifest"
