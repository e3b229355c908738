"""`quest generate <run dir>`: sample text from a language run's best checkpoint, with the KV cache.

The language domain's command (its ``commands``). The model is rebuilt from the run's own ``config.yaml``
through the domain registry (so its data, and a character vocabulary, are read again from where the run
read them) and ``checkpoints/best.ckpt`` is loaded into it. A run that does not exist, is not a language
run, or has no best checkpoint is one line on stderr and exit status 2.
"""
from __future__ import annotations

import sys
from pathlib import Path

from common.arguments import CommandParser, device, number, positive_int, seed, whole
from common.errors import ConfigError, DataError

LANGUAGE = "language"
MAX_NEW_TOKENS = 100_000  # a bound for a typo: past the context, each new token re-encodes the whole window


def load_run(run_dir: Path, device: str):
    """The trained ``LanguageTask`` of a run directory, in eval mode on ``device``."""
    from common.checkpoint import restore, run_config

    _, checkpoint, cfg = run_config(run_dir, key="run", domain=LANGUAGE)
    return restore(checkpoint, cfg, device=device)[1]


def main(argv: list[str]) -> int:
    parser = CommandParser("quest generate", __doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path, help="a finished language run: runs/language/<variant>/seed<n>-<hash>")
    parser.add_argument("--prompt", default="\n", help="text the samples continue (default: a newline)")
    parser.add_argument("--max-new-tokens", type=whole(0, MAX_NEW_TOKENS), default=500,
                        help=f"tokens to sample after the prompt (at most {MAX_NEW_TOKENS:,})")
    parser.add_argument("--temperature", type=number(0), default=0.8, help="0 samples greedily")
    parser.add_argument("--top-k", type=whole(0), default=200, help="sample among the k likeliest tokens (0: all)")
    parser.add_argument("--num-samples", type=positive_int, default=1)
    parser.add_argument("--seed", type=seed, default=0)
    parser.add_argument("--device", type=device, default="auto", help="auto (a GPU where there is one), cpu, cuda or cuda:N")
    args = parser.parse_args(argv)
    try:
        return _sample(args)
    except (ConfigError, DataError) as err:
        print(f"quest generate: error: {err}", file=sys.stderr)
        return 2


def _sample(args) -> int:
    import torch

    from domains.language.model import generate

    task = load_run(args.run_dir, args.device)
    prompt = task.tokenizer.encode(args.prompt).long().to(args.device)
    if prompt.numel() == 0:
        raise ConfigError("the prompt is empty: give at least one character")
    generator = torch.Generator(args.device).manual_seed(args.seed)
    tokens = generate(task.net, prompt.expand(args.num_samples, -1), args.max_new_tokens, temperature=args.temperature,
                      top_k=args.top_k or None, generator=generator)
    for i, row in enumerate(tokens.tolist()):
        if i:
            print("\n" + "-" * 40)
        print(task.tokenizer.decode(row))
    return 0
