"""Torch reference of the canary hash primitives (docs/architecture.md, "Canary rows, hash and reasons").

All arithmetic is uint64 with wrap-around, carried in int64 tensors: multiplication and
addition wrap identically in two's complement, and right shifts are made logical by masking.
The pure-Python ``*_int`` twins are the executable spec the tests hold both against.
"""

from __future__ import annotations

import torch

U64 = (1 << 64) - 1
MIX_C1 = 0xBF58476D1CE4E5B9
MIX_C2 = 0x94D049BB133111EB
KEY_SALT_A = 0x9E3779B97F4A7C15
KEY_SALT_B = 0xD1B54A32D192ED03
GOLDEN = 0x9E3779B97F4A7C15
CHAIN_SEED = 0x243F6A8885A308D3


def as_signed(value: int) -> int:
    """The int64 with the same bits as the uint64 ``value``."""
    value &= U64
    return value - (1 << 64) if value >> 63 else value


# ---------------------------------------------------------------- pure-Python spec


def mix64_int(z: int) -> int:
    z &= U64
    z ^= z >> 30
    z = (z * MIX_C1) & U64
    z ^= z >> 27
    z = (z * MIX_C2) & U64
    z ^= z >> 31
    return z


def key_int(token: int, position: int) -> int:
    return ((token & 0xFFFFFFFF) | (position << 32)) & U64


def affine_int(token: int, position: int) -> tuple[int, int]:
    key = key_int(token, position)
    return mix64_int(key ^ KEY_SALT_A) | 1, mix64_int(key ^ KEY_SALT_B)


def chain_int(tokens: list[int], start_position: int = 0, state: int = CHAIN_SEED) -> list[int]:
    """Links S_p for p = start .. start + len(tokens), the serial definition of the chain."""
    links = [state]
    for i, token in enumerate(tokens):
        a, b = affine_int(token, start_position + i)
        state = (a * state + b) & U64
        links.append(state)
    return links


def fingerprint_int(words: list[int]) -> int:
    total = 0
    for i, word in enumerate(words):
        total = (total + mix64_int(word + (i + 1) * GOLDEN)) & U64
    return mix64_int(total) | 1


# ---------------------------------------------------------------- torch (int64 carrying uint64 bits)


def _srl(z: torch.Tensor, shift: int) -> torch.Tensor:
    return (z >> shift) & ((1 << (64 - shift)) - 1)


def mix64(z: torch.Tensor) -> torch.Tensor:
    z = z ^ _srl(z, 30)
    z = z * as_signed(MIX_C1)
    z = z ^ _srl(z, 27)
    z = z * as_signed(MIX_C2)
    return z ^ _srl(z, 31)


def chain_key(tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    return (tokens.long() & 0xFFFFFFFF) | (positions.long() << 32)


def affine(tokens: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The map S -> a*S + b that position ``positions`` holding ``tokens`` applies to the chain."""
    key = chain_key(tokens, positions)
    return mix64(key ^ as_signed(KEY_SALT_A)) | 1, mix64(key ^ as_signed(KEY_SALT_B))


def next_link(tokens: torch.Tensor, positions: torch.Tensor, links: torch.Tensor) -> torch.Tensor:
    """S_{p+1} from the row (token, position, link=S_p) of position p."""
    a, b = affine(tokens, positions)
    return a * links + b


def affine_inclusive_scan(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Prefix compositions along the last dim: element i maps S to (map_i o ... o map_0)(S).

    Hillis-Steele in log2(n) steps: composing (a1, b1) then (a2, b2) gives (a2*a1, a2*b1 + b2).
    """
    a, b = a.clone(), b.clone()
    n = a.shape[-1]
    step = 1
    while step < n:
        a_new = a[..., step:] * a[..., :-step]
        b_new = a[..., step:] * b[..., :-step] + b[..., step:]
        a = torch.cat([a[..., :step], a_new], dim=-1)
        b = torch.cat([b[..., :step], b_new], dim=-1)
        step *= 2
    return a, b


def fingerprint(words: torch.Tensor) -> torch.Tensor:
    """Fingerprint of each row of int64 ``words`` [n, w]; never 0 (0 means 'not fingerprinted')."""
    index = torch.arange(1, words.shape[-1] + 1, dtype=torch.int64, device=words.device)
    salts = index * as_signed(GOLDEN)
    return mix64(mix64(words + salts).sum(dim=-1)) | 1
