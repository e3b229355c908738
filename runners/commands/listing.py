"""`quest list`: the domains with their primary metric, datasets and commands, the attention variants and the
ablations, read from the plugin registry without importing any domain's data or model code."""
from __future__ import annotations

import runners.config  # noqa: F401  (makes the project's domains package known)
from common.arguments import CommandParser
from common.attention import ABLATIONS, VARIANTS
from common.registry import domain_names, get_domain


def main(argv: list[str]) -> int:
    CommandParser("quest list", "Domains, datasets and attention variants.").parse_args(argv)
    print("domains:")
    for name in domain_names():
        try:
            d = get_domain(name)
        except Exception as err:  # one broken plugin must not hide the others
            print(f"  {name:14s} (cannot load: {type(err).__name__}: {err})")
            continue
        commands = f"  commands: {', '.join(f'quest {c}' for c in d.commands)}" if d.commands else ""
        print(f"  {name:14s} metric {d.metric} ({d.mode})  datasets: {', '.join(d.datasets)}{commands}")
    print("variants:", ", ".join(VARIANTS))
    print("ablations:", ", ".join(ABLATIONS))
    return 0
