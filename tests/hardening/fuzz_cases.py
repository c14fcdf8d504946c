"""Seeded fuzz cases for the wire messages: valid messages with a few fields set to hostile
values (walked generically over the protobuf descriptors, so new fields are fuzzed too), and
sometimes the serialized bytes corrupted. Pure functions of the seed."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

from google.protobuf.descriptor import FieldDescriptor

__all__ = ["mutated", "cases"]

_UINTS = [0, 1, 2, 3, 15, 16, 17, 47, 48, 64, 421, 422, 423, 1000, 65536, 65537, (1 << 24) + 1,
          (1 << 31) - 1, 1 << 31, (1 << 32) - 1, 1 << 32, 1 << 40, 1 << 53, (1 << 63) - 1, 1 << 63, (1 << 64) - 1]
_STRINGS = ["", "small", "nope", "image", "label", "index", "x", "name", "lz4", "zstd", "snappy", "skip", "raise",
            "decode", "resize", "random_resized_crop", "imagenet_train", "center_crop", "hflip", "\x00", "é" * 3,
            "../../etc/passwd", "/tmp/x.arrow", "s" * 300, "y" * 20_000, "77bc95a5f8811b765154",
            '{"size": 1e308}', '{"size": -1}', "[]", '{"size": [1, 2]}', "{", "null"]
_FLOATS = [0.0, 0.5, 1.0, -1.0, 1.5, 1e308, float("inf"), float("-inf"), float("nan")]


def _limit(field: FieldDescriptor) -> int:
    return (1 << 32) - 1 if field.type in (FieldDescriptor.TYPE_UINT32,) else (1 << 64) - 1


def _scalar(rng: random.Random, field: FieldDescriptor) -> Any:
    t = field.type
    if t == FieldDescriptor.TYPE_BOOL:
        return rng.random() < 0.5
    if t == FieldDescriptor.TYPE_STRING:
        return rng.choice(_STRINGS) if rng.random() < 0.85 else "".join(chr(rng.randrange(1, 0x2FF)) for _ in range(8))
    if t in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return rng.choice(_FLOATS) if rng.random() < 0.7 else rng.uniform(-10, 10)
    top = _limit(field)
    if rng.random() < 0.7:
        value = min(rng.choice(_UINTS), top)
    else:
        value = rng.getrandbits(rng.choice([4, 8, 16, 32, 64])) & top
    if t in (FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_SINT64, FieldDescriptor.TYPE_SFIXED64):
        return value - (1 << 64) if value >= 1 << 63 else value  # signed: the same bits, negatives too
    return value


def _mutate_one(rng: random.Random, msg: Any, depth: int = 0) -> None:
    field = rng.choice(msg.DESCRIPTOR.fields)
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        if field.is_repeated:
            container = getattr(msg, field.name)
            if rng.random() < 0.3:
                del container[:]
            for _ in range(rng.choice([1, 1, 2, 40])):
                item = container.add()
                for _ in range(rng.randint(1, 3)):
                    _mutate_one(rng, item, depth + 1)
        elif rng.random() < 0.2:
            msg.ClearField(field.name)
        elif depth < 3:
            _mutate_one(rng, getattr(msg, field.name), depth + 1)
        return
    if field.is_repeated:
        container = getattr(msg, field.name)
        del container[:]
        container.extend(_scalar(rng, field) for _ in range(rng.choice([0, 1, 2, 3, 300])))
        return
    setattr(msg, field.name, _scalar(rng, field))


def mutated(rng: random.Random, base: Any) -> bytes:
    """``base`` with 1-3 fields set to hostile values; sometimes its bytes corrupted."""
    msg = type(base)()
    msg.CopyFrom(base)
    for _ in range(rng.choice([1, 1, 2, 3])):
        _mutate_one(rng, msg)
    data = bytearray(msg.SerializeToString())
    roll = rng.random()
    if roll < 0.05 and data:
        data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)  # a flipped bit
    elif roll < 0.08:
        del data[rng.randrange(len(data) + 1):]  # truncated
    elif roll < 0.10:
        data = bytearray(rng.getrandbits(8) for _ in range(rng.randrange(64)))  # garbage
    return bytes(data)


def cases(seed: int, bases: list[Any], n: int) -> Iterator[bytes]:
    """``n`` mutated messages, each from a base chosen in turn."""
    rng = random.Random(seed)
    for i in range(n):
        yield mutated(rng, bases[i % len(bases)])
