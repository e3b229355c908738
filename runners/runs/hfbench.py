"""A transformers model's training step with QUEST beside the library's own SDPA (``quest bench --hf``,
``docs/speed/models.md``): the same model built from one seed and config under each of ``IMPLEMENTATIONS``, each
trained by forward, loss, backward and ``torch.optim.AdamW`` on one fixed batch, interleaved in rounds in one process
(``common.timing.interleaved_seconds``), the median round counting. ``standard`` makes the library's SDPA call
through this project's backend: its ratio to ``sdpa`` is the backend's own cost and the noise of the run.

``SIZES`` holds the shapes measured: ``tiny`` is the CPU check (4 layers, grouped-query attention in Llama), ``gpu``
the shape the GPU checks time (width 1024, 8 layers, 16 heads, 8 sequences of 2048 tokens)."""
from __future__ import annotations

from contextlib import nullcontext

import torch

from common.optional import require
from common.timing import interleaved_seconds

IMPLEMENTATIONS = ("sdpa", "standard", "quest")  # the library's attention, the control, the variant compared
VOCAB = 256
# Per size: (each architecture's config in its own names, batch, tokens per sequence).
SIZES = {
    "tiny": ({"llama": {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4,
                        "num_key_value_heads": 2, "max_position_embeddings": 128},
              "gpt2": {"n_embd": 128, "n_layer": 4, "n_head": 4, "n_positions": 128}}, 16, 128),
    "gpu": ({"llama": {"hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 8, "num_attention_heads": 16,
                       "num_key_value_heads": 4, "max_position_embeddings": 2048},
             "gpt2": {"n_embd": 1024, "n_layer": 8, "n_head": 16, "n_positions": 2048}}, 8, 2048),
}
ARCHS = tuple(SIZES["tiny"][0])


def build(arch: str, implementation: str, config: dict, device: str, seed: int = 0):
    """The causal LM of ``arch`` from ``config`` (no download), its attention ``implementation``, in training mode."""
    transformers = require("transformers", extra="hf")
    require("common.hf", extra="hf")  # registers the variants as attention backends
    torch.manual_seed(seed)
    settings = transformers.AutoConfig.for_model(arch, vocab_size=VOCAB, bos_token_id=None, eos_token_id=None, **config)
    model = transformers.AutoModelForCausalLM.from_config(settings, attn_implementation=implementation)
    return model.to(device).train()


def training_step(model, tokens: torch.Tensor, autocast: torch.dtype | None):
    """One step, as a job: forward and loss (under ``autocast`` if given), backward, AdamW, gradients dropped."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step() -> None:
        with torch.autocast(tokens.device.type, dtype=autocast) if autocast else nullcontext():
            loss = model(tokens, labels=tokens).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def measure(arch: str, size: str = "tiny", *, device: str = "cpu", autocast: torch.dtype | None = None,
            steps: int = 2, rounds: int = 7) -> dict:
    """Median ms per training step of ``arch`` at ``size`` under each of ``IMPLEMENTATIONS``, and each one's over SDPA's."""
    configs, batch, length = SIZES[size]
    tokens = torch.randint(VOCAB, (batch, length), generator=torch.Generator().manual_seed(1)).to(device)
    models = {name: build(arch, name, configs[arch], device) for name in IMPLEMENTATIONS}
    jobs = {name: _repeat(training_step(model, tokens, autocast), steps) for name, model in models.items()}
    seconds = interleaved_seconds(jobs, rounds, device)
    ms = {name: 1e3 * seconds[name] / steps for name in IMPLEMENTATIONS}
    return {"arch": arch, "size": size, "device": device, "autocast": str(autocast).removeprefix("torch.") if autocast else None,
            "threads": torch.get_num_threads(), "batch": batch, "tokens": length, "steps": steps, "rounds": rounds,
            "params": sum(p.numel() for p in models["sdpa"].parameters()), "ms": ms,
            "ratio": {name: ms[name] / ms["sdpa"] for name in IMPLEMENTATIONS[1:]}}


def _repeat(step, times: int):
    def run() -> None:
        for _ in range(times):
            step()

    return run
