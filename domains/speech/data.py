"""Keyword audio: spoken words synthesised with eSpeak NG (the offline default), Speech Commands v2, or any
class-per-folder tree of audio files. ``LOADERS`` (at the end) maps each dataset name to its loader,
which lists the (file, label) items of every split; every source gives (waveform, label) items at one
sample rate, and batches are ``((waveforms [B, S], lengths [B]), labels [B])`` with zero padding.

Splits never follow the training seed: eSpeak's are grouped by voice (no test voice is heard in
training), Speech Commands' are its shipped lists, and a folder tree's are its split folders
(``<root>/{train,val,test}/<class>/``) or drawn from ``data.split_seed``, at random or grouped by
``data.group_pattern`` (e.g. the speaker of ``<digit>_<speaker>_<index>.wav``)."""
from __future__ import annotations

import json
import logging
import math
import os
import shutil
from pathlib import Path

import numpy as np
import torch
from scipy.signal import resample_poly
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import Dataset

from common.data import (
    SPLITS,
    DataError,
    Split,
    SplitDataModule,
    check_finite_array,
    class_folder_files,
    class_folder_splits,
    data_root,
    grouping,
    named,
    require_path,
    shipped_split,
    short_hash,
    split_folders,
    split_names,
)
from common.files import MiB, read_text, regular_file
from common.optional import require

from .config import Data, Espeak
from .synth import SynthesisError, Utterance, synthesise

sf = require("soundfile", extra="speech")
AF = require("torchaudio.functional", extra="speech")

log = logging.getLogger(__name__)

AUDIO_EXTENSIONS = (".wav", ".flac", ".ogg")
MAX_LIST_BYTES = 16 * MiB  # a split list: one path a line (Speech Commands v2's are about 400 KiB)
GENERATOR_VERSION = 1  # part of the cache key: bump when generate_espeak changes what it writes


def read_audio(path: Path, sample_rate: int) -> torch.Tensor:
    """A mono float waveform at ``sample_rate`` (channels averaged, other rates resampled). A sample that is NaN
    or infinite (a float WAV may hold them) is a ``DataError`` naming the file and the sample, never a run that
    diverges on it."""
    samples, rate = sf.read(regular_file(path, "audio file"), dtype="float32", always_2d=True)
    check_finite_array(samples, path)
    wave = torch.from_numpy(samples.mean(1))
    return AF.resample(wave, rate, sample_rate) if rate != sample_rate else wave


def readable(path: Path) -> bool:
    """Whether the audio header of ``path`` reads and the file holds samples; if not, it is reported. Not a
    regular file (a FIFO would hang the reader) is a ``DataError``."""
    regular_file(path, "audio file")
    try:
        frames = sf.info(path).frames
    except (sf.LibsndfileError, RuntimeError) as err:
        log.warning("skipping unreadable audio %s: %s", path, err)
        return False
    if frames == 0:
        log.warning("skipping empty audio %s", path)
    return frames > 0


class AudioClips(Dataset):
    """Files read lazily, each cropped to ``max_samples``."""

    def __init__(self, items: list[tuple[Path, int]], sample_rate: int, max_samples: int):
        self.items, self.sample_rate, self.max_samples = items, sample_rate, max_samples

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        path, label = self.items[index]
        return read_audio(path, self.sample_rate)[: self.max_samples], label


def collate(batch: list[tuple[torch.Tensor, int]]):
    waves, labels = zip(*batch)
    lengths = torch.tensor([len(w) for w in waves])
    return (pad_sequence(list(waves), batch_first=True), lengths), torch.tensor(labels)


# ----------------------------------------------------------------------------------- datasets: real data
Items = list[tuple[Path, int]]
# How the items split (members: file paths relative to the dataset root), each member's (file, label), class names.
Splits = tuple[Split, dict[str, tuple[Path, int]], list[str]]


