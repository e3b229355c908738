"""Language-model data: a corpus (the loader of ``corpus.py`` that ``LOADERS`` names) cut
to its byte caps, tokenised, and served as windows of ``context + 1`` tokens (inputs and next-token
targets).

Tokens are bytes by default (vocabulary 256, nothing to ship or fit). ``data.tokens=char`` takes the
characters of the train split as the vocabulary (sorted, ids from 1); id 0 is ``<unk>``, which val and
test characters missing from train map to (counted in a warning) and which decodes as U+FFFD. Character
tokens need UTF-8 text: a document that is not is a ``DataError`` naming it.

Windows follow each other without overlap (stride ``context``), so an evaluation scores every token of a
split once (all but the first, and the tail shorter than a window); training shuffles them each epoch.
A split shorter than one window is a ``DataError`` naming the split and its first document.
"""
from __future__ import annotations

import logging

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset

from common.data import SPLITS, DataError, SplitDataModule

from .config import Data
from .corpus import Document, standard_split, stdlib, text, wikitext103

log = logging.getLogger(__name__)


class ByteTokenizer:
    unit = "byte"
    vocab_size = 256

    def encode(self, text: str | bytes) -> Tensor:
        data = text.encode() if isinstance(text, str) else text
        return torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.zeros(0, dtype=torch.uint8)

    def decode(self, ids) -> str:
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")  # a sampled byte run need not be UTF-8


class CharTokenizer:
    unit = "char"
    unk = 0

    def __init__(self, chars: str):
        self.chars = chars
        self.vocab_size = len(chars) + 1
        self.codes = _code_points(chars)

    @classmethod
    def fit(cls, texts: list[str]) -> CharTokenizer:
        return cls("".join(sorted(set().union(*map(set, texts)))))

    def encode(self, text: str) -> Tensor:
        codes = _code_points(text)
        index = np.searchsorted(self.codes, codes).clip(max=len(self.codes) - 1)
        known = self.codes[index] == codes
        if not known.all():
            log.warning("%d of %d characters are not in the train vocabulary: mapped to <unk>",
                        (~known).sum(), len(codes))
        return torch.from_numpy(np.where(known, index + 1, self.unk).astype(np.int32))

    def decode(self, ids) -> str:
        return "".join(self.chars[i - 1] if i > 0 else "\ufffd" for i in map(int, ids))


def _code_points(text: str) -> np.ndarray:
    return np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)


def read_capped(documents: list[Document], limit: int | None) -> list[tuple[Document, bytes]]:
    """(document, content) in order, cut once ``limit`` bytes are read; the cut moves back to a UTF-8
    character boundary so that character tokens never see half a character."""
    parts = []
    for doc in documents:
        if limit is not None and limit <= 0:
            break
        content = doc.read(limit)
        if limit is not None:
            limit -= len(content)
            if limit <= 0:
                content = content[:_char_boundary(content)]
        parts.append((doc, content))
    return parts


def _char_boundary(content: bytes) -> int:
    """len(content), or less so that the cut does not split a UTF-8 character."""
    for back in range(1, min(3, len(content)) + 1):
        lead = content[-back]
        if lead & 0xC0 != 0x80:  # not a continuation byte (0b10xxxxxx): the last character starts here
            width = 1 if lead < 0x80 else 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4
            return len(content) if back >= width else len(content) - back
    return len(content)


def decode_utf8(doc: Document, content: bytes) -> str:
    try:
        return content.decode("utf-8")
    except UnicodeDecodeError as err:
        raise DataError(f"{doc.path}: not UTF-8 (byte {doc.start + err.start}); data.tokens=char needs UTF-8 "
                        "text, data.tokens=byte reads any file") from None


class Windows(Dataset):
    """Non-overlapping (input, target) windows of ``context`` tokens over a 1-D token tensor."""

    def __init__(self, tokens: Tensor, context: int):
        self.tokens, self.context = tokens, context

    def __len__(self) -> int:
        return (len(self.tokens) - 1) // self.context

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        start = index * self.context
        chunk = self.tokens[start:start + self.context + 1].long()
        return chunk[:-1], chunk[1:]


def tokenize(splits: dict[str, list[tuple[Document, bytes]]], kind: str):
    """The tokenizer (a char vocabulary is fitted on train) and each split's tokens."""
    if kind == "byte":
        tokenizer = ByteTokenizer()
        return tokenizer, {s: tokenizer.encode(b"".join(c for _, c in parts)) for s, parts in splits.items()}
    texts = {s: [decode_utf8(doc, content) for doc, content in parts] for s, parts in splits.items()}
    tokenizer = CharTokenizer.fit(texts["train"])
    return tokenizer, {s: tokenizer.encode("".join(t)) for s, t in texts.items()}


class LanguageDataModule(SplitDataModule):
    """``data`` is the language config's typed ``data`` section; ``tokenizer`` is what the model speaks."""

    def __init__(self, data: Data):
        super().__init__(data.batch_size, eval_batch_size=data.eval_batch_size, num_workers=data.num_workers)
        corpus = LOADERS[data.dataset](data)
        documents = corpus.splits
        caps = {"train": data.max_train_bytes, "val": data.max_eval_bytes, "test": data.max_eval_bytes}
        parts = {s: read_capped(documents[s], caps[s]) for s in SPLITS}
        capped = f"; at most {caps['train']} train and {caps['val']} val/test bytes" if any(caps.values()) else ""
        # members: each document read, with the bytes read of it, so a cap shows in the split's hash
        self.describe_split(corpus.source, corpus.rule + capped,
                            {s: [f"{doc.name}:{len(content)}" for doc, content in parts[s]] for s in SPLITS})
        self.tokenizer, tokens = tokenize(parts, data.tokens)
        context = data.context
        for split in SPLITS:
            if len(tokens[split]) < context + 1:
                raise DataError(f"the {split} split ({_describe(documents[split])}) has {len(tokens[split])} "
                                f"tokens, fewer than one window of data.context + 1 = {context + 1}")
        self.datasets = {s: Windows(tokens[s], context) for s in SPLITS}


def _describe(documents: list[Document]) -> str:
    if not documents:
        return "no documents"
    more = len(documents) - 1
    return str(documents[0].path) + (f" and {more} more file{'s' * (more > 1)}" if more else "")


# data.dataset -> its loader (config.DATASETS names them)
LOADERS = {"stdlib": stdlib, "text": text, "enwik8": standard_split, "text8": standard_split, "wikitext103": wikitext103}
