"""Issue 29: the run summary's folder link opens in a browser. With the release folders served by
`pram-release ui` (PRAM_RELEASES_URL / PRAM_RELEASES_ROOT), the summary and the folder link artifact point to the
file server's address of the published folder, and that address serves the folder's files."""

from __future__ import annotations

import socket
import urllib.request
from pathlib import Path

import pytest

import synth
from pram_lib.pipeline.links import RELEASES_ROOT_ENV, RELEASES_URL_ENV

pytestmark = [pytest.mark.prefect, pytest.mark.slow]


def test_the_summary_links_the_published_folder_over_http(prefect_server, tmp_path, monkeypatch):
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    from flows.cli import start_file_server, stop_file_server
    from flows.release import run_release

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    spec = synth.write_spec(tmp_path, release="linked-folder", engine={"mode": "memory"})
    root = tmp_path / "releases"
    _, url = start_file_server(tmp_path / "home", root, port)
    try:
        monkeypatch.setenv(RELEASES_URL_ENV, url)
        monkeypatch.setenv(RELEASES_ROOT_ENV, str(root))
        folder = Path(run_release(str(spec), seed=5))
        assert folder.parent == root.resolve()
        expected = f"http://127.0.0.1:{port}/{folder.name}/"
        with get_client(sync_client=True) as client:
            (fr,) = [r for r in client.read_flow_runs() if r.name.startswith("linked-folder-")]
            arts = client.read_artifacts(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[fr.id])))
        (summary,) = [a for a in arts if (a.key or "").endswith("-summary")]
        (link,) = [a for a in arts if (a.key or "").endswith("-folder")]
        assert f"]({expected})" in summary.data
        assert link.data == expected or f"({expected})" in link.data
        with urllib.request.urlopen(expected + "report.md", timeout=10) as r:
            assert r.read() == (folder / "report.md").read_bytes()
    finally:
        stop_file_server(tmp_path / "home")
