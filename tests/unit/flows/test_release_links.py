"""Issue 29: the run summary's folder link opens in a browser. A page served over http (the Prefect UI) may not
link to file://, so `pram-release ui` serves the release folders' root read-only on 127.0.0.1 and the link points
there; elsewhere it stays the folder's file:// address."""

from __future__ import annotations

import urllib.error
import urllib.request

from flows.cli import start_file_server, stop_file_server
from pram_lib.pipeline.links import RELEASES_ROOT_ENV, RELEASES_URL_ENV, folder_link


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_folder_under_the_served_root_links_over_http(tmp_path):
    env = {RELEASES_URL_ENV: "http://127.0.0.1:4201/", RELEASES_ROOT_ENV: str(tmp_path)}
    assert folder_link(tmp_path / "adult 1994-2026", env) == "http://127.0.0.1:4201/adult%201994-2026/"
    assert folder_link(tmp_path / "a" / "b", env) == "http://127.0.0.1:4201/a/b/"


def test_elsewhere_or_unserved_the_link_is_the_file_address(tmp_path):
    served = {RELEASES_URL_ENV: "http://127.0.0.1:4201/", RELEASES_ROOT_ENV: str(tmp_path / "served")}
    assert folder_link(tmp_path / "other" / "r1", served) == (tmp_path / "other" / "r1").as_uri()
    assert folder_link(tmp_path / "r1", {}) == (tmp_path / "r1").as_uri()


def test_the_file_server_serves_a_release_folder_and_stops(tmp_path):
    root, home = tmp_path / "releases", tmp_path / "home"
    (root / "r1").mkdir(parents=True)
    (root / "r1" / "report.md").write_text("# Release r1: ε 1.0\n", encoding="utf-8")
    port = _free_port()
    pid, url = start_file_server(home, root, port)
    try:
        assert pid is not None and url == f"http://127.0.0.1:{port}/"
        link = folder_link(root / "r1", {RELEASES_URL_ENV: url, RELEASES_ROOT_ENV: str(root)})
        with urllib.request.urlopen(link, timeout=5) as r:
            assert "report.md" in r.read().decode()      # the folder's listing
        with urllib.request.urlopen(link + "report.md", timeout=5) as r:   # UTF-8, said so: ε reads right
            assert r.read().decode() == "# Release r1: ε 1.0\n"
            assert r.headers["Content-Type"] == "text/markdown; charset=utf-8"
        request = urllib.request.Request(link + "report.md", data=b"x", method="POST")
        try:
            urllib.request.urlopen(request, timeout=5)
            raise AssertionError("the file server accepted a POST")
        except urllib.error.HTTPError as exc:                          # read-only: GET and HEAD only
            assert exc.code == 501
        assert start_file_server(home, root, port) == (None, url)   # already up: reused
    finally:
        said = stop_file_server(home)
    assert said == f"release file server stopped (pid {pid})"
    assert not (home / "files.pid").exists()
