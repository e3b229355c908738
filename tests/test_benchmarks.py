"""The benchmarks' shared timing (``common.timing``) and the domain benchmarks at toy sizes: what they time
and report, never how fast (speed claims are benchmark output, not test assertions)."""
from common.timing import interleaved_seconds


def test_rounds_rotate_the_jobs_and_skip_the_warmup():
    calls = []
    seconds = interleaved_seconds({name: (lambda name=name: calls.append(name)) for name in "abc"}, rounds=3,
                                  device="cpu", warmup=1)
    # the warm-up round starts at a, then each counted round starts one job later
    assert calls == list("abc" "bca" "cab" "abc")
    assert set(seconds) == set("abc") and all(s >= 0 for s in seconds.values())


def test_language_bench_compares_our_gpt_with_torch_and_the_kv_cache(capsys):
    from domains.language.bench import main

    result = main(["--dim", "16", "--depth", "1", "--heads", "2", "--context", "8", "--batch-size", "2",
                   "--steps", "1", "--rounds", "1", "--new-tokens", "3", "--threads", "1"])
    assert {"train torch", "train standard", "train quest", "standard/torch", "quest/standard",
            "cache/no cache"} <= set(result)
    assert "ratios: standard/torch" in capsys.readouterr().out


def test_speech_bench_compares_our_conformer_with_torchaudios(capsys):
    from domains.speech.bench import main

    result = main(["--dim", "16", "--depth", "1", "--heads", "2", "--ffn-dim", "32", "--kernel-size", "3",
                   "--batch-size", "2", "--frames", "8", "--steps", "1", "--rounds", "1", "--threads", "1"])
    assert set(result) == {"ours (standard)", "torchaudio", "ratio"}
    assert result["ratio"] == result["ours (standard)"] / result["torchaudio"]
    assert "ratio ours / torchaudio" in capsys.readouterr().out
