"""`Tokenize` (reader/transforms/tokenize.py): exact ids and masks from real `tokenizers` tokenizers
built here from a tiny vocabulary or trained here on a few sentences (nothing downloaded), padding and
right truncation, special tokens, the per-text cache, the three kinds of tokenizer, pickling, collation,
and a real export read through a spawned 2-worker ShardLoader."""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers

from robowds.export.cli.main import main
from robowds.export.cli.synth import TASKS, write_synthetic_store
from robowds.reader.collation import Collate, collate
from robowds.reader.dataset import ShardDataset
from robowds.reader.loader import ShardLoader
from robowds.reader.transforms import Tokenize
from robowds.reader.transforms.tokenize import tokenizer_kind

VOCAB = {"[PAD]": 0, "[UNK]": 1, "pick": 2, "up": 3, "the": 4, "red": 5, "cube": 6, "and": 7, "place": 8,
         "it": 9, "in": 10, "bowl": 11}
CLS, SEP = 12, 13


def word_level(vocab: dict[str, int] = VOCAB) -> Tokenizer:
    """A real WordLevel tokenizer splitting on whitespace; unknown words -> [UNK] (1)."""
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return tok


def with_specials(tok: Tokenizer) -> Tokenizer:
    """`[CLS] text [SEP]`, as BERT-style tokenizers add them."""
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", special_tokens=[("[CLS]", CLS),
                                                                                            ("[SEP]", SEP)])
    return tok


def padded(ids: list[int], length: int, pad: int = 0) -> tuple[list[int], list[bool]]:
    """By hand: the first `length` ids, then `pad`; the mask True where an id is real."""
    ids = ids[:length]
    return ids + [pad] * (length - len(ids)), [True] * len(ids) + [False] * (length - len(ids))


