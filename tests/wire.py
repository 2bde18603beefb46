"""The verifier protocol's wire as plain maps, unchecked: how a test builds a message by hand (a
malformed one too) and reads what came back. The engine, the server and the fleet speak only the
schema's types (specdec/remote/protocol.py)."""
from __future__ import annotations

import msgpack


def encode(kind: str, **fields) -> bytes:
    """A msgpack map {"type": kind, **fields}: any fields, any types."""
    return msgpack.packb({"type": kind, **fields}, use_bin_type=True)


def decode(data: bytes) -> dict:
    """A frame as the map it carries (a reply of the server or a request of the client)."""
    return msgpack.unpackb(data, raw=False, strict_map_key=True)
