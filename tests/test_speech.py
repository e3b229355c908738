"""Speech domain: eSpeak NG data, real-data loaders and their splits (voices, shipped lists, split folders,
random, grouped by speaker; none following the training seed), padding invariance, torchaudio conventions,
test-time noise."""
import logging
import math

import numpy as np
import pytest
import soundfile as sf
import torch
import torchaudio
from torch import nn

from common.attention import VARIANTS, attention_layer
from common.data import SPLITS, DataError
from common.task import perturbation_generator
from domains.speech import build, network
from domains.speech.data import SpeechDataModule, espeak_dataset, speech_commands_splits
from domains.speech.model import ConformerEncoder, KeywordTask, add_noise
from runners.cli import main as cli
from runners.config import compose


def config(*overrides):
    return compose(["domain=speech", "preset=smoke", *overrides])


# the section's keys one by one: the command line does not take a mapping for a section
TWO_CLIPS = ("data.espeak.clips_per_word.train=2", "data.espeak.clips_per_word.val=1",
             "data.espeak.clips_per_word.test=1")


def tiny_generation(seed=0, *overrides):
    return config("data.keywords=['yes',stop]", f"data.espeak.seed={seed}", "data.espeak.babble.pool=1", *TWO_CLIPS,
                  *overrides).data


def wav_bytes(root):
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*.wav"))}


def test_espeak_generation_is_deterministic_with_held_out_voices(tmp_path):
    cfg = tiny_generation()

    def make(data, where):
        return espeak_dataset(data.espeak, data.keywords, data.sample_rate, data.clip_seconds, tmp_path / where)

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
    assert voices["test"] <= set(cfg.espeak.voices.test)
    assert not voices["test"] & set(cfg.espeak.voices.train)


def test_a_voice_in_two_splits_is_refused(tmp_path):
    cfg = tiny_generation(0, "data.espeak.voices.test=[m8,m1]")
    with pytest.raises(DataError, match="m1 are in both train and test"):
        espeak_dataset(cfg.espeak, ["yes"], 16000, 1.0, tmp_path)


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


def speech_commands(root, *overrides):
    return config("data.dataset=speech_commands", f"data.root={root}", *overrides).data


def test_speech_commands_layout_splits_and_bad_files(tmp_path, caplog):
    speech_commands_fixture(tmp_path)
    split, _, classes = speech_commands_splits(speech_commands(tmp_path, "data.keywords=null"), tmp_path / "cache")
    assert classes == ["no", "up", "yes"]  # _background_noise_ is not a word
    assert split.source == "shipped"
    names = {s: sorted(members) for s, members in split.members.items()}
    assert names["val"] == ["no/bbb_nohash_0.wav", "up/bbb_nohash_0.wav", "yes/bbb_nohash_0.wav"]
    assert names["test"] == ["no/ccc_nohash_0.wav", "up/ccc_nohash_0.wav", "yes/ccc_nohash_0.wav"]
    assert "yes/aaa_nohash_0.wav" in names["train"] and len(names["train"]) == 5  # 3 good + broken + empty

    with caplog.at_level(logging.WARNING, logger="domains.speech.data"):
        dm = SpeechDataModule(speech_commands(tmp_path, "data.keywords=['yes',up]"), cache_dir=tmp_path / "cache")
    assert "broken_nohash_0.wav" in caplog.text and "no/empty_nohash_0.wav" not in caplog.text  # "no" not kept
    assert dm.classes == ["yes", "up"] and len(dm.datasets["train"]) == 2
    (wave, lengths), labels = next(iter(dm.train_dataloader()))
    assert wave.shape == (2, 8000) and lengths.tolist() == [8000, 8000]  # 0.5 s at 8 kHz, resampled to 16 kHz
    assert sorted(labels.tolist()) == [0, 1]

    with pytest.raises(DataError, match="does not exist"):
        SpeechDataModule(speech_commands(tmp_path / "nope"), tmp_path)
    with pytest.raises(DataError, match="needs data.root"):
        SpeechDataModule(config("data.dataset=folder").data, tmp_path)
    (tmp_path / "testing_list.txt").unlink()
    with pytest.raises(DataError, match="testing_list.txt"):
        speech_commands_splits(speech_commands(tmp_path), tmp_path / "cache")