class Counting:
    """A plain callable tokenizer (chars -> code points) that records every text it is asked for."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def __call__(self, text: str) -> list[int]:
        self.calls.append(text)
        return [ord(c) for c in text]


class FakeTransformersTokenizer:
    """Stands in for a `transformers` tokenizer ONLY to test Tokenize's duck-typed `encode` branch:
    transformers is not installed here (and may not be installed). It has what `PreTrainedTokenizerBase`
    has that Tokenize could use: `encode(text, add_special_tokens=True) -> list[int]` (BOS 101, EOS 102
    around one id per word) and `__call__` returning a dict with `input_ids`; Tokenize must call `encode`."""

    def __init__(self) -> None:
        self.called: list[str] = []

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        self.called.append("encode")
        ids = [len(word) for word in text.split()]
        return [101, *ids, 102] if add_special_tokens else ids

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        self.called.append("__call__")
        ids = self.encode(text, add_special_tokens)
        return {"input_ids": ids, "attention_mask": [1] * len(ids)}


def check(sample: dict[str, Any], ids: list[int], mask: list[bool]) -> None:
    assert sample["task_tokens"].dtype == np.int64 and sample["task_tokens_mask"].dtype == np.bool_
    assert sample["task_tokens"].tolist() == ids and sample["task_tokens_mask"].tolist() == mask


def test_word_level_exact_ids_masks_and_pad_id() -> None:
    t = Tokenize(word_level(), max_length=6)
    sample = {"__key__": "k", "task": "pick up the cube", "actions": np.zeros((3, 2), np.float32)}
    out = t(sample, np.random.default_rng(0))
    check(out, [2, 3, 4, 6, 0, 0], [True] * 4 + [False] * 2)  # short: padded with 0
    assert set(sample) == {"__key__", "task", "actions"} and out["actions"] is sample["actions"]  # not mutated
    check(t({"task": "pick up the red cube and"}), [2, 3, 4, 5, 6, 7], [True] * 6)  # exactly max_length
    check(t({"task": "pick up the red cube and place it in the bowl"}), [2, 3, 4, 5, 6, 7], [True] * 6)  # first 6
    check(t({"task": "pick up the green cube"}), [2, 3, 4, 1, 6, 0], [True] * 5 + [False])  # [UNK]
    check(t({"task": ""}), [0] * 6, [False] * 6)  # what a Mixture fills a missing text with
    check(t({"task": "pick up".encode()}), [2, 3, 0, 0, 0, 0], [True] * 2 + [False] * 4)  # UTF-8 bytes
    check(Tokenize(word_level(), max_length=4, pad_id=-1)({"task": "the bowl"}), [4, 11, -1, -1],
          [True] * 2 + [False] * 2)
    tokens, mask = t.tokenize("place it")
    assert tokens.tolist() == [8, 9, 0, 0, 0, 0] and mask.tolist() == [True] * 2 + [False] * 4
    tokens[0] = 99  # a fresh array: the cached entry is not touched
    check(t({"task": "place it"}), [8, 9, 0, 0, 0, 0], [True] * 2 + [False] * 4)


def test_special_tokens_and_the_tokenizers_own_settings() -> None:
    tok = with_specials(word_level())
    check(Tokenize(tok, max_length=6)({"task": "pick up"}), [CLS, 2, 3, SEP, 0, 0], [True] * 4 + [False] * 2)
    check(Tokenize(tok, max_length=6, add_special_tokens=False)({"task": "pick up"}), [2, 3, 0, 0, 0, 0],
          [True] * 2 + [False] * 4)
    long = "pick up the red cube and place it"
    check(Tokenize(tok, max_length=6)({"task": long}), [CLS, 2, 3, 4, 5, 6], [True] * 6)  # right cut drops [SEP]
    tok.enable_truncation(max_length=6)  # the tokenizer's own cut keeps it (the docs' advice)
    check(Tokenize(tok, max_length=6)({"task": long}), [CLS, 2, 3, 4, 5, SEP], [True] * 6)
    tok.no_truncation()
    tok.enable_padding(pad_id=0, pad_token="[PAD]", length=8)  # its padding is dropped; Tokenize's pads
    assert tok.encode("up").ids == [CLS, 3, SEP, 0, 0, 0, 0, 0]
    check(Tokenize(tok, max_length=5, pad_id=7)({"task": "up"}), [CLS, 3, SEP, 7, 7], [True] * 3 + [False] * 2)


def test_bpe_trained_here_and_pickle_round_trip() -> None:
    """A BPE tokenizer trained on the synthetic store's task texts; the transform (and the Tokenizer in
    it) survives pickling, as it must for spawned DataLoader workers."""
    bpe = Tokenizer(models.BPE(unk_token="[UNK]"))
    bpe.pre_tokenizer = pre_tokenizers.Whitespace()
    bpe.train_from_iterator(TASKS, trainers.BpeTrainer(vocab_size=80, special_tokens=["[PAD]", "[UNK]"],
                                                       show_progress=False))
    t = Tokenize(bpe, max_length=12)
    copy = pickle.loads(pickle.dumps(t))
    assert copy.kind == "tokenizers" and isinstance(copy.tokenizer, Tokenizer)
    for text in (*TASKS, "open the red sink"):
        ids, mask = padded(bpe.encode(text).ids, 12)
        check(t({"task": text}), ids, mask)
        check(copy({"task": text}), ids, mask)


def test_cache_calls_the_tokenizer_once_per_distinct_text() -> None:
    counting = Counting()
    t = Tokenize(counting, max_length=3)
    for text in ["ab", "cd", "ab", "ab", "cd", "abcd"]:
        t({"task": text})
    assert counting.calls == ["ab", "cd", "abcd"]
    out = t.batch({"task": ["ab", "xy", "abcd"]})
    assert counting.calls == ["ab", "cd", "abcd", "xy"]  # the batch path shares the cache
    assert out["task_tokens"].tolist() == [[97, 98, 0], [120, 121, 0], [97, 98, 99]]
    copy = pickle.loads(pickle.dumps(t))  # a worker's copy: the cache is not pickled
    copy({"task": "ab"})
    assert copy.tokenizer.calls == ["ab", "cd", "abcd", "xy", "ab"] and counting.calls[-1] == "xy"

    bounded = Tokenize(Counting(), max_length=3, cache_size=2)
    for text in ["a", "b", "a", "c", "a", "c"]:  # full at "c": emptied, then "c" and "a" cached again
        bounded({"task": text})
    assert bounded.tokenizer.calls == ["a", "b", "c", "a"]
    uncached = Tokenize(Counting(), max_length=3, cache_size=0)
    for text in ["a", "a"]:
        uncached({"task": text})
    assert uncached.tokenizer.calls == ["a", "a"]


def test_plain_callables() -> None:
    check(Tokenize(Counting(), max_length=4)({"task": "hi"}), [104, 105, 0, 0], [True] * 2 + [False] * 2)

    def dict_result(text: str) -> dict[str, list[int]]:  # a transformers __call__-style result, padded by it
        return {"input_ids": [5, 6, 0, 0], "attention_mask": [1, 1, 0, 0]}

    check(Tokenize(dict_result, max_length=3, pad_id=9)({"task": "x"}), [5, 6, 9], [True] * 2 + [False])
    with pytest.raises(TypeError, match=r"returned list \[0.5, 1.5\] for 'x'; it must give a flat list of int ids"):
        Tokenize(lambda text: [0.5, 1.5], max_length=3)({"task": "x"})


def test_transformers_like_tokenizer_is_duck_typed() -> None:
    fake = FakeTransformersTokenizer()
    assert tokenizer_kind(fake) == "encode"
    check(Tokenize(fake, max_length=5)({"task": "open the drawer"}), [101, 4, 3, 6, 102], [True] * 5)
    check(Tokenize(fake, max_length=5, add_special_tokens=False)({"task": "open the drawer"}), [4, 3, 6, 0, 0],
          [True] * 3 + [False] * 2)
    assert fake.called == ["encode", "encode"]  # never __call__
    assert pickle.loads(pickle.dumps(Tokenize(fake, max_length=5))).kind == "encode"


def test_tokenizer_kinds_and_bad_arguments() -> None:
    assert tokenizer_kind(word_level()) == "tokenizers"
    assert tokenizer_kind(Counting()) == "callable"
    with pytest.raises(TypeError, match="got the str 'bert-base-uncased'.*Tokenizer.from_pretrained"):
        Tokenize("bert-base-uncased", max_length=4)
    with pytest.raises(TypeError, match="got int"):
        Tokenize(3, max_length=4)
    for kwargs, message in [({"max_length": 0}, "max_length must be an int >= 1, got 0"),
                            ({"max_length": 4, "truncation": "left"}, "truncation must be one of \\('right',\\)"),
                            ({"max_length": 4, "pad_id": True}, "pad_id must be an int that fits int64, got True"),
                            ({"max_length": 4, "cache_size": -1}, "cache_size must be an int >= 0, got -1")]:
        with pytest.raises(ValueError, match=message):
            Tokenize(Counting(), **kwargs)


def test_missing_or_wrong_text_field_is_named() -> None:
    t = Tokenize(Counting(), max_length=4)
    with pytest.raises(ValueError, match=r"sample 'ep_0/3' has no field 'task'; its fields: \['actions', "
                                         r"'instruction'\]\. Pass the text field's name: Tokenize\(tokenizer, "
                                         r"field=NAME"):
        t({"__key__": "ep_0/3", "instruction": "x", "actions": np.zeros(2)})
    with pytest.raises(ValueError, match=r"the batch has no field 'task'; its fields: \['prompt'\]"):
        t.batch({"prompt": ["x"], "__key__": ["k"]})
    with pytest.raises(TypeError, match=r"sample 'k': field 'task' must be text \(str or UTF-8 bytes\), got ndarray"):
        t({"__key__": "k", "task": np.zeros(2)})
    with pytest.raises(ValueError, match=r"sample 'k': field 'task' is not UTF-8 text"):
        t({"__key__": "k", "task": b"\xff\xfe"})
    with pytest.raises(TypeError, match=r"the batch's 'task' must be a list of texts .* got str"):
        t.batch({"task": "one text"})


def test_batch_gives_b_by_l_tensors_and_samples_collate_to_the_same() -> None:
    t = Tokenize(word_level(), max_length=5, pad_id=3)
    texts = ["pick up the cube", "the red bowl and it", "place it in the red bowl now", "up"]
    samples = [t({"__key__": str(i), "task": text}) for i, text in enumerate(texts)]
    hand = [padded(word_level().encode(text).ids, 5, 3) for text in texts]
    want_ids = torch.tensor([ids for ids, _ in hand], dtype=torch.int64)  # [B, L]
    want_mask = torch.tensor([mask for _, mask in hand], dtype=torch.bool)  # [B, L]
    for collated in (collate(samples), Collate()(samples), Collate(pad="max_len", max_len=9)(samples)):
        assert collated["task"] == texts
        assert collated["task_tokens"].dtype == torch.int64 and collated["task_tokens_mask"].dtype == torch.bool
        assert torch.equal(collated["task_tokens"], want_ids) and torch.equal(collated["task_tokens_mask"], want_mask)
        assert "task_tokens_pad_mask" not in collated  # one length: stacked, never padded
        out = t.batch({"__key__": collated["__key__"], "task": collated["task"]})
        assert out["task_tokens"].device.type == "cpu"
        assert torch.equal(out["task_tokens"], want_ids) and torch.equal(out["task_tokens_mask"], want_mask)
    on_meta = t.batch({"task": texts}, device="meta")
    assert on_meta["task_tokens"].device.type == "meta" and on_meta["task_tokens"].shape == (4, 5)


def test_import_costs_nothing() -> None:
    """Importing the module (and using it on samples) loads neither torch nor tokenizers."""
    code = ("import sys; from robowds.reader.transforms import Tokenize; "
            "s = Tokenize(lambda t: [len(t)], max_length=2)({'task': 'abc'}); "
            "assert s['task_tokens'].tolist() == [3, 0] and s['task_tokens_mask'].tolist() == [True, False]; "
            "print(sorted(m for m in ('torch', 'tokenizers', 'transformers') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


@pytest.fixture(scope="module")
def export(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """4 synthetic episodes (4 distinct task texts), stride 10, no camera or imu: 39 windows, 2 shards."""
    root = tmp_path_factory.mktemp("tokenize")
    write_synthetic_store(root / "store", episodes=4, seed=0)
    assert main(["export", str(root / "store"), str(root / "out"), "--quiet", "--workers", "1", "--stride", "10",
                 "--set", "shard.min_shards=2", "--set", "exclude=[overview, imu]"]) == 0
    return root / "out"


def test_shard_dataset_through_spawned_workers(export: Path) -> None:
    """`ShardDataset(transform=Tokenize(...))` read by 2 spawned workers: each batch's `[B, L]` tokens
    are the hand tokenisation of its texts, and every window is read once."""
    vocab = {"[PAD]": 0, "[UNK]": 1}
    for word in sorted({w for task in TASKS for w in task.split()} - {"cube", "drawer"}):  # two left unknown
        vocab[word] = len(vocab)
    tok = word_level(vocab)
    ds = ShardDataset(export, "train", seed=1, transform=Tokenize(tok, max_length=8))
    loader = ShardLoader(ds, batch_size=8, num_workers=2, multiprocessing_context="spawn")
    keys = []
    for batch in loader:
        hand = [padded(tok.encode(text).ids, 8) for text in batch["task"]]
        assert batch["task_tokens"].dtype == torch.int64 and batch["task_tokens"].shape == (len(hand), 8)
        assert batch["task_tokens"].tolist() == [ids for ids, _ in hand]
        assert batch["task_tokens_mask"].tolist() == [mask for _, mask in hand]
        keys += batch["__key__"]
    assert len(keys) == len(set(keys)) == 39
