"""Speech domain: eSpeak NG data, real-data loaders, padding invariance, torchaudio conventions, a smoke run."""
import math

import numpy as np
import pytest
import soundfile as sf
import torch
import torchaudio

from common.attention import VARIANTS
from common.data import DataError
from domains.speech.data import SPLITS, SpeechDataModule, espeak_dataset, speech_commands_splits
from domains.speech.model import ConformerEncoder, KeywordSpotter, add_noise
from runners.config import compose

SMOKE = ["domain=speech", "preset=smoke"]


def tiny_generation(seed=0, *overrides):
    return compose([*SMOKE, "data.keywords=['yes',stop]", f"data.espeak.seed={seed}",
                    "data.espeak.clips_per_word={train: 2, val: 1, test: 1}", "data.espeak.babble.pool=1", *overrides])


def wav_bytes(root):
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*.wav"))}


def test_espeak_generation_is_deterministic_with_held_out_voices(tmp_path):
    cfg = tiny_generation()
    make = lambda cfg, where: espeak_dataset(cfg.data.espeak, list(cfg.data.keywords), cfg.data.sample_rate,
                                             cfg.data.clip_seconds, tmp_path / where)
    first, again = make(cfg, "a"), make(cfg, "b")
    files = wav_bytes(first)
    assert len(files) == 2 * (2 + 1 + 1) and files == wav_bytes(again)
    other = make(tiny_generation(seed=1), "c")
    assert all(files[name] != data for name, data in wav_bytes(other).items() if name in files)
    for path in first.rglob("*.wav"):
        info = sf.info(path)
        assert info.samplerate == 16000 and info.frames == 16000 and info.channels == 1
        audio = sf.read(path)[0]
        assert np.abs(audio).max() > 0.05  # a word, not silence
    voices = {split: {p.name.split("_")[0] for p in (first / split).rglob("*.wav")} for split in SPLITS}
    assert voices["test"] <= set(cfg.data.espeak.voices.test)
    assert not voices["test"] & set(cfg.data.espeak.voices.train)


def test_a_voice_in_two_splits_is_refused(tmp_path):
    cfg = tiny_generation(0, "data.espeak.voices.test=[m8,m1]")
    with pytest.raises(DataError, match="m1 are in both train and test"):
        espeak_dataset(cfg.data.espeak, ["yes"], 16000, 1.0, tmp_path)


def write_tone(path, rate=8000, seconds=0.5, freq=440.0):
    path.parent.mkdir(parents=True, exist_ok=True)
    t = np.arange(int(rate * seconds)) / rate
    sf.write(path, 0.3 * np.sin(2 * math.pi * freq * t), rate, subtype="PCM_16")


def speech_commands_fixture(root):
    for word in ("yes", "no", "up"):
        for speaker in ("aaa", "bbb", "ccc"):
            write_tone(root / word / f"{speaker}_nohash_0.wav")
    write_tone(root / "_background_noise_" / "white_noise.wav", seconds=2.0)
    (root / "validation_list.txt").write_text("yes/bbb_nohash_0.wav\nno/bbb_nohash_0.wav\nup/bbb_nohash_0.wav\n")
    (root / "testing_list.txt").write_text("yes/ccc_nohash_0.wav\nno/ccc_nohash_0.wav\nup/ccc_nohash_0.wav\n")
    (root / "up" / "broken_nohash_0.wav").write_bytes(b"not a wave file")
    sf.write(root / "no" / "empty_nohash_0.wav", np.zeros(0), 8000)


def test_speech_commands_layout_splits_and_bad_files(tmp_path):
    speech_commands_fixture(tmp_path)
    splits, classes = speech_commands_splits(tmp_path)
    assert classes == ["no", "up", "yes"]  # _background_noise_ is not a word
    names = {s: sorted(p.relative_to(tmp_path).as_posix() for p, _ in items) for s, items in splits.items()}
    assert names["val"] == ["no/bbb_nohash_0.wav", "up/bbb_nohash_0.wav", "yes/bbb_nohash_0.wav"]
    assert names["test"] == ["no/ccc_nohash_0.wav", "up/ccc_nohash_0.wav", "yes/ccc_nohash_0.wav"]
    assert "yes/aaa_nohash_0.wav" in names["train"] and len(names["train"]) == 5  # 3 good + broken + empty

    cfg = compose([*SMOKE, "data.dataset=speech_commands", f"data.root={tmp_path}", "data.keywords=['yes',up]"])
    with pytest.warns(UserWarning) as caught:
        dm = SpeechDataModule(cfg.data, cache_dir=tmp_path / "cache")
    reported = " ".join(str(w.message) for w in caught)
    assert "broken_nohash_0.wav" in reported and "no/empty_nohash_0.wav" not in reported  # "no" not kept
    assert dm.classes == ["yes", "up"] and len(dm.datasets["train"]) == 2
    (wave, lengths), labels = next(iter(dm.train_dataloader()))
    assert wave.shape == (2, 8000) and lengths.tolist() == [8000, 8000]  # 0.5 s at 8 kHz, resampled to 16 kHz
    assert sorted(labels.tolist()) == [0, 1]

    with pytest.raises(DataError, match="does not exist"):
        SpeechDataModule(compose([*SMOKE, "data.dataset=speech_commands", f"data.root={tmp_path / 'nope'}"]).data, tmp_path)
    (tmp_path / "testing_list.txt").unlink()
    with pytest.raises(DataError, match="testing_list.txt"):
        speech_commands_splits(tmp_path)


