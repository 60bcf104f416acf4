"""Command line: ``python -m bench run CONFIG | report DIR | list``."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from . import runner
from .registry import ADAPTERS


def _threads(text: str) -> list[int]:
    """Parse "1,2" into [1, 2]; "all" stands for every core."""
    return [len(os.sched_getaffinity(0)) if t.strip() == "all" else int(t) for t in text.split(",")]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run a config, write results.json, results.md and PNGs")
    r.add_argument("config", help="a YAML file or the name of one in bench/configs")
    r.add_argument("--out", help="output directory (default bench/results/<config name>)")
    r.add_argument("--threads", type=_threads, default=None,
                   help='thread counts for batch QPS, e.g. "1,2" (default: 1 and all cores)')
    r.add_argument("--rounds", type=int, default=None, help="timing rounds (overrides config)")
    r.add_argument("--no-progress", action="store_true", help="no progress bars")
    r.add_argument("--ann-results", metavar="DIR",
                   help="also write ann-benchmarks result files (their plot.py reads them)")
    rp = sub.add_parser("report", help="derive results.md and PNGs from a results directory")
    rp.add_argument("dir")
    sub.add_parser("list", help="list configs and adapters")
    args = p.parse_args(argv)

    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if args.cmd == "run":
        out = runner.run(
            args.config, args.out, args.threads, args.rounds, progress=not args.no_progress,
            ann_results=args.ann_results,
        )
        md = out / "results.md"
        print(md.read_text())
        print(f"results: {out / runner.RESULTS_FILE}\ntable: {md}")
    elif args.cmd == "report":
        md, pngs = runner.report(args.dir)
        print(md.read_text())
        print("\n".join(f"plot: {p}" for p in pngs))
    else:
        print("configs (bench/configs):")
        for name in runner.list_configs():
            print(f"  {name}")
        print("adapters:")
        for name, cls in sorted(ADAPTERS.items()):
            doc = " ".join((cls.__doc__ or "").split()).split(". ")[0].rstrip(".")
            print(f"  {name:20s} {doc[:100]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
