"""The benchmarks' shared timing (``common.timing``) and the domain benchmarks at toy sizes: that what they
compare is comparable (the same model, the same output, the same batch), that each timed job does the work
it is credited with, and that the reported rates and ratios come from the timings of the right jobs. Never
how fast: speed claims are benchmark output, not test assertions."""
import sys

import pytest
import torch

from common.attention import attention_layer
from common.errors import ConfigError
from common.timing import interleaved_seconds

LANGUAGE = {"context": 8, "dim": 16, "depth": 2, "heads": 2, "mlp_ratio": 4.0}


def test_rounds_rotate_the_jobs_and_skip_the_warmup():
    calls = []
    seconds = interleaved_seconds({name: (lambda name=name: calls.append(name)) for name in "abc"}, rounds=3,
                                  device="cpu", warmup=1)
    # the warm-up round starts at a, then each counted round starts one job later
    assert calls == list("abc" "bca" "cab" "abc")
    assert set(seconds) == set("abc") and all(s >= 0 for s in seconds.values())


def fake_timer(monkeypatch, module, seconds: dict[str, float]) -> None:
    """``module.interleaved_seconds`` runs each job once and reports ``seconds[name]`` as its time."""
    def timed(jobs, rounds, device, warmup=1):
        for job in jobs.values():
            job()
        return {name: seconds[name] for name in jobs}

    monkeypatch.setattr(module, "interleaved_seconds", timed)


def parameters(model) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()]).clone()


def test_language_bench_reference_is_our_standard_gpt_built_from_torch_layers():
    from domains.language.bench import TorchGPT
    from domains.language.model import GPT

    torch.manual_seed(0)
    ours = GPT(256, **LANGUAGE, dropout=0.0, attn_dropout=0.0, tie_weights=True,
               attn_layer=attention_layer(variant="standard"))
    reference = TorchGPT(256, **LANGUAGE)
    names = {".self_attn.": ".attn.", ".linear1.": ".mlp.net.0.", ".linear2.": ".mlp.net.3."}  # torch's -> ours

    def our_name(name: str) -> str:
        for theirs, mine in names.items():
            name = name.replace(theirs, mine)
        return name

    state = ours.state_dict()
    reference.load_state_dict({name: state[our_name(name)] for name in reference.state_dict()})
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in reference.parameters())
    tokens = torch.randint(256, (3, LANGUAGE["context"]), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(reference.eval()(tokens), ours.eval()(tokens), atol=1e-5, rtol=1e-4)


def test_language_bench_times_training_steps_and_equal_generations(monkeypatch, capsys):
    import domains.language.bench as bench

    seconds = {"torch": 2.0, "standard": 1.0, "quest": 4.0, "with cache": 0.5, "without cache": 2.5}
    fake_timer(monkeypatch, bench, seconds)
    trained, generated = {}, {}
    train_steps, generate = bench.train_steps, bench.generate

    def recorded_train_steps(model, tokens):
        before, run = parameters(model), train_steps(model, tokens)
        return lambda n: (run(n), trained.__setitem__(id(model), not torch.equal(before, parameters(model))))

    def recorded_generate(net, prompt, n, **kwargs):
        generated[kwargs["use_cache"]] = out = generate(net, prompt, n, **kwargs)
        return out

    monkeypatch.setattr(bench, "train_steps", recorded_train_steps)
    monkeypatch.setattr(bench, "generate", recorded_generate)
    result = bench.main(["--dim", "16", "--depth", "1", "--heads", "2", "--context", "8", "--batch-size", "2",
                         "--steps", "3", "--rounds", "1", "--new-tokens", "5", "--threads", "1"])
    assert len(trained) == 3 and all(trained.values())  # each of the three models took its AdamW steps
    # the cached and the uncached generation time the same greedy output
    assert generated[True].shape == (1, 6) and torch.equal(generated[True], generated[False])
    assert result == pytest.approx({"train torch": 3 / 2.0, "train standard": 3 / 1.0, "train quest": 3 / 4.0,
                                    "with cache": 5 / 0.5, "without cache": 5 / 2.5,
                                    "standard/torch": 2.0, "quest/standard": 0.25, "cache/no cache": 5.0})
    assert "ratios: standard/torch 2.000, quest/standard 0.250, cache/no cache 5.000" in capsys.readouterr().out


def test_language_bench_without_nano_gpt_names_the_extra(monkeypatch):
    from domains.language.bench import NanoGPT

    monkeypatch.setitem(sys.modules, "nano_gpt.model", None)  # import fails as if the package were not installed
    with pytest.raises(ConfigError, match=r"nano_gpt.model cannot be imported.*\[nanogpt\]"):
        NanoGPT(65, **LANGUAGE)


def test_language_bench_nanogpt_is_our_size_and_trains():
    pytest.importorskip("nano_gpt.model", reason="the nanogpt extra is not installed")
    from domains.language.bench import NanoGPT, train_steps
    from domains.language.model import GPT

    theirs = NanoGPT(65, **LANGUAGE)
    ours = GPT(65, **LANGUAGE, dropout=0.0, attn_dropout=0.0, tie_weights=True,
               attn_layer=attention_layer(variant="standard"))
    assert sum(p.numel() for p in theirs.parameters()) == sum(p.numel() for p in ours.parameters())
    tokens = torch.randint(65, (2, LANGUAGE["context"] + 1), generator=torch.Generator().manual_seed(0))
    assert theirs(tokens[:, :-1]).shape == (2, LANGUAGE["context"], 65)
    before = parameters(theirs)
    train_steps(theirs, tokens)(1)
    assert not torch.equal(before, parameters(theirs))


def test_speech_bench_trains_both_conformers_of_one_size_on_one_ragged_batch(monkeypatch, capsys):
    import domains.speech.bench as bench

    fake_timer(monkeypatch, bench, {"ours (standard)": 3.0, "torchaudio": 1.5})
    jobs, train_steps = [], bench.train_steps

    def recorded_train_steps(model, x, lengths, n):
        before, run = parameters(model), train_steps(model, x, lengths, n)
        return lambda: (run(), jobs.append((model, x, lengths, n, not torch.equal(before, parameters(model)))))

    monkeypatch.setattr(bench, "train_steps", recorded_train_steps)
    result = bench.main(["--dim", "16", "--depth", "1", "--heads", "2", "--ffn-dim", "32", "--kernel-size", "3",
                         "--batch-size", "4", "--frames", "8", "--steps", "2", "--rounds", "1", "--threads", "1"])
    (ours, x, lengths, steps, ours_trained), (theirs, x2, lengths2, steps2, theirs_trained) = jobs
    assert x is x2 and lengths is lengths2 and steps == steps2 == 2 and ours_trained and theirs_trained
    assert lengths.max() == 8 and lengths.min() < 8  # ragged: both models mask padding
    # equal size: torchaudio's weights fit ours, which adds only its relative-position bias tables
    missing, unexpected = ours.load_state_dict(theirs.state_dict(), strict=False)
    assert not unexpected and missing and all(".rel_pos." in name for name in missing)
    assert result == pytest.approx({"ours (standard)": 2 / 3.0, "torchaudio": 2 / 1.5, "ratio": 0.5})
    assert "ratio ours / torchaudio: 0.500" in capsys.readouterr().out