def _keep_classes(items: Items, names: list[str], wanted: list[str] | None, key: str,
                  root: Path) -> tuple[Items, list[str]]:
    """Restrict to the class folders ``wanted`` (None: every class folder), relabelled in that order."""
    wanted = list(wanted) if wanted is not None else names
    missing = sorted(set(wanted) - set(names))
    if missing:
        raise DataError(f"{root} has no class folder for {', '.join(missing)}; set data.{key} to the class folders "
                        f"to keep, or data.{key}=null for all of them")
    label_of = {names.index(w): i for i, w in enumerate(wanted)}
    return [(p, label_of[y]) for p, y in items if y in label_of], wanted


def speech_commands_splits(data: Data, cache_dir: Path) -> Splits:
    """Speech Commands v2 at ``data.root``: ``<word>/<speaker>_nohash_<n>.wav`` with ``validation_list.txt``
    and ``testing_list.txt`` naming the held-out files (its shipped split); everything else trains.
    ``_background_noise_`` is not a word (``class_folder_files`` skips folders starting with an underscore)."""
    root = data_root(data, "a folder of word folders with validation_list.txt and testing_list.txt", folder=True)
    lists = {}
    for split, name in (("val", "validation_list.txt"), ("test", "testing_list.txt")):
        listed = require_path(root / name, "Speech Commands split list")
        text = read_text(listed, "Speech Commands split list", MAX_LIST_BYTES)
        lists[split] = {line.strip() for line in text.splitlines() if line.strip()}
    items, names = class_folder_files(root, AUDIO_EXTENSIONS)
    items, classes = _keep_classes(items, names, data.keywords, "keywords", root)
    by_name = named(items, root)
    members = {split: [] for split in SPLITS}
    for name in by_name:
        members["val" if name in lists["val"] else "test" if name in lists["test"] else "train"].append(name)
    return Split("shipped", "validation_list.txt, testing_list.txt; train: every other file", members), by_name, classes


def folder_splits(data: Data, cache_dir: Path) -> Splits:
    """Any ``<class>/<file>`` audio tree at ``data.root`` with its classes from its folders (``data.classes``
    keeps some): split folders as shipped (``<root>/{train,val,test}/<class>/``), or one tree split by
    ``val_fraction`` and ``test_fraction``, at random or grouped by ``data.group_pattern``, from ``split_seed``."""
    root = data_root(data, "a folder of class folders of audio files", folder=True)
    fractions = (1.0 - data.val_fraction - data.test_fraction, data.val_fraction, data.test_fraction)
    seed, groups, wanted = data.split_seed, grouping(data), data.classes
    if split_folders(root):
        found, names = class_folder_splits(root, AUDIO_EXTENSIONS)
        items, classes = _keep_classes([item for files in found.values() for item in files], names, wanted,
                                       "classes", root)
        by_name = named(items, root)
        members = {split: [name for name in named(files, root) if name in by_name] for split, files in found.items()}
        return shipped_split(members, None, fractions, seed, groups), by_name, classes
    items, names = class_folder_files(root, AUDIO_EXTENSIONS)
    items, classes = _keep_classes(items, names, wanted, "classes", root)
    by_name = named(items, root)
    return split_names(list(by_name), fractions, seed, groups), by_name, classes


# ------------------------------------------------------------------------------------------ eSpeak NG data
def _noise(kind: str, n: int, rng: np.random.Generator, babble: list[np.ndarray], talkers: int) -> np.ndarray:
    """Background noise, any level (``mix_at_snr`` scales it): white, pink (1/f), brown (1/f^2) or babble
    (``talkers`` random stretches of other speech overlapped)."""
    if kind == "babble":
        out = np.zeros(n, dtype=np.float32)
        for _ in range(talkers):
            voice = babble[rng.integers(len(babble))]
            start = rng.integers(max(1, len(voice) - n))
            part = voice[start:start + n]
            out[: len(part)] += part
        return out
    exponent = {"white": 0.0, "pink": 1.0, "brown": 2.0}[kind]
    spectrum = np.fft.rfft(rng.standard_normal(n))
    spectrum /= np.maximum(np.arange(len(spectrum)), 1) ** (exponent / 2)  # power falls as 1/f^exponent
    spectrum[0] = 0.0  # no DC offset
    return np.fft.irfft(spectrum, n).astype(np.float32)