@pytest.mark.parametrize("dataset", ["folder", "speech_commands"])
def test_a_file_as_data_root_is_named_in_one_line(tmp_path, capsys, dataset):
    file = tmp_path / "y.txt"
    file.write_text("not a folder")
    assert cli(["train", "domain=speech", "preset=smoke", f"data.dataset={dataset}", f"data.root={file}",
                f"output_dir={tmp_path}/runs", f"cache_dir={tmp_path}/cache", "trainer.enable_progress_bar=false"]) == 2
    err = capsys.readouterr().err
    assert f"data.root {file} is a file; dataset {dataset!r} needs a folder" in err and err.count("\n") == 1, err
    assert not (tmp_path / "runs").exists()


def test_audio_that_is_not_finite_is_a_data_error_not_a_divergence(tmp_path, capsys):
    for word in ("left", "right"):
        for n in range(4):
            write_tone(tmp_path / word / f"{n}.wav", rate=16000, seconds=0.2)
    bad = tmp_path / "left" / "nan.wav"
    sf.write(bad, np.array([0.1, np.nan, np.inf], dtype=np.float32), 16000, subtype="FLOAT")
    args = ["train", "domain=speech", "preset=smoke", "data.dataset=folder", f"data.root={tmp_path}",
            "data.val_fraction=0.3", "data.test_fraction=0.3", f"output_dir={tmp_path}/runs",
            f"cache_dir={tmp_path}/cache", "trainer.enable_progress_bar=false"]
    assert cli(args) == 2
    err = capsys.readouterr().err
    assert f"{bad}: sample 1 is [nan] (the first that is not finite)" in err and err.count("\n") == 1, err
    # no run, least of all one recorded as diverged at step 0 (the lock stays: the kernel's, and harmless)
    assert not [p for p in (tmp_path / "runs").rglob("*") if p.is_file() and p.suffix != ".lock"]


def test_class_folder_tree_takes_its_classes_from_its_folders(tmp_path):
    for word in ("left", "right"):
        for n in range(10):
            write_tone(tmp_path / word / f"{n}.wav", rate=16000, seconds=1.5)
    for preset in ("smoke", "demo"):  # the presets' English keywords are eSpeak's, not the folder's
        dm = SpeechDataModule(config("data.dataset=folder", f"data.root={tmp_path}", f"preset={preset}").data,
                              cache_dir=tmp_path / "cache")
        assert dm.classes == ["left", "right"]
    assert sum(len(dm.datasets[s]) for s in SPLITS) == 20
    wave, label = dm.datasets["train"][0]
    assert wave.shape == (16000,)  # cut to clip_seconds
    kept = SpeechDataModule(config("data.dataset=folder", f"data.root={tmp_path}", "data.classes=[right]").data,
                            cache_dir=tmp_path / "cache")
    assert kept.classes == ["right"] and sum(len(kept.datasets[s]) for s in SPLITS) == 10
    with pytest.raises(DataError, match="no class folder for up; set data.classes to the class folders to keep, "
                                        "or data.classes=null for all of them"):
        SpeechDataModule(config("data.dataset=folder", f"data.root={tmp_path}", "data.classes=[up]").data, tmp_path)


def spoken_digits(root, speakers=("jackson", "nicolas", "theo", "yweweler", "george", "lucas")):
    """A spoken-digit corpus in class folders: ``<digit>/<digit>_<speaker>_<index>.wav``."""
    for digit in range(3):
        for speaker in speakers:
            for index in range(3):
                write_tone(root / str(digit) / f"{digit}_{speaker}_{index}.wav", freq=300.0 + 50 * digit)


def speakers_by_split(dm) -> dict[str, set[str]]:
    return {split: {path.name.split("_")[1] for path, _ in dm.datasets[split].items} for split in SPLITS}


def test_folder_grouped_by_speaker_keeps_each_speaker_in_one_split(tmp_path):
    spoken_digits(tmp_path)
    args = ("data.dataset=folder", f"data.root={tmp_path}", "data.val_fraction=0.17", "data.test_fraction=0.17")
    random = SpeechDataModule(config(*args).data, tmp_path / "cache")
    assert random.split_info["source"] == "random"
    assert speakers_by_split(random)["test"] & speakers_by_split(random)["train"]  # at random, speakers straddle

    # the documented speaker pattern at the default fractions (0.1 / 0.1 of six speakers' clips) works as written
    speaker = "data.group_pattern='_(?P<group>[^_/]+)_\\d+\\.wav$'"
    grouped = SpeechDataModule(config("data.dataset=folder", f"data.root={tmp_path}", speaker).data, tmp_path / "cache")
    speakers = speakers_by_split(grouped)
    assert {split: len(found) for split, found in speakers.items()} == {"train": 4, "val": 1, "test": 1}
    assert sum(map(len, speakers.values())) == len(set().union(*speakers.values()))  # no speaker in two splits
    assert grouped.split_info["source"] == "grouped" and "(?P<group>" in grouped.split_info["rule"]
    # asked for in speakers: a count each, or which
    counted = SpeechDataModule(config(*args, speaker, "data.val_groups=2", "data.test_groups=1").data, tmp_path / "cache")
    assert {split: len(found) for split, found in speakers_by_split(counted).items()} == {"train": 3, "val": 2, "test": 1}
    assert "val: 2 groups, test: 1 group" in counted.split_info["rule"]
    listed = SpeechDataModule(config(*args, speaker, "data.val_groups=[theo]", "data.test_groups=[lucas,george]").data,
                              tmp_path / "cache")
    assert speakers_by_split(listed) == {"train": {"jackson", "nicolas", "yweweler"}, "val": {"theo"},
                                         "test": {"lucas", "george"}}


