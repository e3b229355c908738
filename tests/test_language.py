"""The language domain beyond the shared contract: KV-cache decoding equals full causal passes for every
variant, sampling, GPT-2 initialisation, the corpus splits and loaders (fixtures of each real format
written to temporary folders), one-line data errors, the metrics of a run, and `quest generate`."""
import math

import pytest
import torch

from common.attention import VARIANTS, attention_layer
from common.data import DataError
from common.records import find_records, read_record
from domains.language.config import Data
from domains.language.corpus import Document, stdlib
from domains.language.data import LanguageDataModule, read_capped
from domains.language.generate import main as generate_cli
from domains.language.model import GPT, generate
from runners.cli import main as cli

DATA = {"dataset": "text", "context": 8, "batch_size": 4, "eval_batch_size": 4}  # the other keys at their defaults


def data(**settings) -> Data:
    """The typed data section ``DATA`` with ``settings``."""
    return Data(**{**DATA, **settings})


def tiny_gpt(variant: str, context: int = 12) -> GPT:
    torch.manual_seed(0)
    net = GPT(32, context=context, dim=16, depth=3, heads=2, mlp_ratio=2.0, dropout=0.0, attn_dropout=0.0,
              tie_weights=True, attn_layer=attention_layer(variant=variant))
    for layer in net.encoder.layers:  # learnable scales away from their initial values, so a stale fold shows
        for p in layer.attn.qk.parameters():
            p.data.uniform_(0.5, 2.0)
    return net.eval()


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_cached_chunks_equal_one_causal_pass(variant):
    net = tiny_gpt(variant)
    tokens = torch.randint(32, (2, 12), generator=torch.Generator().manual_seed(1))
    full = net(tokens)
    cache = net.encoder.new_cache()
    chunks = [tokens[:, :5], tokens[:, 5:6], tokens[:, 6:7], tokens[:, 7:12]]  # prompt, two steps, a chunk of 5
    torch.testing.assert_close(torch.cat([net(c, cache) for c in chunks], dim=1), full, atol=1e-5, rtol=1e-5)
    assert len(cache[0]) == 12


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_cached_greedy_generation_equals_uncached(variant):
    net = tiny_gpt(variant)
    prompt = torch.randint(32, (2, 3), generator=torch.Generator().manual_seed(2))
    # 20 new tokens run past the context of 12, where both re-encode the last 12 tokens each step
    cached = generate(net, prompt, 20, temperature=0)
    assert torch.equal(cached, generate(net, prompt, 20, temperature=0, use_cache=False))
    assert cached.shape == (2, 23) and torch.equal(cached[:, :3], prompt)


def test_sampling_is_seeded_and_top_k_1_is_greedy():
    net = tiny_gpt("quest")
    prompt = torch.tensor([[1, 2, 3]])

    def draw(seed, **kw):
        return generate(net, prompt, 10, generator=torch.Generator().manual_seed(seed), **kw)

    assert torch.equal(draw(0, temperature=1.0), draw(0, temperature=1.0))
    assert torch.equal(draw(0, temperature=1.0, top_k=1), generate(net, prompt, 10, temperature=0))


def test_initialisation_follows_gpt2():
    torch.manual_seed(0)
    depth, dim = 6, 96
    net = GPT(256, context=64, dim=dim, depth=depth, heads=4, mlp_ratio=4.0, dropout=0.0, attn_dropout=0.0,
              tie_weights=True, attn_layer=attention_layer(variant="qknorm"))
    assert net.head.weight is net.token_embed.weight
    layer = net.encoder.layers[0]
    assert layer.attn.in_proj_weight.std().item() == pytest.approx(0.02, rel=0.05)
    mlp_out = [m for m in layer.mlp.modules() if isinstance(m, torch.nn.Linear)][-1]
    for projection in (layer.attn.out_proj.weight, mlp_out.weight):
        assert projection.std().item() == pytest.approx(0.02 / math.sqrt(2 * depth), rel=0.05)
    assert layer.attn.qk.gain.item() == pytest.approx(math.log2(64**2 - 64))  # a fold keeps its own start
    assert layer.attn.in_proj_bias.abs().max() == 0 and layer.norm1.weight.min() == 1


