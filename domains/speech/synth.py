"""eSpeak NG through ctypes on the library and voice data of the ``espeakng-loader`` wheel, so a fresh
virtual environment synthesises speech without a system package.

eSpeak keeps state between utterances that no API call resets (the pitch-flutter phase, a static in its
wave generator) and draws breath noise from its own generator and libc's ``rand``. So ``synthesise``
seeds both per utterance and runs a whole request list in a fresh interpreter that runs this file as a
script: the same list then gives the same samples, byte for byte. (A fresh interpreter rather than a
multiprocessing child, which would re-import the caller's ``__main__``.) The script imports only numpy.
"""
from __future__ import annotations

import ctypes
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import NamedTuple

import numpy as np

_SYNCHRONOUS = 2  # espeak_AUDIO_OUTPUT: AUDIO_OUTPUT_SYNCHRONOUS
_CHARS_UTF8 = 1  # espeak_Synth flags: espeakCHARS_UTF8
_RATE, _PITCH, _RANGE = 1, 3, 4  # espeak_PARAMETER
_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.c_void_p)


class Utterance(NamedTuple):
    text: str
    voice: str  # <language>[+<variant>], e.g. en-us+f3
    rate: int  # words per minute, 80-450
    pitch: int  # 0-100
    pitch_range: int  # 0-100
    seed: int  # eSpeak's noise generator


class SynthesisError(RuntimeError):
    """eSpeak NG is missing or refused a request (the data module turns this into a DataError)."""


class ESpeak:
    """The library, initialised for synchronous synthesis; ``say`` returns int16 at ``sample_rate``."""

    def __init__(self):
        try:
            import espeakng_loader

            self._lib = ctypes.CDLL(espeakng_loader.get_library_path())
            data_path = espeakng_loader.get_data_path().encode()
        except (ImportError, OSError, RuntimeError) as err:
            raise SynthesisError(f"eSpeak NG is unavailable ({err}); install the espeakng-loader package") from None
        self._libc = ctypes.CDLL(None)
        lib = self._lib
        lib.espeak_Initialize.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
        lib.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]
        lib.espeak_SetParameter.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
        lib.espeak_ng_SetRandSeed.argtypes = [ctypes.c_long]
        lib.espeak_Synth.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint, ctypes.c_int,
                                     ctypes.c_uint, ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p]
        self.sample_rate = lib.espeak_Initialize(_SYNCHRONOUS, 0, data_path, 0)
        if self.sample_rate <= 0:
            raise SynthesisError(f"eSpeak NG failed to initialise with voice data {data_path.decode()}")
        self._chunks: list[np.ndarray] = []
        self._callback = _CALLBACK(self._collect)  # kept alive: the library holds a raw pointer to it
        lib.espeak_SetSynthCallback(self._callback)

    def _collect(self, wav, num_samples, events) -> int:
        if num_samples > 0:
            self._chunks.append(np.ctypeslib.as_array(wav, shape=(num_samples,)).copy())
        return 0  # 0 = keep going

    def say(self, u: Utterance) -> np.ndarray:
        if self._lib.espeak_SetVoiceByName(u.voice.encode()) != 0:
            raise SynthesisError(f"eSpeak NG has no voice {u.voice!r}")
        for param, value in ((_RATE, u.rate), (_PITCH, u.pitch), (_RANGE, u.pitch_range)):
            self._lib.espeak_SetParameter(param, int(value), 0)
        self._lib.espeak_ng_SetRandSeed(u.seed)
        self._libc.srand(u.seed)
        self._chunks = []
        text = u.text.encode()
        self._lib.espeak_Synth(text, len(text) + 1, 0, 0, 0, _CHARS_UTF8, None, None)
        self._lib.espeak_Synchronize()
        return np.concatenate(self._chunks) if self._chunks else np.zeros(0, dtype=np.int16)


def synthesise(utterances: list[Utterance]) -> tuple[int, list[np.ndarray]]:
    """(sample rate, int16 waveforms) for ``utterances``, synthesised in order in a fresh interpreter."""
    with tempfile.TemporaryDirectory() as tmp:
        requests, result = Path(tmp) / "requests.json", Path(tmp) / "audio.npz"
        requests.write_text(json.dumps([list(u) for u in utterances]))
        done = subprocess.run([sys.executable, __file__, str(requests), str(result)], capture_output=True, text=True)
        if done.returncode != 0:
            last = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "eSpeak NG failed"
            raise SynthesisError(last.removeprefix(f"{SynthesisError.__name__}: "))
        with np.load(result) as audio:
            return int(audio["sample_rate"]), [audio[str(i)] for i in range(len(utterances))]


if __name__ == "__main__":
    engine = ESpeak()
    waves = [engine.say(Utterance(*u)) for u in json.loads(Path(sys.argv[1]).read_text())]
    np.savez(sys.argv[2], sample_rate=engine.sample_rate, **{str(i): w for i, w in enumerate(waves)})