def mix_at_snr(speech: np.ndarray, noise: np.ndarray, snr_db: float) -> np.ndarray:
    """speech + noise scaled so that speech power / noise power = 10^(snr/10), powers over the whole clip."""
    gain = np.sqrt(np.mean(speech**2) / (np.mean(noise**2) * 10 ** (snr_db / 10) + 1e-12))
    return speech + gain * noise


def _trim(wave: np.ndarray, threshold: float = 0.01) -> np.ndarray:
    """Drop the leading and trailing silence eSpeak adds around a word."""
    loud = np.flatnonzero(np.abs(wave) > threshold * np.abs(wave).max()) if len(wave) else []
    return wave[loud[0]: loud[-1] + 1] if len(loud) else wave


def _voice_splits(spec: Espeak) -> dict[str, list[str]]:
    splits = {split: list(getattr(spec.voices, split)) for split in SPLITS}
    for a, b in (("train", "val"), ("train", "test"), ("val", "test")):
        shared = set(splits[a]) & set(splits[b])
        if shared:
            raise DataError(f"eSpeak voices {', '.join(sorted(shared))} are in both {a} and {b}")
    return splits


def _reading(text: str, rng: np.random.Generator, variants: list[str], spec: Espeak) -> tuple[Utterance, str, str]:
    """One random reading of ``text``: accent, voice variant (of the split), rate, pitch, intonation and
    eSpeak's noise seed; also the accent and variant, which name the clip."""
    accents = spec.accents
    accent, variant = accents[rng.integers(len(accents))], variants[rng.integers(len(variants))]
    return Utterance(text, f"{accent}+{variant}", int(rng.integers(*spec.rate, endpoint=True)),
                     int(rng.integers(*spec.pitch, endpoint=True)),
                     int(rng.integers(*spec.pitch_range, endpoint=True)),
                     int(rng.integers(2**31))), accent, variant


def _plan(spec: Espeak, keywords: list[str], out: Path) -> tuple[list[Utterance], list[tuple]]:
    """Every utterance to synthesise (per split: its babble pool, then its keyword clips) and, per clip,
    (its split's babble utterances, its utterance, its path, its split's generator)."""
    phrases, pool = spec.babble.phrases, spec.babble.pool
    plans, requests = [], []
    for split_index, (split, variants) in enumerate(_voice_splits(spec).items()):
        rng = np.random.default_rng([spec.seed, split_index])
        babble = [len(requests) + i for i in range(pool)]
        requests += [_reading(phrases[i % len(phrases)], rng, variants, spec)[0] for i in range(pool)]
        for word in keywords:
            for n in range(getattr(spec.clips_per_word, split)):
                u, accent, variant = _reading(word, rng, variants, spec)
                plans.append((babble, len(requests), out / split / word / f"{variant}_{accent}_{n:04d}.wav", rng))
                requests.append(u)
    return requests, plans


def generate_espeak(spec: Espeak, keywords: list[str], sample_rate: int, clip_seconds: float, out: Path) -> None:
    """Write ``out/<split>/<word>/<variant>_<accent>_<n>.wav``: each clip one keyword in a random accent,
    voice variant of its split, speed and pitch, at a random place in the clip, at a random level, under
    background noise at a random SNR. ``spec`` is ``data.espeak``; everything follows from its ``seed``."""
    clip = int(round(clip_seconds * sample_rate))
    requests, plans = _plan(spec, keywords, out)
    require("espeakng_loader", extra="speech")  # synthesis runs in a child process: its missing package is found here
    try:
        rate, waves = synthesise(requests)
    except SynthesisError as err:
        raise DataError(str(err)) from None
    # scipy's polyphase filter: several times faster than torchaudio's sinc kernel for 22,050 -> 16,000 Hz
    up, down = sample_rate // math.gcd(rate, sample_rate), rate // math.gcd(rate, sample_rate)
    audio = [resample_poly(w.astype(np.float32) / 32768.0, up, down).astype(np.float32) for w in waves]
    # The random draws of each split run in the order they were planned, so a rebuild is identical.
    for babble, index, path, rng in plans:
        word = _trim(audio[index])[:clip]
        level = 10 ** (rng.uniform(*spec.level_db) / 20) / max(np.abs(word).max(), 1e-6)
        speech = np.zeros(clip, dtype=np.float32)
        start = rng.integers(clip - len(word) + 1)
        speech[start:start + len(word)] = word * level
        kind = spec.noise[rng.integers(len(spec.noise))]
        noise = _noise(kind, clip, rng, [audio[i] for i in babble], spec.babble.talkers)
        mixed = mix_at_snr(speech, noise, rng.uniform(*spec.snr_db))
        path.parent.mkdir(parents=True, exist_ok=True)
        sf.write(path, np.clip(mixed, -1.0, 1.0), sample_rate, subtype="PCM_16")


