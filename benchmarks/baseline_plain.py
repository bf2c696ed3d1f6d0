"""The plain-script baseline of issue 15 (python -m benchmarks.baseline_plain SPEC): read the spec's Parquet
source with pyarrow row group by row group, perturb every protected column with the channels the release
would choose, write Parquet. No Prefect, no profile pass, no validation, estimates or report: what a release
costs at the least. Channels are chosen first (not timed) from a profile of the source.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from pram_lib.pipeline import release, stream
from pram_lib.spec import load_spec


def choose(spec_path: str | Path, seed: int = 1):
    """The spec, and the channels a release of it would use (one per variable: the first stratum's)."""
    spec = load_spec(spec_path)
    profile = stream.finish_profile(spec, stream.profile_pass(spec, seed))
    channels = {}
    for a in release.choose_channels(spec, profile, seed):
        channels.setdefault(a.column, a.channel)
    return spec, profile, channels


def plain_release(spec, profile, channels: dict, out: Path, seed: int = 1) -> float:
    """Seconds to read, perturb every protected column and write the table; the timed part of the baseline."""
    rng = np.random.default_rng(seed)
    t = time.perf_counter()
    pf = pq.ParquetFile(spec.resolve(spec.source.path))
    writer = None
    for g in range(pf.metadata.num_row_groups):
        table = pf.read_row_group(g)
        cols = {}
        for name, ch in channels.items():
            x = table.column(name).to_pandas()
            if name in profile.numeric:
                cols[name] = x.to_numpy(dtype=float) + ch.noise.rvs(len(x), rng)
            else:
                codes = pd.Categorical(x, categories=list(profile.variables[name].categories)).codes
                z = ch.perturb_codes(codes.astype(np.int64), rng)
                cols[name] = pa.DictionaryArray.from_arrays(pa.array(z, pa.int32()),
                                                            pa.array(list(ch.output_categories)))
        for name in spec.passthrough:
            cols[name] = table.column(name)
        outt = pa.table(cols)
        if writer is None:
            writer = pq.ParquetWriter(out, outt.schema)
        writer.write_table(outt)
    writer.close()
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("spec")
    args = ap.parse_args()
    spec, profile, channels = choose(args.spec)
    with tempfile.TemporaryDirectory() as d:
        print(f"plain pyarrow + numpy: {plain_release(spec, profile, channels, Path(d) / 'out.parquet'):.2f} s")


if __name__ == "__main__":
    main()
