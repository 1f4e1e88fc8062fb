"""Run every benchmark module (``make bench``); ``python -m benchmarks NAME …`` runs some."""

import datetime
import importlib
import pkgutil
import platform
import sys

import torch

import benchmarks
from wsutils.run.device import describe_device


def main(argv: list[str]) -> None:
    names = sorted(
        m.name for m in pkgutil.iter_modules(benchmarks.__path__) if m.name.startswith("bench_")
    )
    wanted = [n if n.startswith("bench_") else f"bench_{n}" for n in argv] or names
    unknown = sorted(set(wanted) - set(names))
    if unknown:
        raise SystemExit(f"unknown benchmarks {unknown}; available: {names}")
    # The device line goes with every table, so GPU and CPU figures can stand side by side.
    print(
        f"benchmarks on {describe_device()}, torch {torch.__version__}, "
        f"{platform.python_implementation()} {platform.python_version()}, "
        f"{datetime.date.today().isoformat()}",
        flush=True,
    )
    for name in wanted:
        print(f"\n=== {name} ===", flush=True)
        importlib.import_module(f"benchmarks.{name}").main()


if __name__ == "__main__":
    main(sys.argv[1:])
