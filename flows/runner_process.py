"""`python -m flows.runner_process SOCKET`: the warm runner's process (flows/runner.py), serving the CLI."""

import sys
from pathlib import Path

from flows.cli import main
from flows.runner import serve

if __name__ == "__main__":
    serve(Path(sys.argv[1]), main)
