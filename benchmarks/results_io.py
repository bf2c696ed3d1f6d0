"""The common result format of the benchmark sections (read by ``python -m benchmarks.results_md``).

Each section writes ``benchmarks/results/<name>.json``::

    {"order": 2, "section": "Perturbation throughput", "columns": [...], "rows": [[...], ...], "notes": [...]}

Cells are numbers, strings, booleans or null; :func:`markdown_table` renders them.
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any, Callable, Sequence

RESULTS = Path(__file__).resolve().parent / "results"


def compile_project() -> None:
    """The project's bytecode, written before any timed process starts: Python writes it on a user's first run,
    except where PYTHONDONTWRITEBYTECODE is set (as on these machines), where every timed process would otherwise
    compile pram_lib, flows and tasks again (0.3-0.4 s a process). The standard library's compileall; files up to
    date are left alone."""
    import compileall

    root = Path(__file__).resolve().parent.parent
    for package in ("pram_lib", "flows", "tasks"):
        compileall.compile_dir(root / package, quiet=1, workers=0)


def median_time(fn: Callable[[], Any], reps: int = 3) -> float:
    """Median wall time (s) of ``reps`` calls of ``fn``."""
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def sig(x: float, digits: int = 3) -> float:
    """``x`` rounded to ``digits`` significant digits (for the JSON cells)."""
    if x == 0 or not math.isfinite(x):
        return x
    return round(x, digits - 1 - int(math.floor(math.log10(abs(x)))))


def cell_text(v: Any) -> str:
    """One table cell as text: ints with thousands separators, floats to 4 significant digits."""
    if v is None:
        return ""
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        if not math.isfinite(v):
            return str(v)
        return f"{v:,.0f}" if abs(v) >= 1e4 else f"{v:.4g}"
    return str(v).replace("|", "\\|").replace("\n", " ")


def markdown_table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub markdown table; numeric columns are right-aligned."""
    def numeric(j: int) -> bool:
        vals = [r[j] for r in rows if j < len(r) and r[j] is not None and r[j] != ""]
        return bool(vals) and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vals)

    align = ["---:" if numeric(j) else "---" for j in range(len(columns))]
    lines = ["| " + " | ".join(cell_text(c) for c in columns) + " |", "| " + " | ".join(align) + " |"]
    for r in rows:
        cells = [cell_text(v) for v in r] + [""] * (len(columns) - len(r))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def load_average() -> str:
    """The 1/5/15-minute load averages, as text."""
    try:
        return " / ".join(f"{v:.2f}" for v in os.getloadavg())
    except OSError:  # pragma: no cover
        return "n/a"


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def cpu_model() -> str:
    """The first CPU of /proc/cpuinfo: model name, family/model, clock, cache, and whether it is virtual."""
    info: dict[str, str] = {}
    for line in _read("/proc/cpuinfo").splitlines():
        if not line.strip():
            break
        key, _, value = line.partition(":")
        info[key.strip()] = value.strip()
    if "model name" not in info:
        return platform.processor() or platform.machine()
    parts = [info["model name"]]
    if "cpu family" in info and "model" in info:
        parts.append(f"family {info['cpu family']} model {info['model']}")
    if "cpu MHz" in info:
        parts.append(f"{float(info['cpu MHz']):.0f} MHz")
    if "cache size" in info:
        parts.append(f"cache {info['cache size']}")
    if "hypervisor" in info.get("flags", "").split():
        parts.append("virtual machine")
    return ", ".join(parts)


def fresh_memory_cost(huge_pages: bool = True) -> str:
    """Seconds a new process takes to fill 800 MB of memory it never touched (np.ones(10**8)), as text: as numpy
    allocates it (asking the kernel for transparent huge pages, madvise), or with NUMPY_MADVISE_HUGEPAGE=0 (4 KiB
    pages). About 0.1 s on a healthy machine. The AMD EPYC VMs of 2026-12-02 (THP and its defrag on madvise, free
    page reporting to the host) took 4-6 s with huge pages and 0.3-0.4 s without: an array's first touch there is
    dear, which inflates figures that allocate."""
    import subprocess
    import sys

    code = "import time, numpy as np; t = time.perf_counter(); np.ones(10**8); print(time.perf_counter() - t)"
    env = {**os.environ, "NUMPY_MADVISE_HUGEPAGE": "1" if huge_pages else "0"}
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True,
                             env=env)
        return f"{float(out.stdout):.2f} s"
    except (OSError, ValueError, subprocess.SubprocessError):  # pragma: no cover
        return "n/a"


def reclaim_note() -> str:
    """What the kernel's DAMON schemes do to memory, if any run (/sys/kernel/mm/damon/admin): a scheme that pages
    out cold page cache hands free memory back to a VM's host, whose next first touch is then dear."""
    root = Path("/sys/kernel/mm/damon/admin/kdamonds")
    actions = sorted({p.read_text().strip() for p in root.glob("*/contexts/*/schemes/*/action")
                      if (p.parents[4] / "state").is_file() and (p.parents[4] / "state").read_text().strip() == "on"})
    return f"; DAMON schemes running: {', '.join(actions)}" if actions else ""


def measured_note() -> str:
    """A note saying when and on which CPU the section was measured, and how loaded the machine was."""
    return (f"Measured {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC on {cpu_model()}; load average "
            f"(1/5/15 min) at the end of the run {load_average()} on {os.cpu_count()} logical CPUs; a new process "
            f"filled 800 MB of fresh memory in {fresh_memory_cost()} as numpy allocates it (transparent huge pages), "
            f"{fresh_memory_cost(huge_pages=False)} in 4 KiB pages (healthy: about 0.1 s){reclaim_note()}.")


def write_section(name: str, order: int, section: str, columns: Sequence[str], rows: Sequence[Sequence[Any]],
                  notes: Sequence[str]) -> Path:
    """Write ``results/<name>.json`` and print the section as a markdown table with its notes."""
    doc = {"order": int(order), "section": section, "columns": list(columns),
           "rows": [list(r) for r in rows], "notes": list(notes)}
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
    print(f"\n## {order}. {section}\n")
    print(markdown_table(columns, rows))
    print()
    for note in notes:
        print(f"- {note}")
    print(f"\nwritten to {path}", flush=True)
    return path
