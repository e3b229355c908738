"""The speech domain's config: its typed ``data``, ``model`` and ``task`` sections and its defaults of the shared
ones. Its presets are in configs/domain/speech.yaml."""
from typing import Annotated, Literal

from pydantic import Field

from common.schema import Count, Fraction, Optim, Positive, Robustness, RunConfig, Seed, Trainer
from common.sections import Encoder, GroupedSplit, Loader
from common.typed import Model

DATASETS = ("espeak", "speech_commands", "folder")  # their loaders: data.LOADERS

# [low, high] of an eSpeak draw (each clip takes a value between). Whole numbers, as their defaults: the generated
# data's cache key is a hash of the recipe as the config holds it, and a validated float would change it.
Span = Annotated[list[int], Field(min_length=2, max_length=2)]
Setting = Annotated[list[Annotated[int, Field(ge=0, le=100)]], Field(min_length=2, max_length=2)]  # eSpeak's 0-100
Milliseconds = Annotated[float, Field(gt=0)]
NOISES = ("white", "pink", "brown", "babble")


class Clips(Model):
    """Clips generated per keyword in each split."""

    train: Positive = 120
    val: Positive = 20
    test: Positive = 40


class Voices(Model):
    """eSpeak voice variants (speakers) of each split; a test voice is never heard in training."""

    train: list[str] = ["m1", "m2", "m3", "m4", "m5", "m6", "f1", "f2", "f3", "klatt", "klatt2", "klatt4", "croak",
                        "adam", "anika", "aunty", "boris", "grandma", "iven", "max"]
    val: list[str] = ["m7", "f4", "klatt3", "benjamin", "steph"]
    test: list[str] = ["m8", "f5", "klatt5", "grandpa", "quincy", "linda"]


class Babble(Model):
    """The babble noise: other speech overlapped."""

    pool: Positive = 12
    """Babble utterances per split (its own voices), mixed from."""
    talkers: Positive = 3
    """Talkers overlapped in one babble noise."""
    phrases: list[str] = ["the weather will be fine later today", "please call me when the train arrives",
                          "she bought bread and milk at the market", "we walked along the river after dinner"]


class Espeak(Model):
    """The generated default: each clip one keyword in a random accent, voice, speed and pitch, at a random level,
    under background noise. One cache per recipe, shared by all runs."""

    seed: Seed = 0
    clips_per_word: Clips = Clips()
    accents: list[str] = ["en-us", "en", "en-gb-scotland", "en-gb-x-rp", "en-029", "en-us-nyc"]
    voices: Voices = Voices()
    rate: Span = [120, 240]
    """Words per minute."""
    pitch: Setting = [20, 80]
    """eSpeak pitch, 0-100."""
    pitch_range: Setting = [20, 90]
    """eSpeak intonation range, 0-100."""
    level_db: Span = [-20, -1]
    """Word peak level, dB full scale."""
    snr_db: Span = [5, 30]
    """Background noise level: speech power over noise power, in dB."""
    noise: list[Literal[NOISES]] = ["white", "pink", "brown", "babble"]
    """The background noise kinds a clip draws from: white, pink (1/f), brown (1/f²), babble."""
    babble: Babble = Babble()


class Data(Loader, GroupedSplit):
    """The keyword clips: eSpeak NG words, Speech Commands v2 or any class-per-folder audio tree. Speakers are
    split apart: espeak's by its voices, speech_commands' by its lists, a folder's by group_pattern."""

    dataset: Literal[DATASETS] = "espeak"
    """espeak (generated, offline), speech_commands (v2 layout) or folder (<class>/*.wav)."""
    root: str | None = None
    """speech_commands / folder: the dataset folder."""
    keywords: list[str] | None = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine",
                                  "yes", "no", "up", "down", "left", "right", "on", "off", "stop", "go"]
    """espeak: the words said; speech_commands: the word folders kept (null = all). Quote "yes", "no", "on" and
    "off": YAML reads them bare as booleans."""
    classes: list[str] | None = None
    """folder: the class folders kept, in label order (null = every class folder)."""
    sample_rate: Positive = 16000
    """Every source is resampled to this."""
    clip_seconds: Annotated[float, Field(gt=0)] = 1.0
    """Clips are cut to this length."""
    val_fraction: Fraction = 0.1
    """folder: the validation share. Split folders <root>/{train,val,test}/<class>/* are used as shipped (no test/:
    val is also the test set; no val/: val comes out of train/); one <class>/* tree is split by the fractions."""
    test_fraction: Fraction = 0.1
    """folder: the test share."""
    espeak: Espeak = Espeak()


class Features(Model):
    """The log-mel front end."""

    n_mels: Positive = 40
    """Mel bands per frame."""
    win_ms: Milliseconds = 25.0
    """The analysis window."""
    hop_ms: Milliseconds = 10.0
    """Between frames."""


class SpecAugment(Model):
    """torchaudio's SpecAugment in training (masks drawn per utterance, zero masking)."""

    n_freq_masks: Count = 2
    freq_mask_param: Count = 8
    """The widest frequency mask, in mel bands."""
    n_time_masks: Count = 2
    time_mask_param: Count = 10
    """The widest time mask, in frames."""
    p: Fraction = 0.2
    """The largest share of the frames a time mask covers."""


class Net(Encoder):
    """``domains.speech.model.KeywordSpotter``'s keyword arguments: a Conformer on log-mel features."""

    features: Features = Features()
    spec_augment: SpecAugment = SpecAugment()
    subsampling_channels: Positive = 64
    """The convolutional subsampling's channels (4x in time before the blocks)."""
    ffn_ratio: float = 4.0
    """Each macaron feed-forward module's hidden width over dim."""
    kernel_size: Positive = 15
    """The depthwise convolution's; odd."""
    num_buckets: Positive = 32
    """Relative-position buckets (T5 style), half per direction."""
    max_distance: Positive = 64
    """Frames beyond which offsets share a bucket."""


class Noise(Model):
    snr_db: int
    """White noise this many dB below each clip's speech power."""


class Perturbations(Model):
    """Test-time conditions, each reported as test/acc_<condition> (the same noise for every variant)."""

    snr10: Noise = Noise(snr_db=10)
    snr0: Noise = Noise(snr_db=0)


class Task(Model):
    """``domains.speech.model.KeywordTask``'s keyword arguments."""

    label_smoothing: Fraction = 0.1
    perturbations: Perturbations = Perturbations()


class SpeechConfig(RunConfig):
    """Keyword spotting: a Conformer (macaron FFN, MHSA with a learned relative-position bias, conv module) on
    log-mel features. Default data: keywords synthesised with eSpeak NG, voice variants held out for test."""

    task: Task = Task()
    optim: Optim = Optim(lr=1.0e-3, weight_decay=0.01, warmup_steps=100)
    trainer: Trainer = Trainer(max_epochs=30)
    data: Data = Data(batch_size=64)
    model: Net = Net(dim=96, dropout=0.1)
    robustness: Robustness = Robustness(input_range=(-1.0, 1.0), eps=[0.001, 0.003], severities=[1])
    """``quest robustness <run dir>``: L-inf attacks on the waveform, whose samples lie in [-1, 1]; eps 0.001 and
    0.003 are about -60 and -50 dB of full scale. Image corruptions do not apply to audio."""
