"""What an editor shows for a spec: run the YAML language server (Red Hat's yaml-language-server, the one VS Code,
Neovim and Emacs use) over stdio on SPEC and print its diagnostics. The spec's first line,
`# yaml-language-server: $schema=...`, points the server at pram_lib/schemas/spec.schema.json.

    npm install --prefix /tmp/yls yaml-language-server
    python scripts/yaml_ls_check.py specs/adult.yaml --server /tmp/yls/node_modules/.bin/yaml-language-server

Exit 0 with no diagnostics, 1 with some (each printed as file:line:column: message).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path


def _send(proc, msg: dict) -> None:
    body = json.dumps(msg).encode()
    proc.stdin.write(f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    proc.stdin.flush()


def _read(proc) -> dict:
    length = 0
    while True:
        line = proc.stdout.readline()
        if not line:
            raise EOFError("the language server ended")
        if line in (b"\r\n", b"\n"):
            break
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    return json.loads(proc.stdout.read(length))


def diagnostics(spec: Path, server: str, timeout: float = 60) -> list[dict]:
    """The diagnostics the language server publishes for `spec` (the LSP's textDocument/publishDiagnostics)."""
    uri = spec.resolve().as_uri()
    settings = {"yaml": {"validate": True, "hover": True, "completion": True, "schemaStore": {"enable": False}}}
    proc = subprocess.Popen([server, "--stdio"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL)
    try:
        _send(proc, {"jsonrpc": "2.0", "id": 1, "method": "initialize",
                     "params": {"processId": None, "rootUri": spec.resolve().parent.as_uri(), "capabilities": {
                         "workspace": {"configuration": True}, "textDocument": {"publishDiagnostics": {}}}}})
        deadline = time.time() + timeout
        opened = False
        while time.time() < deadline:
            msg = _read(proc)
            if msg.get("id") == 1 and not opened:
                _send(proc, {"jsonrpc": "2.0", "method": "initialized", "params": {}})
                _send(proc, {"jsonrpc": "2.0", "method": "workspace/didChangeConfiguration",
                             "params": {"settings": settings}})
                _send(proc, {"jsonrpc": "2.0", "method": "textDocument/didOpen", "params": {"textDocument": {
                    "uri": uri, "languageId": "yaml", "version": 1, "text": spec.read_text()}}})
                opened = True
            elif msg.get("method") == "workspace/configuration":
                items = msg["params"]["items"]
                _send(proc, {"jsonrpc": "2.0", "id": msg["id"],
                             "result": [settings.get(i.get("section", ""), settings["yaml"]) if i.get("section")
                                        else settings for i in items]})
            elif "id" in msg and "method" in msg:    # any other request of the server's: answer empty
                _send(proc, {"jsonrpc": "2.0", "id": msg["id"], "result": None})
            elif msg.get("method") == "textDocument/publishDiagnostics" and msg["params"]["uri"] == uri:
                return msg["params"]["diagnostics"]
        raise TimeoutError(f"no diagnostics for {spec} in {timeout:.0f} s")
    finally:
        proc.kill()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("spec", type=Path)
    ap.add_argument("--server", default="yaml-language-server")
    args = ap.parse_args()
    found = diagnostics(args.spec, args.server)
    for d in found:
        start = d["range"]["start"]
        print(f"{args.spec}:{start['line'] + 1}:{start['character'] + 1}: {d['message']}")
    print(f"{len(found)} diagnostic(s)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
