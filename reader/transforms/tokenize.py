"""`Tokenize`: a sample's instruction text -> fixed-length token ids and their mask.

The text field (`task` in the synthetic store and in LeRobot conversions) is exported as a `.txt`
member and decoded to `str` (reader/decode.py); a `Mixture` fills a source that lacks it with "".
`bytes` (e.g. from a plain webdataset pipeline that did not decode `.txt`) are taken as UTF-8.

Which tokenizers are accepted, tried in this order (`tokenizer_kind`, so the choice is explicit):

1. `"tokenizers"`: a Hugging Face `tokenizers.Tokenizer` (recognised only when the `tokenizers`
   package is already imported, which it is when such an object exists, so nothing is imported here):
   `tokenizer.encode(text, add_special_tokens=add_special_tokens)`.
2. `"encode"`: any other object with a callable `encode` attribute, which is what a `transformers`
   tokenizer (`PreTrainedTokenizerBase`: slow or fast) and the `tokenizers.implementations` classes
   are: `tokenizer.encode(text, add_special_tokens=add_special_tokens)`. Nothing else is called.
3. `"callable"`: any other callable, `tokenizer(text)` (it decides about special tokens itself).

What the call returns may be a sequence of ints (`transformers`' `encode`, a plain function), an
`Encoding`-like object with `.ids` (`tokenizers`), or a mapping with `"input_ids"` (`transformers`'
`__call__`, so `Tokenize(lambda s: tok(s))` works too). Where it also carries an attention mask
(`.attention_mask` / `"attention_mask"`), the positions it marks 0 are the tokenizer's own padding
and are dropped: the padding and the mask are Tokenize's alone.

Length: the ids are cut to their first `max_length` (`truncation="right"`, the only mode) or padded
on the right with `pad_id`. Cutting keeps the leading special tokens and drops a trailing one (an EOS
or [SEP]); to keep it, set the tokenizer's own truncation (`tokenizers`: `enable_truncation(n)`, which
cuts the text before the special tokens are added) and Tokenize only pads.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

KINDS = ("tokenizers", "encode", "callable")
TRUNCATIONS = ("right",)
_INT64 = np.iinfo(np.int64)


def tokenizer_kind(tokenizer: Any) -> str:
    """How `Tokenize` calls `tokenizer`: one of `KINDS`, in the order the module docstring gives."""
    if isinstance(tokenizer, (str, bytes)):  # str has .encode, but is no tokenizer
        raise TypeError(f"tokenizer must be a callable or a tokenizer object, got the {type(tokenizer).__name__} "
                        f"{tokenizer!r}; to load a Hugging Face tokenizer by name use "
                        f"tokenizers.Tokenizer.from_pretrained(name) or tokenizers.Tokenizer.from_file(path)")
    hf = sys.modules.get("tokenizers")  # never imported here: a Tokenizer object implies it is loaded
    if hf is not None and isinstance(tokenizer, getattr(hf, "Tokenizer", ())):
        return "tokenizers"
    if callable(getattr(tokenizer, "encode", None)):
        return "encode"
    if callable(tokenizer):
        return "callable"
    raise TypeError(f"tokenizer must be a callable str -> list[int], a tokenizers.Tokenizer or an object with "
                    f"encode(text, add_special_tokens=...) (a transformers tokenizer), got {type(tokenizer).__name__}")


def _checked_int(name: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not low <= value <= _INT64.max:
        raise ValueError(f"Tokenize: {name} must be an int >= {low}, got {value!r}")
    return int(value)


class Tokenize:
    """Adds `<field>_tokens` (int64 `[max_length]`) and `<field>_tokens_mask` (bool `[max_length]`,
    True for the tokenizer's tokens, special ones included; False for padding) to a sample, or
    `[B, max_length]` tensors to a collated batch (`batch`).

    Tokens are cached per distinct text in each process (a window's text repeats across all windows
    of its episode): up to `cache_size` texts (0: no cache), then the cache is emptied and refills.
    An entry is about 9 * max_length + 350 bytes plus the text (measured: 800 bytes at max_length=64
    with 20 ids), so the default bound holds ~ 55 MB per worker in the worst case of 65,536 distinct
    texts at max_length=64; a cached sample costs two [L] copies. The cache is never pickled: each
    DataLoader worker starts with an empty one. A `tokenizers.Tokenizer` pickles itself (as its JSON), so the
    transform works in spawned workers; a plain callable must be picklable too (a module-level
    function or an object, not a lambda) when the DataLoader spawns its workers.
    """

    def __init__(self, tokenizer: Any, field: str = "task", *, max_length: int, pad_id: int = 0,
                 add_special_tokens: bool = True, truncation: str = "right", cache_size: int = 65_536) -> None:
        self.kind = tokenizer_kind(tokenizer)
        if not isinstance(field, str) or not field:
            raise ValueError(f"Tokenize: field must be a field name (a non-empty str), got {field!r}")
        if truncation not in TRUNCATIONS:
            raise ValueError(f"Tokenize: truncation must be one of {TRUNCATIONS} (keep the first max_length "
                             f"tokens), got {truncation!r}")
        if not isinstance(add_special_tokens, bool):
            raise ValueError(f"Tokenize: add_special_tokens must be True or False, got {add_special_tokens!r}")
        if isinstance(pad_id, bool) or not isinstance(pad_id, (int, np.integer)) \
                or not _INT64.min <= pad_id <= _INT64.max:
            raise ValueError(f"Tokenize: pad_id must be an int that fits int64, got {pad_id!r}")
        self.tokenizer = tokenizer
        self.field = field
        self.max_length = _checked_int("max_length", max_length, 1)
        self.pad_id = int(pad_id)
        self.add_special_tokens = add_special_tokens
        self.truncation = truncation
        self.cache_size = _checked_int("cache_size", cache_size, 0)
        self.tokens_key, self.mask_key = f"{field}_tokens", f"{field}_tokens_mask"
        self._cache: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # text -> read-only (tokens [L], mask [L])

    def __repr__(self) -> str:
        return (f"Tokenize({type(self.tokenizer).__name__} ({self.kind}), field={self.field!r}, "
                f"max_length={self.max_length}, pad_id={self.pad_id}, add_special_tokens={self.add_special_tokens})")

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_cache": {}}  # each worker fills its own; a pickled cache is dead weight

    def tokenize(self, text: str | bytes) -> tuple[np.ndarray, np.ndarray]:
        """One text's (tokens int64 `[L]`, mask bool `[L]`), fresh arrays (e.g. for an instruction at
        inference, tokenised exactly as in training)."""
        tokens, mask = self._entry(self._text(text, "the text"))
        return tokens.copy(), mask.copy()

    def __call__(self, sample: dict[str, Any], rng: np.random.Generator | None = None) -> dict[str, Any]:
        """The sample with `<field>_tokens` and `<field>_tokens_mask` added (a new dict; `rng` unused)."""
        where = f"sample {sample.get('__key__', '<without __key__>')!r}"
        if self.field not in sample:
            raise self._missing(sample, where)
        tokens, mask = self._entry(self._text(sample[self.field], where))
        return {**sample, self.tokens_key: tokens.copy(), self.mask_key: mask.copy()}  # [L] int64, [L] bool

    def batch(self, batch: dict[str, Any], generator: Any = None, device: Any = None) -> dict[str, Any]:
        """A collated batch (its text field a list of B texts, as `collate` leaves text) with
        `<field>_tokens` int64 `[B, L]` and `<field>_tokens_mask` bool `[B, L]` added (a new dict), on
        the CPU or on `device`. `generator` is unused (the protocol's)."""
        import torch

        if self.field not in batch:
            raise self._missing(batch, "the batch")
        texts = batch[self.field]
        if isinstance(texts, (str, bytes)) or not isinstance(texts, Sequence):
            raise TypeError(f"Tokenize.batch: the batch's {self.field!r} must be a list of texts (as collate "
                            f"leaves a text field), got {type(texts).__name__}")
        tokens = np.empty((len(texts), self.max_length), np.int64)  # [B, L]
        mask = np.empty((len(texts), self.max_length), np.bool_)  # [B, L]
        for row, text in enumerate(texts):
            tokens[row], mask[row] = self._entry(self._text(text, f"item {row} of the batch"))
        out_tokens, out_mask = torch.from_numpy(tokens), torch.from_numpy(mask)
        if device is not None:
            out_tokens, out_mask = out_tokens.to(device), out_mask.to(device)
        return {**batch, self.tokens_key: out_tokens, self.mask_key: out_mask}

    def _missing(self, item: Mapping[str, Any], where: str) -> ValueError:
        fields = sorted(k for k in item if not k.startswith("__"))
        return ValueError(f"Tokenize: {where} has no field {self.field!r}; its fields: {fields}. Pass the text "
                          f"field's name: Tokenize(tokenizer, field=NAME, ...) (the manifest's schema lists the "
                          f"fields of kind 'text')")

    def _text(self, value: Any, where: str) -> str:
        if isinstance(value, str):
            return value
        if isinstance(value, (bytes, bytearray, memoryview)):
            try:
                return bytes(value).decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ValueError(f"Tokenize: {where}: field {self.field!r} is not UTF-8 text ({exc})") from None
        raise TypeError(f"Tokenize: {where}: field {self.field!r} must be text (str or UTF-8 bytes), got "
                        f"{type(value).__name__}; name the instruction's field with field=NAME")

    def _entry(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        """Read-only (tokens int64 [L], mask bool [L]) for `text`, from the cache when it is there."""
        entry = self._cache.get(text)
        if entry is None:
            ids = self._ids(text)[:self.max_length]  # truncation="right": the first max_length ids
            tokens = np.full(self.max_length, self.pad_id, np.int64)  # [L]
            tokens[:len(ids)] = ids
            mask = np.arange(self.max_length) < len(ids)  # [L]
            tokens.flags.writeable = mask.flags.writeable = False  # shared by the text's samples: copied out
            entry = (tokens, mask)
            if self.cache_size:
                if len(self._cache) >= self.cache_size:
                    self._cache.clear()  # bounded: start again rather than grow with every new text
                self._cache[text] = entry
        return entry

    def _ids(self, text: str) -> np.ndarray:
        """The tokenizer's ids for `text` as int64 `[n]`, its own padding dropped."""
        if self.kind == "callable":
            result = self.tokenizer(text)
        else:  # "tokenizers" and "encode" take the same call
            result = self.tokenizer.encode(text, add_special_tokens=self.add_special_tokens)
        keep = None
        if isinstance(result, Mapping) and "input_ids" in result:  # transformers' __call__ (BatchEncoding)
            result, keep = result["input_ids"], result.get("attention_mask")
        elif hasattr(result, "ids"):  # a tokenizers Encoding
            result, keep = result.ids, getattr(result, "attention_mask", None)
        ids = np.asarray(result)
        if ids.size == 0:
            return np.zeros(0, np.int64)
        if ids.ndim != 1 or ids.dtype.kind not in "iu":
            raise TypeError(f"Tokenize: the tokenizer ({self.kind}) returned {type(result).__name__} "
                            f"{_preview(result)} for {text[:60]!r}; it must give a flat list of int ids")
        if keep is not None:
            keep = np.asarray(keep, bool)
            if keep.shape == ids.shape:
                ids = ids[keep]
        return ids.astype(np.int64, copy=False)


def _preview(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
