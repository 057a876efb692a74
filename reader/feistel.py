"""Keyed bijections of [0, size) computed per index: the sample-level shuffle of the epoch plan.

Why not `rng.permutation(size)`: the plan must give the sample at any position without building the
whole order (100M positions would be 800 MB per DataLoader worker). A keyed permutation evaluated per
index needs no memory beyond its input: index j maps to `permute(j, size, key)`, and the same key maps
[0, size) onto itself exactly once.

The construction is the one Grain's `index_shuffle` uses: a balanced Feistel network over the smallest
even number of bits 2h with 4**h >= size, made a permutation of [0, size) by cycle walking (a value
that lands at or past `size` is encrypted again until it lands inside; this terminates because the
walk follows the cycle of a permutation through the start value, and takes fewer than 4 steps on
average since size > 4**h / 4). Each round maps (L, R) -> (R, L xor F(R, k_i)) with F = splitmix64's
finaliser of R xor k_i, cut to h bits; a Feistel round is a bijection whatever F is, so the network is
one too. `ROUNDS` = 8 rounds: Luby-Rackoff needs 4 with random round functions, the extra rounds
cover the small half widths (h = 6 for a block of 4096). Round keys are per element (`schedule`
turns one key per block into its round keys, once per block), so one call permutes many blocks,
each under its own key.

Pure numpy on uint64 arrays (wrapping arithmetic); every function is vectorised over its input [P].
"""

from __future__ import annotations

import numpy as np

ROUNDS = 8
_GOLDEN_INT = 0x9E3779B97F4A7C15  # 2**64 / golden ratio: spreads consecutive integers apart
_GOLDEN = np.uint64(_GOLDEN_INT)
_MASK64 = 2**64 - 1
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a bijection of uint64 in which every input bit flips about half of the
    output bits. [P] uint64 -> [P] uint64."""
    x = x ^ (x >> np.uint64(30))
    x = x * _M1
    x = x ^ (x >> np.uint64(27))
    x = x * _M2
    return x ^ (x >> np.uint64(31))


def derive_keys(base: int, labels: np.ndarray) -> np.ndarray:
    """One 64-bit key per label (e.g. a block number), distinct for distinct labels under one base:
    mix64 is a bijection and label * golden + base is one for labels below 2**64. [P] -> [P] uint64."""
    return mix64(labels.astype(np.uint64) * _GOLDEN + np.uint64(base & _MASK64))


def half_bits(size: int) -> int:
    """h, the half width: the smallest h with 4**h >= size (at least 0)."""
    return (max(size - 1, 0).bit_length() + 1) // 2


def schedule(keys: np.ndarray, rounds: int = ROUNDS) -> np.ndarray:
    """The round keys of each key: [K] uint64 -> [rounds, K] uint64."""
    salts = np.asarray([(r + 1) * _GOLDEN_INT & _MASK64 for r in range(rounds)], dtype=np.uint64)  # [rounds]
    return mix64(keys[None, :] ^ salts[:, None])


def _encrypt(x: np.ndarray, h: int, round_keys: np.ndarray) -> np.ndarray:
    """The Feistel network on 2h-bit values x [P] uint64 under per-element round keys [rounds, P]."""
    shift, mask = np.uint64(h), np.uint64((1 << h) - 1)
    left, right = x >> shift, x & mask  # [P], [P]
    for key in round_keys:
        left, right = right, left ^ (mix64(right ^ key) & mask)
    return (left << shift) | right


def permute(index: np.ndarray, size: int, round_keys: np.ndarray) -> np.ndarray:
    """The keyed permutation of [0, size) at `index` [P] (each in [0, size)), element i under the
    round keys `round_keys[:, i]` ([rounds, P] uint64, from `schedule`): [P] int64. For one key k,
    `permute(arange(size), size, schedule(k)[:, zeros(size)])` is a permutation of range(size)."""
    index = np.asarray(index, dtype=np.int64)
    if size <= 1 or not len(index):
        return index.copy()
    h = half_bits(size)
    out = _encrypt(index.astype(np.uint64), h, round_keys)  # [P] in [0, 4**h)
    outside = np.flatnonzero(out >= np.uint64(size))  # cycle walking: at most a few passes
    while len(outside):
        out[outside] = _encrypt(out[outside], h, round_keys[:, outside])
        outside = outside[out[outside] >= np.uint64(size)]
    return out.astype(np.int64)