def test_class_folder_tree(tmp_path):
    for word in ("left", "right"):
        for n in range(10):
            write_tone(tmp_path / word / f"{n}.wav", rate=16000, seconds=1.5)
    cfg = compose([*SMOKE, "data.dataset=folder", f"data.root={tmp_path}", "data.keywords=null"])
    dm = SpeechDataModule(cfg.data, cache_dir=tmp_path / "cache")
    assert dm.classes == ["left", "right"]
    assert sum(len(dm.datasets[s]) for s in SPLITS) == 20
    wave, label = dm.datasets["train"][0]
    assert wave.shape == (16000,)  # cut to clip_seconds


def tiny_net(variant, num_classes=3):
    return KeywordSpotter(num_classes, sample_rate=16000, clip_samples=16000,
                          features={"n_mels": 16, "win_ms": 25.0, "hop_ms": 10.0},
                          spec_augment={"n_freq_masks": 1, "freq_mask_param": 4, "n_time_masks": 1,
                                        "time_mask_param": 5, "p": 0.2},
                          subsampling_channels=4, dim=16, depth=2, heads=2, ffn_ratio=2.0, kernel_size=5,
                          dropout=0.0, num_buckets=8, max_distance=16, attention={"variant": variant})


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_padding_does_not_change_valid_outputs(variant):
    torch.manual_seed(0)
    net = tiny_net(variant)
    with torch.no_grad():  # nonzero relative-position bias, so padding would show through it
        for layer in net.encoder.conformer_layers:
            layer.rel_pos.table.weight.normal_()
    short, long = torch.randn(9000) * 0.1, torch.randn(16000) * 0.1
    batch = torch.zeros(2, 16000)
    batch[0, :9000], batch[1] = short, long
    net.train()  # BatchNorm on batch statistics first: it must ignore padded frames too
    net.spec_augment.p = 0.0
    loss = net((batch, torch.tensor([9000, 16000]))).square().sum()
    loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in net.parameters() if p.grad is not None)
    net.eval()
    with torch.no_grad():
        together = net((batch, torch.tensor([9000, 16000])))
        alone = net((short[None], torch.tensor([9000])))
    torch.testing.assert_close(together[0], alone[0], atol=1e-5, rtol=1e-5)


def test_encoder_ignores_padding_in_training():
    torch.manual_seed(0)
    encoder = ConformerEncoder(16, 2, 2, 32, 5, attention={"variant": "quest"}).train()
    x = torch.randn(1, 20, 16)
    padded = torch.cat([x, torch.randn(1, 7, 16)], 1)
    out, lengths = encoder(padded, torch.tensor([20]))
    torch.testing.assert_close(out[:, :20], encoder(x, torch.tensor([20]))[0], atol=1e-5, rtol=1e-5)


def test_conventions_match_torchaudio_conformer():
    torch.manual_seed(0)
    reference = torchaudio.models.Conformer(input_dim=32, num_heads=4, ffn_dim=64, num_layers=3,
                                            depthwise_conv_kernel_size=7).eval()
    ours = ConformerEncoder(32, 3, 4, 64, 7, num_buckets=8, attention={"variant": "standard"}).eval()
    missing, unexpected = ours.load_state_dict(reference.state_dict(), strict=False)
    assert not unexpected and all(".rel_pos." in key for key in missing) and len(missing) == 3
    assert len(ours.conformer_layers) == len(reference.conformer_layers)
    extra = sum(p.numel() for p in ours.parameters()) - sum(p.numel() for p in reference.parameters())
    assert extra == 3 * 8 * 4  # only the relative-position tables: layers x buckets x heads
    x, lengths = torch.randn(2, 25, 32), torch.tensor([25, 25])
    with torch.no_grad():
        (expected, expected_lengths), (got, got_lengths) = reference(x, lengths), ours(x, lengths)
    assert got.shape == expected.shape and torch.equal(got_lengths, expected_lengths)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)  # zero bias: the same function


def test_added_noise_has_the_requested_snr():
    wave = torch.zeros(2, 8000)
    wave[0, :4000] = torch.randn(4000)
    wave[1] = 0.1 * torch.randn(8000)
    lengths = torch.tensor([4000, 8000])
    noisy = add_noise(wave, lengths, 10.0, torch.Generator().manual_seed(0))
    assert torch.equal(noisy[0, 4000:], torch.zeros(4000))
    for i, n in enumerate(lengths.tolist()):
        snr = 10 * torch.log10(wave[i, :n].square().mean() / (noisy[i, :n] - wave[i, :n]).square().mean())
        assert abs(float(snr) - 10.0) < 0.5


def test_smoke_run(tmp_path):
    from runners.train import train

    record = train([*SMOKE, "attention=elliptical_quest", f"output_dir={tmp_path}", f"cache_dir={tmp_path}/cache"])
    assert record["status"] == "ok", record["error"]
    for key in ("test/acc", "test/acc_snr10", "test/acc_snr0"):
        assert math.isfinite(record["metrics"][key])
