"""TFRecord files and `tf.train.Example` records, read without TensorFlow.

Framing (TensorFlow's `record_writer.cc`), per record: `uint64 length` (little-endian), `uint32 masked
crc32c(length bytes)`, `length` payload bytes, `uint32 masked crc32c(payload)`. Both checksums are
checked: the `tfrecord` package skips them, and a flipped bit in a float would otherwise become a wrong
value in the store without a word.

CRC32C: `google-crc32c` (Apache-2.0; Google's C library with SSE4.2/ARM hardware paths, ~1.2 GB/s on this
machine, imports in ~0.1 s). `crc32c` (ICRAR) is LGPL, was slower here (0.8 GB/s) and imports in ~1 s
per worker; a numpy CRC has no vector form and runs byte by byte.

Payloads are parsed with protobuf (upb, in C: ~0.5 ms for a 140 KB Bridge episode) from a
`tf.train.Example` descriptor built here in a private pool: TensorFlow's `example.proto` is small and
frozen, and owning it avoids a dependency on the `tfrecord` package (whose `__init__` imports torch) or
on TensorFlow. A hand-written decoder was not worth it: parsing is ~1% of an episode's conversion
(muxing its camera files is the rest).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from robowds.export.errors import UserError

HEADER = struct.Struct("<QI")  # length, masked crc32c of the 8 length bytes
FOOTER = struct.Struct("<I")  # masked crc32c of the payload
MASK_DELTA = 0xA282EAD8  # TensorFlow's crc32c mask constant (crc32c.h)
INSTALL_HINT = "pip install 'robowds[convert]' (or: pip install protobuf google-crc32c)"


@dataclass(frozen=True)
class RecordRef:
    """Where one record lies in its file (found by reading the 12-byte headers only)."""

    index: int  # 0-based record number in the file
    offset: int  # byte offset of its header
    length: int  # payload bytes


def _crc32c(data: bytes) -> int:
    try:
        import google_crc32c
    except ImportError as exc:
        raise UserError("reading TFRecords needs the google-crc32c package", hint=INSTALL_HINT) from exc
    return int(google_crc32c.value(data))


def masked_crc(data: bytes) -> int:
    """TensorFlow's masked CRC32C: rotate right by 15 bits, add a constant (mod 2^32). The mask keeps a
    CRC of data that itself holds CRCs from being trivially related to them."""
    crc = _crc32c(data)
    return (((crc >> 15) | (crc << 17)) + MASK_DELTA) & 0xFFFFFFFF


def frame_record(payload: bytes) -> bytes:
    """One record as TensorFlow writes it (tests write TFRecords with this)."""
    length = struct.pack("<Q", len(payload))
    return length + struct.pack("<I", masked_crc(length)) + payload + FOOTER.pack(masked_crc(payload))


def scan_records(path: Path) -> tuple[list[RecordRef], str | None]:
    """The records of a TFRecord file from their headers (the payloads are skipped: planning a large
    dataset reads 16 bytes per episode), and the problem that ended the scan early, if any (a header
    CRC mismatch or a file cut short: nothing after it can be located)."""
    refs: list[RecordRef] = []
    size = path.stat().st_size
    with open(path, "rb") as f:
        offset = 0
        while offset < size:
            header = f.read(HEADER.size)
            if len(header) < HEADER.size:
                return refs, f"record {len(refs)} (byte {offset}): the file ends inside the record's header"
            length, crc = HEADER.unpack(header)
            if masked_crc(header[:8]) != crc:
                return refs, (f"record {len(refs)} (byte {offset}): the length's CRC does not match "
                              "(not a TFRecord file, or corrupt)")
            end = offset + HEADER.size + length + FOOTER.size
            if end > size:
                return refs, (f"record {len(refs)} (byte {offset}): the file ends {end - size} bytes before "
                              "the record does (a truncated download?)")
            refs.append(RecordRef(len(refs), offset, length))
            offset = end
            f.seek(offset)
    return refs, None


def read_record(path: Path, ref: RecordRef) -> bytes:
    """The payload of one record, both CRCs checked; a mismatch is a UserError naming file and record."""
    where = f"{path}: record {ref.index} (byte {ref.offset})"
    hint = "download this TFRecord file again, or pass --skip-bad to convert the other records"
    try:
        with open(path, "rb") as f:
            f.seek(ref.offset)
            blob = f.read(HEADER.size + ref.length + FOOTER.size)
    except OSError as exc:
        raise UserError(f"{where}: cannot read it: {exc}", hint=hint) from exc
    if len(blob) < HEADER.size + ref.length + FOOTER.size:
        raise UserError(f"{where}: the file ends before the record does", hint=hint)
    length, crc = HEADER.unpack_from(blob)
    if length != ref.length or masked_crc(blob[:8]) != crc:
        raise UserError(f"{where}: the length's CRC does not match (the file changed or is corrupt)", hint=hint)
    payload = blob[HEADER.size:HEADER.size + length]
    (data_crc,) = FOOTER.unpack_from(blob, HEADER.size + length)
    if masked_crc(payload) != data_crc:
        raise UserError(f"{where}: the data CRC does not match: the record is corrupt", hint=hint)
    return payload


@lru_cache(maxsize=1)
def example_class() -> Any:
    """The `tf.train.Example` message class (TensorFlow's `example.proto` and `feature.proto`), built
    in a private descriptor pool so it never clashes with another copy of the same proto."""
    try:
        from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
    except ImportError as exc:
        raise UserError("reading tf.train.Example records needs the protobuf package", hint=INSTALL_HINT) from exc
    fdp = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(name="robowds/tf_example.proto", package="tensorflow", syntax="proto3")

    def message(name: str, fields: list[tuple[str, int, int, int, str]], parent: Any = None) -> Any:
        msg = (parent.nested_type if parent is not None else proto.message_type).add(name=name)
        for field_name, number, typ, label, type_name in fields:
            field = msg.field.add(name=field_name, number=number, type=typ, label=label)
            if type_name:
                field.type_name = type_name
        return msg

    rep, opt = fdp.LABEL_REPEATED, fdp.LABEL_OPTIONAL
    message("BytesList", [("value", 1, fdp.TYPE_BYTES, rep, "")])
    message("FloatList", [("value", 1, fdp.TYPE_FLOAT, rep, "")])
    message("Int64List", [("value", 1, fdp.TYPE_INT64, rep, "")])
    feature = message("Feature", [("bytes_list", 1, fdp.TYPE_MESSAGE, opt, ".tensorflow.BytesList"),
                                  ("float_list", 2, fdp.TYPE_MESSAGE, opt, ".tensorflow.FloatList"),
                                  ("int64_list", 3, fdp.TYPE_MESSAGE, opt, ".tensorflow.Int64List")])
    feature.oneof_decl.add(name="kind")
    for f in feature.field:
        f.oneof_index = 0
    features = message("Features", [("feature", 1, fdp.TYPE_MESSAGE, rep, ".tensorflow.Features.FeatureEntry")])
    entry = message("FeatureEntry", [("key", 1, fdp.TYPE_STRING, opt, ""),
                                     ("value", 2, fdp.TYPE_MESSAGE, opt, ".tensorflow.Feature")], parent=features)
    entry.options.map_entry = True
    message("Example", [("features", 1, fdp.TYPE_MESSAGE, opt, ".tensorflow.Features")])
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("tensorflow.Example"))



def parse_example(payload: bytes, where: str) -> dict[str, np.ndarray | list[bytes]]:
    """A serialized `tf.train.Example` -> key -> its flat values: float_list as float32 [K], int64_list as
    int64 [K], bytes_list as a list of K bytes (a feature with no list set reads as an empty list)."""
    from google.protobuf.message import DecodeError

    example = example_class()()
    try:
        example.ParseFromString(payload)
    except DecodeError as exc:
        raise UserError(f"{where}: not a tf.train.Example ({exc})",
                        hint="this converter reads TFDS/RLDS TFRecords; pass --skip-bad to skip the record") from exc
    out: dict[str, np.ndarray | list[bytes]] = {}
    for key, feature in example.features.feature.items():
        kind = feature.WhichOneof("kind")
        if kind == "float_list":
            out[key] = np.array(feature.float_list.value, dtype=np.float32)  # [K]
        elif kind == "int64_list":
            out[key] = np.array(feature.int64_list.value, dtype=np.int64)  # [K]
        elif kind == "bytes_list":
            out[key] = list(feature.bytes_list.value)
        else:
            out[key] = []
    return out
