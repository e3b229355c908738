"""`quest` command: train | sweep | aggregate | bench | list | robustness."""
from __future__ import annotations

import argparse
import importlib
import sys

from omegaconf import OmegaConf


SUBCOMMANDS = {"sweep": "runners.sweep", "aggregate": "runners.aggregate", "bench": "runners.bench",
               "robustness": "runners.robustness"}


def _train(args) -> int:
    from runners.config import compose
    from runners.train import run

    cfg = compose(args.overrides)
    if args.print_config:
        print(OmegaConf.to_yaml(cfg), end="")
        return 0
    record = run(cfg)
    print(f"{record['status']}: {record['domain']}/{record['variant']} seed {record['seed']} "
          + " ".join(f"{k}={v:.4g}" for k, v in sorted(record["metrics"].items()))
          + (f" ({record['error']})" if record["error"] else "")
          + (f" diverged at step {record['divergence']['step']}" if record["divergence"] else ""))
    return 0


def _list(args) -> int:
    from common.attention import VARIANTS
    from common.registry import get_domain
    from runners.train import discover  # noqa: F401  (registers the project's domains package)
    from common.registry import domain_names

    print("domains:")
    for name in domain_names():
        d = get_domain(name)
        print(f"  {name:14s} metric {d.metric} ({d.mode})  datasets: {', '.join(d.datasets)}")
    print("variants:", ", ".join(VARIANTS))
    return 0


def main(argv: list[str] | None = None) -> int:
    from common.data import DataError
    from common.records import RecordError
    from runners.config import ConfigError

    parser = argparse.ArgumentParser(prog="quest", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("train", help="one run: quest train domain=<name> attention=<variant> [key=value ...]")
    p.add_argument("overrides", nargs="*")
    p.add_argument("--print-config", action="store_true", help="show the composed config and exit")
    p.set_defaults(func=_train)
    p = sub.add_parser("list", help="domains, datasets and attention variants")
    p.set_defaults(func=_list)
    for name, module in SUBCOMMANDS.items():
        sub.add_parser(name, help=f"see `quest {name} --help`")

    argv = sys.argv[1:] if argv is None else argv
    try:
        if argv and argv[0] in SUBCOMMANDS:  # these parse their own arguments
            return importlib.import_module(SUBCOMMANDS[argv[0]]).main(argv[1:])
        args = parser.parse_args(argv)
        return args.func(args)
    except (ConfigError, DataError, RecordError, FileNotFoundError) as err:
        print(f"quest: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
