"""Reading and writing the frame payload as exactly one Arrow IPC stream.

Reading refuses IPC *body compression* (LZ4/ZSTD buffers inside record batches): the
frame's own zstd flag is where compression lives, and `payload_raw_len` only bounds
memory if nothing inside the stream can expand again. Detecting it needs one field of
the message metadata, so a minimal FlatBuffers walk lives here.

Reading also refuses a stream of more than `MAX_PAYLOAD_MESSAGES` messages (the schema,
record batches, dictionary batches). §1 allows "one or more record batches" without a
number; each message costs the reader a few KB and tens of microseconds however small
it is, so without a cap a 64 MiB payload of empty batches would cost a reader gigabytes
and a minute, not a small multiple of `payload_raw_len`. Writers put one batch per chunk
of rows (`encode_frame` writes one), so the cap only refuses hostile streams.
"""

from __future__ import annotations

import struct
from typing import Any

import pyarrow as pa

from protocol._frame_error import FrameError

# Arrow Message.fbs: Message{version=0, header_type=1, header=2, bodyLength=3, ...},
# MessageHeader union: DictionaryBatch=2, RecordBatch=3;
# DictionaryBatch{id=0, data=1, isDelta=2}; RecordBatch{length=0, nodes=1, buffers=2,
# compression=3, variadicBufferCounts=4}.
_MESSAGE_HEADER_TYPE = 1
_MESSAGE_HEADER = 2
_HEADER_DICTIONARY_BATCH = 2
_HEADER_RECORD_BATCH = 3
_DICTIONARY_BATCH_DATA = 1
_RECORD_BATCH_COMPRESSION = 3

MAX_PAYLOAD_MESSAGES = 1024


def _fb_field(buf: memoryview, table: int, index: int) -> int | None:
    """Absolute position of field `index` of the FlatBuffers table at `table`, or None."""
    vtable = table - struct.unpack_from("<i", buf, table)[0]
    (vtable_size,) = struct.unpack_from("<H", buf, vtable)
    slot = 4 + 2 * index
    if slot + 2 > vtable_size:
        return None
    (offset,) = struct.unpack_from("<H", buf, vtable + slot)
    return table + offset if offset else None


def _fb_deref(buf: memoryview, position: int) -> int:
    """Follow the uoffset stored at `position` (tables, vectors, union values)."""
    return position + int(struct.unpack_from("<I", buf, position)[0])


def _has_body_compression(metadata: Any) -> bool:
    """True if a record-batch or dictionary message declares compressed buffers.

    `metadata` is the message's FlatBuffer, already verified by Arrow's reader; any
    out-of-bounds access still raises struct.error (turned into FrameError upstream).
    """
    buf = memoryview(metadata)
    root = _fb_deref(buf, 0)
    type_at = _fb_field(buf, root, _MESSAGE_HEADER_TYPE)
    header_at = _fb_field(buf, root, _MESSAGE_HEADER)
    if type_at is None or header_at is None:
        return False
    header_type = buf[type_at]
    if header_type not in (_HEADER_DICTIONARY_BATCH, _HEADER_RECORD_BATCH):
        return False
    batch = _fb_deref(buf, header_at)
    if header_type == _HEADER_DICTIONARY_BATCH:
        data_at = _fb_field(buf, batch, _DICTIONARY_BATCH_DATA)
        if data_at is None:
            return False
        batch = _fb_deref(buf, data_at)
    return _fb_field(buf, batch, _RECORD_BATCH_COMPRESSION) is not None


def read_ipc_stream(raw: Any) -> pa.Table:
    """Decode `raw` (bytes-like) as exactly one Arrow IPC stream, nothing after it.

    Two passes: the first walks message metadata only (bodies are zero-copy slices) and
    refuses body compression and streams of more than `MAX_PAYLOAD_MESSAGES` messages
    before anything is decoded; the second decodes.
    Arrow's own exceptions propagate; callers convert them to FrameError.
    """
    buf = pa.py_buffer(raw)
    for index, message in enumerate(pa.ipc.MessageReader.open_stream(pa.BufferReader(buf))):
        if index == MAX_PAYLOAD_MESSAGES:
            raise FrameError(
                f"payload: Arrow IPC stream has more than {MAX_PAYLOAD_MESSAGES} messages "
                "(write record batches of many rows)"
            )
        if _has_body_compression(message.metadata):
            raise FrameError(
                f"payload: Arrow IPC message {index} ({message.type}) uses body compression, "
                "which v1 refuses (compress the whole payload with frame flag 0x01)"
            )
    source = pa.BufferReader(buf)
    # read_all builds the table in C++: no Python object per record batch.
    table = pa.ipc.open_stream(source).read_all()
    consumed = source.tell()
    if consumed != buf.size:
        raise FrameError(
            f"payload: {buf.size - consumed} bytes after the end of the Arrow IPC stream "
            f"(stream ends at byte {consumed} of {buf.size})"
        )
    return table


def write_ipc_stream(table: pa.Table) -> bytes:
    """Serialize `table` as one Arrow IPC stream (one record batch per chunk, then EOS)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue().to_pybytes())
