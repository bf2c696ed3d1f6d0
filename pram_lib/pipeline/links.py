"""Where a browser opens a release folder: over http when `pram-release ui` serves the release folders' root
(a page served over http, as the Prefect UI is, may not link to file://), else its file:// address."""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import quote

RELEASES_URL_ENV = "PRAM_RELEASES_URL"     # the file server's address, as `pram-release ui` prints it
RELEASES_ROOT_ENV = "PRAM_RELEASES_ROOT"   # the folder it serves


def folder_link(folder: Path, environ=os.environ) -> str:
    """The address of `folder`: under the served root, the file server's URL of it; otherwise file://."""
    folder = Path(folder).resolve()
    url, root = environ.get(RELEASES_URL_ENV), environ.get(RELEASES_ROOT_ENV)
    if url and root:
        try:
            rel = folder.relative_to(Path(root).resolve())
        except ValueError:
            return folder.as_uri()
        return url.rstrip("/") + "/" + "".join(quote(part) + "/" for part in rel.parts)
    return folder.as_uri()
