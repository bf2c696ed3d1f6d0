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


def serve(port: int, root: Path) -> None:
    """Serve `root` read-only on 127.0.0.1:`port` (the standard library's http.server; GET and HEAD only), text
    files as UTF-8 so that a report's ε and γ read right in a browser."""
    from functools import partial
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

    class Handler(SimpleHTTPRequestHandler):
        extensions_map = {**SimpleHTTPRequestHandler.extensions_map,
                          ".md": "text/markdown; charset=utf-8", ".csv": "text/csv; charset=utf-8",
                          ".json": "application/json; charset=utf-8", ".txt": "text/plain; charset=utf-8",
                          ".html": "text/html; charset=utf-8"}

    with ThreadingHTTPServer(("127.0.0.1", port), partial(Handler, directory=str(root))) as server:
        server.serve_forever()


if __name__ == "__main__":   # python -m pram_lib.pipeline.links PORT ROOT (started by `pram-release ui`)
    import sys

    serve(int(sys.argv[1]), Path(sys.argv[2]))