def test_folder_split_folders_are_used_as_shipped(tmp_path):
    spoken_digits(tmp_path / "train", speakers=("a", "b", "c", "d"))
    spoken_digits(tmp_path / "test", speakers=("e",))
    dm = SpeechDataModule(config("data.dataset=folder", f"data.root={tmp_path}").data, tmp_path / "cache")
    assert dm.classes == ["0", "1", "2"] and dm.split_info["source"] == "shipped"
    assert speakers_by_split(dm)["test"] == {"e"}
    # val: 0.1 / 0.9 of the 36 training clips
    assert len(dm.datasets["val"]) == 4 and len(dm.datasets["train"]) == 32


@pytest.mark.parametrize("dataset", ["espeak", "speech_commands", "folder"])
def test_split_is_the_same_for_every_training_seed(tmp_path, dataset):
    if dataset == "espeak":
        overrides = ("data.keywords=['yes',stop]", "data.espeak.babble.pool=1", *TWO_CLIPS)
    elif dataset == "speech_commands":
        speech_commands_fixture(tmp_path / "data")
        overrides = ("data.dataset=speech_commands", f"data.root={tmp_path / 'data'}", "data.keywords=null")
    else:
        spoken_digits(tmp_path / "data")
        overrides = ("data.dataset=folder", f"data.root={tmp_path / 'data'}")
    runs = [build(config(*overrides, f"seed={seed}", f"cache_dir={tmp_path / 'cache'}"))[0] for seed in (0, 1)]
    assert runs[0].split_info == runs[1].split_info
    sources = {"espeak": "grouped", "speech_commands": "shipped", "folder": "random"}
    assert runs[0].split_info["source"] == sources[dataset]
    for split in SPLITS:
        assert runs[0].datasets[split].items == runs[1].datasets[split].items


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_padding_does_not_change_valid_outputs(variant):
    torch.manual_seed(0)
    net = network(config(f"attention={variant}"), num_classes=3)  # the smoke model
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
    encoder = ConformerEncoder(16, 2, 2, 32, 5, attn_layer=attention_layer(variant="quest")).train()
    x = torch.randn(1, 20, 16)
    padded = torch.cat([x, torch.randn(1, 7, 16)], 1)
    out, lengths = encoder(padded, torch.tensor([20]))
    torch.testing.assert_close(out[:, :20], encoder(x, torch.tensor([20]))[0], atol=1e-5, rtol=1e-5)


def test_conventions_match_torchaudio_conformer():
    torch.manual_seed(0)
    reference = torchaudio.models.Conformer(input_dim=32, num_heads=4, ffn_dim=64, num_layers=3,
                                            depthwise_conv_kernel_size=7).eval()
    ours = ConformerEncoder(32, 3, 4, 64, 7, num_buckets=8, attn_layer=attention_layer(variant="standard")).eval()
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


def test_noise_conditions_follow_the_task_config():
    cfg = config()
    task = KeywordTask(nn.Identity(), 3, cfg.optim, seed=cfg.seed, **dict(cfg.task))
    assert list(task.perturbations) == ["snr10", "snr0"]  # logged as test/acc_snr10, test/acc_snr0
    torch.manual_seed(0)
    wave, lengths = 0.1 * torch.randn(2, 8000), torch.tensor([8000, 8000])
    for condition, settings in task.perturbations.items():
        once, again = (task.perturb((wave, lengths), condition, settings,
                                    perturbation_generator(0, 1, condition, wave.device)) for _ in range(2))
        assert torch.equal(once[0], again[0]) and torch.equal(once[1], lengths)
        snr = 10 * torch.log10(wave.square().mean() / (once[0] - wave).square().mean())
        assert abs(float(snr) - settings.snr_db) < 0.5
