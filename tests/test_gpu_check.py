"""What a lent GPU is for, in a few minutes, as one script; also a pytest module whose checks run where CUDA is found
and are skipped where it is not (CI has none). From the repository root:

    python tests/test_gpu_check.py                       # one line per check; exit status 1 if one fails
    python tests/test_gpu_check.py hf ratios             # some of its parts: hf, ratios, eager, compiled
    GPU_CHECK_DEVICE=cpu python tests/test_gpu_check.py  # a dry run of the script itself on CPU, at small sizes

1. Every domain's paper preset (its model and recipe, on the domain's embedded data: a lent machine reaches no
   dataset) for 3 steps in bf16-mixed precision, eager and through torch.compile: ``quest train`` ends ok.
2. The transformers backend on the device: attention sinks (gpt-oss) equal the library's eager attention, forward
   and the sinks' gradients; ``standard`` equals the library's SDPA in Llama with grouped-query attention, with and
   without a padding mask; elliptical gradients are exact under gradient checkpointing; and tests/test_hf_cuda.py's
   checks (float32 key norms under bf16 autocast, cached generation, bf16 training steps).
3. As a script only (speed is benchmark output, never a test's assertion): the training step with QUEST over the
   library's SDPA in Llama and GPT-2 at width 1024, 8 layers, 16 heads, 8 x 2048 tokens, bf16 autocast
   (``quest bench --hf llama --hf gpt2 --hf-size gpu --dtype bfloat16``).
"""
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch

DEVICE = os.environ.get("GPU_CHECK_DEVICE", "cuda")
if __name__ != "__main__" and not (DEVICE == "cuda" and torch.cuda.is_available()):
    pytest.skip("needs a CUDA device", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DRY = DEVICE == "cpu"  # the script's own dry run: small batches, torch.compile on one domain only
STEPS = 3
# Each domain's paper preset on its embedded data (the presets name datasets a lent machine cannot reach).
OFFLINE = {
    "graph": ["data.dataset=qm9", "data.root=null"],
    "language": ["data.dataset=stdlib"],
    "pointcloud": ["data.dataset=shapes"],
    "retrieval": [],
    "segmentation": ["data.dataset=digits"],
    "speech": ["data.dataset=espeak", "data.keywords=[zero,one,two,three,four,five,six,seven,eight,nine]"],
    "timeseries": ["data.dataset=vic_elec"],
    "vision": ["data.dataset=mnist"],
}
COMPILED = ("retrieval",) if DRY else tuple(OFFLINE)
failed = []


def report(name: str, ok: bool, numbers: str) -> None:
    print(f"{'PASS' if ok else 'FAIL'}  {name:58s} {numbers}", flush=True)
    if not ok:
        failed.append(name)
    assert ok or __name__ == "__main__", f"{name}: {numbers}"


# --- 1. every domain's paper preset -----------------------------------------------------------------------------------

def paper_preset_args(domain: str, compiled: bool, output_dir: str) -> list[str]:
    args = ["train", f"domain={domain}", "preset=paper", "attention=quest", *OFFLINE[domain],
            f"trainer.max_steps={STEPS}", "trainer.max_epochs=-1", "trainer.limit_val_batches=1",
            "trainer.limit_test_batches=1", "trainer.precision=bf16-mixed",
            f"trainer.accelerator={'cpu' if DRY else 'gpu'}", f"compile.enabled={str(compiled).lower()}",
            f"output_dir={output_dir}", "progress.style=none"]
    if domain not in ("retrieval", "timeseries", "pointcloud"):
        args.append("data.num_workers=0")  # the checks' own time, not the loaders'
    if DRY:
        args.append("data.batch_size=2")
        args += ["data.eval_batch_size=2"] if domain in ("language", "retrieval", "timeseries", "vision") else []
    return args


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("domain", OFFLINE)
def test_a_paper_preset_trains_in_bf16(domain, compiled):
    from common.records import find_records, read_record
    from runners.cli import main as cli

    if compiled and domain not in COMPILED:
        pytest.skip("compiled on one domain only in the dry run")
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as folder:
        code = cli(paper_preset_args(domain, compiled, folder))
        records = [read_record(path) for path in find_records(folder)]
    ok = code == 0 and len(records) == 1 and records[0].status == "ok"
    metrics = {k: round(v, 4) for k, v in list(records[0].metrics.items())[:3]} if records else {}
    report(f"{domain} paper preset, {STEPS} bf16 steps, {'compiled' if compiled else 'eager'}", ok,
           f"exit {code}  {time.perf_counter() - began:.0f} s  {metrics}")


# --- 2. the transformers backend on the device ------------------------------------------------------------------------

def causal_lm(arch: str, implementation: str, **config):
    import transformers

    import common.hf  # noqa: F401  (registers the backends)

    torch.manual_seed(0)
    settings = transformers.AutoConfig.for_model(arch, vocab_size=64, bos_token_id=None, eos_token_id=None,
                                                 pad_token_id=None, **config)
    return transformers.AutoModelForCausalLM.from_config(settings, attn_implementation=implementation).to(DEVICE)


def padded_batch(length: int = 33):
    ids = torch.randint(64, (3, length), generator=torch.Generator().manual_seed(1)).to(DEVICE)
    mask = torch.ones_like(ids)
    mask[0, :5] = 0
    return ids, mask


GPT_OSS = {"hidden_size": 64, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
           "num_key_value_heads": 2, "head_dim": 16, "num_local_experts": 2, "num_experts_per_tok": 1, "sliding_window": 8}
LLAMA = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 3, "num_attention_heads": 4,
         "num_key_value_heads": 2, "max_position_embeddings": 64}


