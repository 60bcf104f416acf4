"""The `simsearch` command: demo, benchmarks, dataset fetching, and the servers."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path


def _demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    run_demo(args.out)
    return 0


def _bench(args: argparse.Namespace) -> int:
    # bench/ lives beside the package in the repository, not inside it.
    sys.path.insert(0, str(Path.cwd()))
    try:
        from bench.__main__ import main as bench_main
    except ImportError:
        print(
            "simsearch bench runs from a checkout of the repository (it needs bench/); "
            "cd into it and run `simsearch bench ...` or `python -m bench ...`",
            file=sys.stderr,
        )
        return 2
    return bench_main(args.bench_args) or 0


def _data(args: argparse.Namespace) -> int:
    from . import datasets
    from .errors import DatasetUnavailableError

    if args.action == "import":
        from .errors import SimsearchError

        try:
            for path in args.names:
                name, metric = datasets.import_hdf5(path, args.name)
                print(f"{path}: imported as {name!r} (metric {metric}); "
                      f"load with simsearch.datasets.load({name!r})")
        except (SimsearchError, FileNotFoundError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        return 0
    if args.action == "list":
        for name in (*datasets.DENSE, *datasets.STRINGS, *datasets.imported()):
            cached = (
                "cached"
                if datasets.is_cached(name)
                else ("generated" if name == "synthetic-longtail" else "not fetched")
            )
            print(f"{name:20s} {cached}")
        print(f"cache: {datasets.cache_dir()}")
        return 0
    try:
        for name in args.names:
            print(f"{name}: {datasets.fetch(name)}")
    except DatasetUnavailableError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


def _backup(args: argparse.Namespace) -> int:
    from . import connect
    from .errors import SimsearchError
    from .service.backup import backup, restore

    token = Path(args.token_file).read_text().strip() if args.token_file else None
    try:
        with connect(args.address, token=token, tls_ca=args.tls_ca, timeout=3600) as client:
            if args.command == "backup":
                done = backup(client, args.file, args.collection or None)
                print(f"backed up {len(done)} collection(s) to {args.file}: {', '.join(done)}")
            else:
                done = restore(client, args.file, args.collection or None, args.rename,
                               args.replace)
                print(f"restored {len(done)} collection(s) from {args.file}: {', '.join(done)}")
    except (SimsearchError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="simsearch", description=__doc__)
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = p.add_subparsers(dest="command", required=True)

    d = sub.add_parser("demo", help="MIPS indexes beside hnswlib/faiss on real data, the "
                       "automatic choice, CNN-ED on words; recall/QPS tables and plots")
    d.add_argument("--out", default="demo-results", help="directory for the table and plots")
    d.set_defaults(func=_demo)

    b = sub.add_parser(
        "bench", help="benchmark runner (from a repository checkout)", add_help=False
    )
    b.add_argument("bench_args", nargs=argparse.REMAINDER)
    b.set_defaults(func=_bench)

    da = sub.add_parser("data", help="fetch and list datasets")
    dsub = da.add_subparsers(dest="action", required=True)
    f = dsub.add_parser("fetch", help="fetch datasets into the cache")
    f.add_argument(
        "names", nargs="+", metavar="NAME",
        help="glove-50, fi-300, wordllama-256, ml100k-svd, words or proteins",
    )
    dsub.add_parser("list", help="list datasets and whether they are cached")
    im = dsub.add_parser("import", help="import ann-benchmarks HDF5 files (train/test/neighbors)")
    im.add_argument("names", nargs="+", metavar="FILE.hdf5")
    im.add_argument("--name", help="dataset name (default: the file's name without .hdf5)")
    da.set_defaults(func=_data)

    try:  # `simsearch serve` and `simsearch cluster` need the service extra (grpcio)
        from .service.server import add_serve_parser
    except ImportError:
        pass
    else:
        from .pyramid.cli import add_cluster_parser

        add_serve_parser(sub)
        add_cluster_parser(sub)
        for name, what in (("backup", "copy collections from a running server into one file"),
                           ("restore", "import the collections of a backup file")):
            bk = sub.add_parser(name, help=what)
            bk.add_argument("address", help="HOST:PORT of a node or cluster coordinator")
            bk.add_argument("file", help="the backup file")
            bk.add_argument("--collection", action="append", metavar="NAME",
                            help="only this collection (repeatable; default all)")
            bk.add_argument("--token-file", help="a file holding a bearer token")
            bk.add_argument("--tls-ca", help="PEM CA of the server's certificate")
            if name == "restore":
                bk.add_argument("--rename", metavar="NAME",
                                help="restore the one --collection under this name")
                bk.add_argument("--replace", action="store_true",
                                help="overwrite collections that exist")
            bk.set_defaults(func=_backup)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("faiss").setLevel(logging.WARNING)  # its loader logs every import
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