def espeak_dataset(spec: Espeak, keywords: list[str], sample_rate: int, clip_seconds: float,
                   cache_dir: str | Path) -> Path:
    """The generated tree for this recipe under ``cache_dir/speech``, generated on first use. A run
    builds into a private folder and renames it into place, so concurrent runs never see half a tree."""
    recipe = [GENERATOR_VERSION, spec.model_dump(), list(keywords), sample_rate, clip_seconds]
    out = Path(cache_dir) / "speech" / f"espeak-{short_hash(recipe)}"
    if not out.exists():
        building = out.with_name(f"{out.name}.building-{os.getpid()}")
        shutil.rmtree(building, ignore_errors=True)
        generate_espeak(spec, keywords, sample_rate, clip_seconds, building)
        (building / "recipe.json").write_text(json.dumps(recipe, sort_keys=True))
        try:
            building.rename(out)
        except OSError:  # another run finished first: theirs is identical
            shutil.rmtree(building, ignore_errors=True)
    return out


def espeak_splits(data: Data, cache_dir: Path) -> Splits:
    """The ``data.keywords`` said by eSpeak NG, generated on first use (see ``generate_espeak``); each split
    has its own voices."""
    words = data.keywords
    if not words:
        raise DataError("the espeak dataset needs data.keywords (the words to synthesise)")
    root = espeak_dataset(data.espeak, words, data.sample_rate, data.clip_seconds, cache_dir)
    # class_folder_files labels the word folders in sorted order
    found = {split: named(class_folder_files(root / split, (".wav",))[0], root) for split in SPLITS}
    split = Split("grouped", f"eSpeak voices per split (data.espeak.voices), recipe {root.name}",
                  {name: list(items) for name, items in found.items()})
    return split, {name: item for items in found.values() for name, item in items.items()}, sorted(words)


# -------------------------------------------------------------------------------------------- datamodule
class SpeechDataModule(SplitDataModule):
    """``data`` is the domain's typed ``data`` section. ``classes`` is known after construction (the model
    needs it); the audio is generated or indexed then too, so a bad root fails at build time. Unreadable
    files are skipped, and the split's members are the files kept."""

    def __init__(self, data: Data, cache_dir: str | Path):
        super().__init__(data.batch_size, num_workers=data.num_workers, collate_fn=collate)
        split, by_name, self.classes = LOADERS[data.dataset](data, Path(cache_dir))
        max_samples = int(round(data.clip_seconds * data.sample_rate))
        usable = {member for member, (path, _) in by_name.items() if readable(path)}
        members = {}
        for name in SPLITS:
            members[name] = [member for member in split.members[name] if member in usable]
            if not members[name]:
                raise DataError(f"no readable audio in the {name} split of dataset {data.dataset!r}")
            items = [by_name[member] for member in members[name]]
            self.datasets[name] = AudioClips(items, data.sample_rate, max_samples)
        self.describe_split(split.source, split.rule, members)


# data.dataset -> its loader (config.DATASETS names them)
LOADERS = {"espeak": espeak_splits, "speech_commands": speech_commands_splits, "folder": folder_splits}
