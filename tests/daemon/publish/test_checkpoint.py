"""CheckpointStore: lossless round trip, previous copy kept, corrupt latest falls back."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from coeffd.daemon.learning.checkpoints import (
    CheckpointError,
    CheckpointStore,
    decode_state,
    encode_state,
)


def _state(scale: float = 1.0) -> dict[str, Any]:
    rng = np.random.default_rng(7)
    return {
        "version": 3,
        "configs": {
            "llama8b-h100-tp1": {
                "P": rng.normal(size=(11, 11)) * scale,  # information matrix
                "b": rng.normal(size=11).astype(np.float32),
                "mask": np.array([True, False, True]),
                "counts": np.arange(5, dtype=np.int64),
                "empty": np.zeros((0, 3)),
                "fortran": np.asfortranarray(rng.normal(size=(3, 4))),
                "lam": 0.999,
                "n": np.int64(2**40),
                "flag": np.bool_(True),
                "name": "rls",
                "raw": b"\x00\xff",
                "none": None,
            }
        },
        "big": 2**63 + 5,
        "nan": float("nan"),
    }


def _assert_same(a: Any, b: Any) -> None:
    if isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape
        assert a.tobytes() == np.ascontiguousarray(b).tobytes() or np.array_equal(a, b)
        assert np.array_equal(a, b)
    elif isinstance(a, np.generic):
        assert type(a) is type(b) and a == b
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _assert_same(a[k], b[k])
    elif isinstance(a, float) and a != a:
        assert b != b
    else:
        assert a == b and type(a) is type(b)


def test_round_trip_identical(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    assert store.restore() is None
    state = _state()
    store.save(state)
    restored = store.restore()
    assert restored is not None and not restored.fell_back
    _assert_same(state, restored.state)
    # Bit-exact floats (no text round trip).
    assert (
        restored.state["configs"]["llama8b-h100-tp1"]["P"].tobytes()
        == state["configs"]["llama8b-h100-tp1"]["P"].tobytes()
    )
    assert store.age_seconds() is not None


@pytest.mark.parametrize(
    "damage",
    [
        lambda b: b[: len(b) // 2],  # truncated
        lambda b: b[:-1] + bytes([b[-1] ^ 0x01]),  # one flipped bit
        lambda b: b"",  # empty
        lambda b: b"garbage" * 10,  # not a checkpoint
    ],
    ids=["truncated", "bitflip", "empty", "garbage"],
)
def test_corrupt_latest_falls_back_to_previous(tmp_path: Path, damage: Any) -> None:
    store = CheckpointStore(tmp_path)
    store.save(_state(1.0))
    store.save(_state(2.0))
    assert store.previous_path.exists()
    store.latest_path.write_bytes(damage(store.latest_path.read_bytes()))
    restored = store.restore()
    assert restored is not None and restored.fell_back
    assert restored.path == str(store.previous_path)
    _assert_same(_state(1.0), restored.state)
    # The next save must not rotate the corrupt file into "previous".
    store.save(_state(3.0))
    store.latest_path.write_bytes(b"")
    restored = store.restore()
    assert restored is not None
    _assert_same(_state(1.0), restored.state)


def test_latest_missing_uses_previous(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    store.save({"a": 1})
    store.save({"a": 2})
    store.latest_path.unlink()  # crash between rotate and write
    restored = store.restore()
    assert restored is not None and restored.state == {"a": 1} and restored.fell_back


def test_both_corrupt_gives_none(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    store.save({"a": 1})
    store.save({"a": 2})
    store.latest_path.write_bytes(b"x")
    store.previous_path.write_bytes(b"y")
    assert store.restore() is None and store.load() is None


def test_unsupported_type_raises_before_writing(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    store.save({"a": 1})
    with pytest.raises(TypeError):
        store.save({"a": object()})
    with pytest.raises(TypeError):
        store.save({"a": np.array([object()])})
    assert store.load() == {"a": 1}


def test_decode_state_errors() -> None:
    data = encode_state([1, 2, 3])
    assert decode_state(data) == [1, 2, 3]
    with pytest.raises(CheckpointError, match="truncated"):
        decode_state(data + b"extra")


def test_latest_is_never_missing_while_a_new_one_is_saved(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kill -9 at any instant of ``save`` must find a good latest checkpoint on the next
    start (not fall back to the previous one): at every file operation of the save, the
    latest is there and decodes, and afterwards previous holds the one it replaced."""
    import coeffd.daemon.learning.checkpoints as ckmod

    store = CheckpointStore(tmp_path)
    store.save({"gen": 1})
    seen: list[Any] = []
    real = ckmod.atomic_write_bytes

    def watching(path: Any, data: bytes, **kw: Any) -> Path:
        seen.append(decode_state(store.latest_path.read_bytes())["gen"])
        out = real(path, data, **kw)
        seen.append(decode_state(store.latest_path.read_bytes())["gen"])
        return out

    monkeypatch.setattr(ckmod, "atomic_write_bytes", watching)
    store.save({"gen": 2})
    assert seen == [1, 1, 1, 2]  # previous copied (latest untouched), then latest replaced
    restored = store.restore()
    assert restored is not None and restored.state["gen"] == 2 and not restored.fell_back
    assert decode_state(store.previous_path.read_bytes())["gen"] == 1