def test_sinks_equal_the_librarys_eager_attention():
    ids, mask = padded_batch()
    seen = mask.bool()
    logits, grads = {}, {}
    for implementation in ("eager", "standard"):
        model = causal_lm("gpt_oss", implementation, **GPT_OSS).train()
        for layer in model.model.layers:
            layer.self_attn.sinks.data.uniform_(0.5, 3.0, generator=torch.Generator(DEVICE).manual_seed(2))
        out = model(ids, attention_mask=mask, labels=ids)
        out.loss.backward()
        logits[implementation] = out.logits[seen].detach()
        grads[implementation] = torch.stack([layer.self_attn.sinks.grad for layer in model.model.layers])
    diff = (logits["standard"] - logits["eager"]).abs().max().item()
    grad_diff = (grads["standard"] - grads["eager"]).abs().max().item()
    report("gpt-oss sinks: standard == eager (float32)", diff < 1e-4 and grad_diff < 1e-5,
           f"max |logit diff| {diff:.1e}  max |sink grad diff| {grad_diff:.1e}")


def test_standard_equals_sdpa_with_grouped_query_attention():
    ids, mask = padded_batch()
    seen = mask.bool()
    diffs = []
    for attention_mask in (None, mask):  # SDPA's enable_gqa without a mask; key/value heads copied with one
        with torch.no_grad():
            outs = [causal_lm("llama", name, **LLAMA).eval()(ids, attention_mask=attention_mask).logits[seen]
                    for name in ("sdpa", "standard")]
        diffs.append((outs[0] - outs[1]).abs().max().item())
    report("llama (grouped-query): standard == sdpa (float32)", max(diffs) < 1e-4,
           f"max |logit diff| no mask {diffs[0]:.1e}, padding mask {diffs[1]:.1e}")


def test_elliptical_gradients_are_exact_under_gradient_checkpointing():
    from common.patch import replace_attention

    ids, mask = padded_batch()
    grads = []
    for checkpointing in (False, True):
        model = causal_lm("llama", "sdpa", **LLAMA)
        replace_attention(model, "elliptical_quest")
        if checkpointing:
            (getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable)()
        model.train()(ids, attention_mask=mask, labels=ids).loss.backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    diff = (grads[0] - grads[1]).abs().max().item()
    report("elliptical_quest under gradient checkpointing", diff < 1e-5, f"max |grad diff| {diff:.1e}")


def test_the_cuda_checks_of_the_transformers_integration():
    env = {**os.environ, "HF_GPU_DEVICE": DEVICE}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(ROOT / "tests/test_hf_cuda.py")],
                          capture_output=True, text=True, cwd=ROOT, env=env)
    last = (done.stdout.strip().splitlines() or ["nothing collected (no CUDA)"])[-1]
    report("tests/test_hf_cuda.py (key norms, cached generation, bf16 steps)", done.returncode == 0 or (DRY and done.returncode == 5),
           last)


# --- 3. the step ratios ----------------------------------------------------------------------------------------------

def step_ratios() -> None:
    from runners.runs.hfbench import measure

    for arch in ("llama", "gpt2"):
        r = measure(arch, "tiny" if DRY else "gpu", device=DEVICE, autocast=torch.bfloat16, steps=1 if DRY else 5,
                    rounds=1 if DRY else 3)
        report(f"{arch}: training step, quest / sdpa (bf16 autocast)", True,
               f"quest {r['ratio']['quest']:.3f}  standard {r['ratio']['standard']:.3f}  sdpa {r['ms']['sdpa']:.1f} ms  "
               f"({r['batch']} x {r['tokens']} tokens, {r['params']:,} parameters, {device_name()})")


def device_name() -> str:
    return torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu"


def transformers_checks() -> None:
    for check in (test_sinks_equal_the_librarys_eager_attention, test_standard_equals_sdpa_with_grouped_query_attention,
                  test_elliptical_gradients_are_exact_under_gradient_checkpointing,
                  test_the_cuda_checks_of_the_transformers_integration):
        check()


def paper_presets(compiled: bool) -> None:
    for domain in COMPILED if compiled else OFFLINE:
        test_a_paper_preset_trains_in_bf16(domain, compiled)


PARTS = {"hf": transformers_checks, "ratios": step_ratios, "eager": lambda: paper_presets(False),
         "compiled": lambda: paper_presets(True)}

if __name__ == "__main__":
    began = time.perf_counter()
    import transformers

    unknown = set(sys.argv[1:]) - set(PARTS)
    if unknown:
        sys.exit(f"unknown part {', '.join(sorted(unknown))}; the parts: {', '.join(PARTS)}")
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, {device_name()}", flush=True)
    for part in sys.argv[1:] or PARTS:
        PARTS[part]()
    print(f"{'ALL PASSED' if not failed else 'FAILED: ' + ', '.join(failed)} in {time.perf_counter() - began:.0f} s")
    sys.exit(1 if failed else 0)
