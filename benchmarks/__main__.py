"""Run every benchmark module (``make bench``); ``python -m benchmarks NAME …`` runs some."""

import importlib
import pkgutil
import sys

import benchmarks


def main(argv: list[str]) -> None:
    names = sorted(m.name for m in pkgutil.iter_modules(benchmarks.__path__) if m.name.startswith("bench_"))
    wanted = [n if n.startswith("bench_") else f"bench_{n}" for n in argv] or names
    unknown = sorted(set(wanted) - set(names))
    if unknown:
        raise SystemExit(f"unknown benchmarks {unknown}; available: {names}")
    for name in wanted:
        print(f"\n=== {name} ===", flush=True)
        importlib.import_module(f"benchmarks.{name}").main()


if __name__ == "__main__":
    main(sys.argv[1:])