def test_stdlib_corpus_is_split_by_document_without_a_seed():
    corpus = stdlib(data())
    splits = corpus.splits
    names = {s: {d.name for d in docs} for s, docs in splits.items()}
    assert not (names["train"] & names["val"] or names["train"] & names["test"] or names["val"] & names["test"])
    skipped = {"site-packages", "dist-packages", "test", "tests", "idle_test"}
    assert not any(skipped & set(n.split("/")) for docs in names.values() for n in docs)
    assert 0.8 < len(names["train"]) / sum(map(len, names.values())) < 0.97
    assert stdlib(data()) == corpus and corpus.source == "random"  # a fixed rule: no seed anywhere
    parts = read_capped(splits["val"], 5000)
    assert sum(len(c) for _, c in parts) <= 5000


def test_a_byte_cap_never_splits_a_character(tmp_path):
    (tmp_path / "a.txt").write_text("aé€𝄞" * 10)  # 1-, 2-, 3- and 4-byte characters
    doc = Document(tmp_path / "a.txt", "a.txt")
    for limit in range(1, 40):
        content = b"".join(c for _, c in read_capped([doc], limit))
        assert len(content) <= limit
        content.decode("utf-8")  # whole characters only


def write_corpus(path, size: int, seed: int = 0) -> bytes:
    g = torch.Generator().manual_seed(seed)
    words = [b"the ", b"cat ", b"sat ", b"on ", b"a ", b"mat\n"]
    text = b"".join(words[i] for i in torch.randint(len(words), (size // 3,), generator=g).tolist())[:size]
    path.write_bytes(text)
    return text


@pytest.mark.parametrize("dataset", ["enwik8", "text8"])
def test_enwik8_and_text8_take_the_standard_90_5_5_split(tmp_path, dataset):
    text = write_corpus(tmp_path / dataset, 2000)
    for root in (tmp_path, tmp_path / dataset):  # the folder or the file itself
        dm = LanguageDataModule(data(dataset=dataset, root=str(root)))
        tokens = {s: d.tokens for s, d in dm.datasets.items()}
        assert [len(t) for t in tokens.values()] == [1800, 100, 100] and dm.split_info["source"] == "shipped"
        assert bytes(torch.cat(list(tokens.values())).tolist()) == text
        inputs, targets = dm.datasets["train"][1]
        assert torch.equal(inputs[1:], targets[:-1]) and inputs.shape == (8,)


def test_wikitext103_and_text_folders_and_files(tmp_path):
    for i, name in enumerate(["wiki.train.raw", "wiki.valid.raw", "wiki.test.raw"]):
        write_corpus(tmp_path / name, [3000, 200, 300][i], seed=i)
    dm = LanguageDataModule(data(dataset="wikitext103", root=str(tmp_path)))
    assert [len(dm.datasets[s].tokens) for s in ("train", "val", "test")] == [3000, 200, 300]

    folder = tmp_path / "docs"
    folder.mkdir()
    for i in range(40):
        write_corpus(folder / f"doc{i}.txt", 300, seed=i)
    (folder / ".hidden").write_bytes(b"\xff" * 100)
    dm = LanguageDataModule(data(root=str(folder), split=[0.5, 0.25, 0.25]))
    assert sum(len(d.tokens) for d in dm.datasets.values()) == 40 * 300

    single = tmp_path / "one.txt"
    text = write_corpus(single, 5000)
    dm = LanguageDataModule(data(root=str(single), split=[0.8, 0.1, 0.1]))
    train = bytes(dm.datasets["train"].tokens.tolist())
    assert text.startswith(train) and train.endswith(b"\n") and 4000 <= len(train) < 4100
    assert dm.split_info["source"] == "ordered"


def test_char_vocabulary_comes_from_train_and_unknowns_map_to_unk(tmp_path):
    (tmp_path / "wiki.train.raw").write_text("abc ab ca\n" * 20)
    (tmp_path / "wiki.valid.raw").write_text("abcz abc\n" * 3)
    (tmp_path / "wiki.test.raw").write_text("abc éé abc\n" * 3)
    dm = LanguageDataModule(data(dataset="wikitext103", root=str(tmp_path), tokens="char"))
    tok = dm.tokenizer
    assert tok.vocab_size == 6 and tok.unit == "char"  # <unk>, "\n", " ", a, b, c
    assert (dm.datasets["val"].tokens == 0).sum() == 3 and (dm.datasets["test"].tokens == 0).sum() == 6
    assert tok.decode(tok.encode("cab\n")) == "cab\n" and tok.decode(tok.encode("z")) == "\ufffd"


def test_bad_input_is_a_one_line_data_error(tmp_path):
    (tmp_path / "empty.txt").write_bytes(b"")
    (tmp_path / "latin1.txt").write_bytes("café\n".encode("latin-1") * 100)
    (tmp_path / "short.txt").write_bytes(b"0123456789\n" * 30)
    cases = {
        "does not exist": {"root": str(tmp_path / "missing")},
        "is empty": {"root": str(tmp_path / "empty.txt")},
        "not UTF-8": {"root": str(tmp_path / "latin1.txt"), "tokens": "char"},
        "the val split": {"root": str(tmp_path / "short.txt"), "context": 32},
        "needs data.root": {"dataset": "enwik8"},
    }
    for message, settings in cases.items():
        with pytest.raises(DataError, match=message) as err:
            LanguageDataModule(data(**settings))
        assert "\n" not in str(err.value)
    LanguageDataModule(data(root=str(tmp_path / "latin1.txt")))  # bytes read anything
    assert cli(["train", "domain=language", "data.dataset=text", f"data.root={tmp_path / 'empty.txt'}",
                f"output_dir={tmp_path / 'runs'}"]) == 2


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    """One smoke run through `quest train`, for what needs a finished run: its metrics and `quest generate`."""
    out = tmp_path_factory.mktemp("runs")
    assert cli(["train", "domain=language", "preset=smoke", "attention=quest", f"output_dir={out}",
                "trainer.max_steps=6", "trainer.val_check_interval=3", "optim.lr=0.01"]) == 0
    return find_records(out)[0].parent


def test_a_run_logs_loss_in_nats_with_bits_per_byte_and_perplexity(trained_run):
    record = read_record(trained_run)
    metrics, loss = record.metrics, record.metrics["test/loss"]
    assert record.primary_metric == "loss" and record.mode == "min" and record.best_val.value > 0
    assert record.split["source"] == "random" and "at most 20000 train" in record.split["rule"]
    assert metrics["test/bpb"] == pytest.approx(loss / math.log(2), rel=1e-4)
    assert metrics["test/ppl"] == pytest.approx(math.exp(loss), rel=1e-4)
    assert loss < math.log(256)  # six steps beat the uniform guess


def test_quest_generate_samples_from_the_best_checkpoint(trained_run, tmp_path, capsys):
    args = [str(trained_run), "--prompt", "import ", "--max-new-tokens", "30", "--seed", "3", "--num-samples", "2"]
    assert generate_cli(args) == 0
    first = capsys.readouterr().out
    assert first.startswith("import ") and first.count("import ") >= 2
    assert generate_cli(args) == 0 and capsys.readouterr().out == first

    (tmp_path / "config.yaml").write_text("domain: vision\n")
    for bad in (tmp_path / "missing", tmp_path):
        assert generate_cli([str(bad)]) == 2
        assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_the_second_initialisation_is_pytorchs_own():
    """model.init=torch: q/k/v as PyTorch's Xavier, linear layers as nn.Linear's; embeddings stay N(0, 0.02²)."""
    torch.manual_seed(0)
    nets = {init: GPT(32, context=12, dim=64, depth=2, heads=2, mlp_ratio=2.0, dropout=0.0, attn_dropout=0.0,
                      tie_weights=True, attn_layer=attention_layer(variant="quest"), init=init) for init in ("gpt2", "torch")}
    qkv = {init: net.encoder.layers[0].attn.in_proj_weight.std().item() for init, net in nets.items()}
    assert qkv["gpt2"] == pytest.approx(0.02, rel=0.05)
    assert qkv["torch"] == pytest.approx((2 / (64 + 3 * 64)) ** 0.5, rel=0.05)  # Xavier uniform's std
    assert nets["torch"].token_embed.weight.std().item() == pytest.approx(0.02, rel=0.1)
    with pytest.raises(ValueError, match="unknown model.init 'xavier'"):
        GPT(32, context=12, dim=16, depth=1, heads=2, mlp_ratio=2.0, dropout=0.0, attn_dropout=0.0,
            tie_weights=True, attn_layer=attention_layer(variant="quest"), init="xavier")
