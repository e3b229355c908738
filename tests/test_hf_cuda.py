"""The transformers integration (common.hf) on a CUDA GPU: skipped where there is none (CI has none). Under pytest
the correctness checks run; as a script it prints one line per check and the speed ratios, from the repository root:

    python tests/test_hf_cuda.py           # 24 s on one H200; exit status 1 if a check fails

1. keys normalised in float32 under bf16 autocast: the fold sees float32 keys with autocast off (QUEST's queries as
   the model gives them, uncopied), the folded keys have unit norm to float32 rounding, and the bf16-autocast logits
   stay near the float32 ones;
2. greedy generation with the KV cache equals it without (tokens equal, logits close), float32;
3. 20 AdamW steps under bf16 autocast on one fixed batch: the loss falls, stays finite;
4. step time (forward + backward + AdamW, bf16 autocast) of quest over the library's sdpa at a moderate size.
Each on a tiny Llama (grouped-query attention) and a tiny GPT-2 built from configs, attn_implementation="quest".
"""
import os
import sys
import time

import pytest
import torch

pytest.importorskip("transformers")
if __name__ != "__main__" and not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402

sys.path.insert(0, ".")
import common.hf as hf  # noqa: E402  (registers the backends)

DEVICE = os.environ.get("HF_GPU_DEVICE", "cuda")  # HF_GPU_DEVICE=cpu: a dry run of the script itself, small sizes
VOCAB = 256
TINY = {"llama": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                  "num_key_value_heads": 2, "max_position_embeddings": 128},
        "gpt2": {"n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 128}}
failed = []


def build(arch, implementation, size=None, seed=0):
    torch.manual_seed(seed)
    config = AutoConfig.for_model(arch, vocab_size=VOCAB, bos_token_id=None, eos_token_id=None, **(size or TINY[arch]))
    return AutoModelForCausalLM.from_config(config, attn_implementation=implementation).to(DEVICE)


def report(name, ok, numbers):
    print(f"{'PASS' if ok else 'FAIL'}  {name:50s} {numbers}", flush=True)
    if not ok:
        failed.append(name)
    assert ok or __name__ == "__main__", f"{name}: {numbers}"


@pytest.mark.parametrize("arch", TINY)
def test_keys_are_normalised_in_float32_under_bf16(arch):
    model = build(arch, "quest").eval()
    tokens = torch.randint(VOCAB, (4, 64), device=DEVICE, generator=torch.Generator(DEVICE).manual_seed(1))
    seen, fold = [], hf.fold_qk

    def recorded(q, k, *args, **kwargs):
        qf, kf, scale = fold(q, k, *args, **kwargs)
        seen.append((q.dtype, k.dtype, torch.is_autocast_enabled(DEVICE), (kf.norm(dim=-1) - 1).abs().max().item()))
        return qf, kf, scale

    with torch.no_grad():
        exact = model(tokens).logits.float()
        hf.fold_qk = recorded
        try:
            with torch.autocast(DEVICE, dtype=torch.bfloat16):
                low = model(tokens).logits.float()
        finally:
            hf.fold_qk = fold
    dtypes_ok = all(k == torch.float32 and not autocast for _, k, autocast, _ in seen) and len(seen) == 2
    unit_error = max(err for *_, err in seen)
    rel = ((low - exact).abs().max() / exact.abs().max()).item()
    report(f"{arch}: keys normalised in float32 (bf16 autocast)", dtypes_ok and unit_error < 1e-5 and rel < 0.05,
           f"fold calls {len(seen)} float32 keys/no-autocast {dtypes_ok}  queries {seen[0][0]}  max |‖k̂‖-1| {unit_error:.1e}  "
           f"max |logits bf16 - fp32| / max |logits| {rel:.4f}")


@pytest.mark.parametrize("arch", TINY)
def test_cached_generation_equals_uncached(arch):
    model = build(arch, "quest").eval()
    prompt = torch.randint(VOCAB, (3, 8), device=DEVICE, generator=torch.Generator(DEVICE).manual_seed(2))
    runs = [model.generate(prompt, max_new_tokens=32, do_sample=False, use_cache=cache, output_logits=True,
                           return_dict_in_generate=True, pad_token_id=0) for cache in (True, False)]
    same = torch.equal(runs[0].sequences, runs[1].sequences)
    diff = (torch.stack(runs[0].logits) - torch.stack(runs[1].logits)).abs().max().item()
    report(f"{arch}: cached generation == uncached", same and diff < 1e-3,
           f"tokens equal {same}  max |logit diff| {diff:.1e}  ({runs[0].sequences.shape[1] - 8} new tokens x 3)")


@pytest.mark.parametrize("arch", TINY)
def test_training_steps_lower_the_loss(arch):
    model = build(arch, "quest").train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    tokens = torch.randint(VOCAB, (8, 64), device=DEVICE, generator=torch.Generator(DEVICE).manual_seed(3))
    losses = []
    for _ in range(20):
        with torch.autocast(DEVICE, dtype=torch.bfloat16):
            loss = model(tokens, labels=tokens).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    ok = all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0] - 0.1
    report(f"{arch}: 20 training steps (bf16 autocast)", ok, f"loss {losses[0]:.3f} -> {losses[-1]:.3f}")


def sync():
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def device_name():
    return torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu"


def step_time(model, tokens, steps=10):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step():
        with torch.autocast(DEVICE, dtype=torch.bfloat16):
            loss = model(tokens, labels=tokens).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(3):
        step()
    sync()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    sync()
    return (time.perf_counter() - start) / steps


def check_speed(arch, size, batch, length):
    tokens = torch.randint(VOCAB, (batch, length), device=DEVICE, generator=torch.Generator(DEVICE).manual_seed(4))
    times = {}
    for _ in range(2):  # alternate, so drift falls on both
        for implementation in ("sdpa", "quest"):
            model = build(arch, implementation, size).train()
            times.setdefault(implementation, []).append(step_time(model, tokens))
            del model
    sdpa, quest = min(times["sdpa"]), min(times["quest"])
    report(f"{arch}: step time quest / sdpa", True,
           f"ratio {quest / sdpa:.3f}  quest {1e3 * quest:.1f} ms  sdpa {1e3 * sdpa:.1f} ms  "
           f"(batch {batch} x {length} tokens, bf16 autocast, {device_name()})")


if __name__ == "__main__":
    began = time.perf_counter()
    print(f"torch {torch.__version__}, transformers {sys.modules['transformers'].__version__}, "
          f"{device_name()}", flush=True)
    for arch in TINY:
        test_keys_are_normalised_in_float32_under_bf16(arch)
        test_cached_generation_equals_uncached(arch)
        test_training_steps_lower_the_loss(arch)
    moderate = {"llama": {"hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 8, "num_attention_heads": 16,
                          "num_key_value_heads": 4, "max_position_embeddings": 2048},
                "gpt2": {"n_embd": 1024, "n_layer": 8, "n_head": 16, "n_positions": 2048}}
    for arch, size in (moderate if DEVICE == "cuda" else TINY).items():
        check_speed(arch, size, *((8, 2048) if DEVICE == "cuda" else (2, 64)))
    print(f"{'ALL PASSED' if not failed else 'FAILED: ' + ', '.join(failed)} in {time.perf_counter() - began:.0f} s")
    sys.exit(1 if failed else 0)
