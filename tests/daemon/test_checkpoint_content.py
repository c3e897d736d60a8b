"""A checkpoint whose checksum holds but whose content is unexpected never crashes start-up
(issue 17.6): the previous checkpoint is tried, then a fresh start, with one error line and
``coeffd_checkpoint_unusable_total{file,reason}``. Also fuzzed (hypothesis, bounded).

Before: ``42`` as the state raised ``AttributeError`` in the consumer, a set without its
priors a ``TypeError`` in the registry — on every start, a restart loop.
"""

from __future__ import annotations

import copy
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import structlog
from daemon_support import fleet_requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from coeffd.daemon.assemble import build_consumer
from coeffd.daemon.learning import LearningConsumer
from coeffd.daemon.learning.checkpoints import LATEST, PREVIOUS, encode_state
from coeffd.daemon.settings import load_settings
from coeffd.receivers.otlp.decode import Decoder


def _consumer(
    state_dir: Path, *, restore: bool = True
) -> tuple[LearningConsumer, CollectorRegistry]:
    s = load_settings(
        overrides={
            "publish": {"snapshot_dir": str(state_dir.parent / "snap")},
            "state": {"state_dir": str(state_dir), "restore": restore},
        },
        environ={},
    )
    registry = CollectorRegistry()
    consumer, _ = build_consumer(s, registry, live=False)
    return consumer, registry


@pytest.fixture(scope="module")
def good_state(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The state a real consumer checkpoints after learning simfleet's telemetry."""
    consumer, _ = _consumer(tmp_path_factory.mktemp("good") / "state", restore=False)
    decoder = Decoder()
    for req in fleet_requests("steady", 20):
        consumer.consume(decoder.decode_bytes(req.SerializeToString()).records)
    consumer.close()
    state = {
        "version": 1,
        "registry": consumer.registry.state_dict(),
        "configs": {cid: c.to_dict() for cid, c in consumer._configs.items()},
    }
    assert state["registry"]["sets"], "simfleet's run learned nothing"
    return state


def _write(directory: Path, latest: Any = None, previous: Any = None) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name, state in ((LATEST, latest), (PREVIOUS, previous)):
        if state is not None:
            (directory / name).write_bytes(encode_state(state))


def _unusable(registry: CollectorRegistry, file: str, reason: str) -> float:
    labels = {"file": file, "reason": reason}
    return registry.get_sample_value("coeffd_checkpoint_unusable_total", labels) or 0.0


def _one_set(state: dict[str, Any]) -> dict[str, Any]:
    return next(iter(state["registry"]["sets"].values()))  # type: ignore[no-any-return]


def _bad_states(good: dict[str, Any]) -> dict[str, Any]:
    no_priors = copy.deepcopy(good)
    del _one_set(no_priors)["beta_prior"]  # was: TypeError in the registry
    wrong_shape = copy.deepcopy(good)
    learner = next(iter(_one_set(wrong_shape)["learners"].values()))
    learner["a"] = np.zeros((2, 3))
    prior_none = copy.deepcopy(good)
    _one_set(prior_none)["beta_prior"] = None
    unknown_learner = copy.deepcopy(good)
    _one_set(unknown_learner)["learners"]["nope"] = {}
    # the α estimators' state (issue 15): not a map, an entry not a map, a bad field
    assert _one_set(good)["steady_alpha"], "the good state has α estimator state"
    steady_alpha_list = copy.deepcopy(good)
    _one_set(steady_alpha_list)["steady_alpha"] = [1]
    steady_alpha_entry = copy.deepcopy(good)
    _one_set(steady_alpha_entry)["steady_alpha"]["arrival_to_queued"] = "steady"
    steady_alpha_field = copy.deepcopy(good)
    _one_set(steady_alpha_field)["steady_alpha"]["arrival_to_queued"]["switches"] = "many"
    return {
        "int": 42,
        "list": [1, 2],  # was: AttributeError in daemon/learning.py
        "none": None,
        "registry_not_a_map": {"version": 1, "registry": 5},
        "sets_not_a_map": {"version": 1, "registry": {"sets": [1]}},
        "empty_set": {"version": 1, "registry": {"sets": {"x": {}}}},
        "configs_list": {"version": 1, "registry": {}, "configs": [1]},
        "no_priors": no_priors,
        "wrong_shape": wrong_shape,
        "prior_none": prior_none,
        "unknown_learner": unknown_learner,
        "steady_alpha_list": steady_alpha_list,
        "steady_alpha_entry": steady_alpha_entry,
        "steady_alpha_field": steady_alpha_field,
    }


@pytest.mark.parametrize(
    "case",
    ["int", "list", "registry_not_a_map", "sets_not_a_map", "empty_set", "configs_list",
     "no_priors", "wrong_shape", "prior_none", "unknown_learner", "steady_alpha_list",
     "steady_alpha_entry", "steady_alpha_field"],
)  # fmt: skip
def test_bad_latest_falls_back_to_previous(
    tmp_path: Path, good_state: dict[str, Any], case: str
) -> None:
    bad = _bad_states(good_state)[case]
    _write(tmp_path / "state", latest=bad if bad is not None else 0, previous=good_state)
    with structlog.testing.capture_logs() as logs:
        consumer, registry = _consumer(tmp_path / "state")
    errors = [e for e in logs if e["log_level"] == "error"]
    assert [e["event"] for e in errors] == ["checkpoint unusable; restored the previous one"]
    assert "latest: invalid_content" in errors[0]["problems"]
    assert consumer.restored
    assert _unusable(registry, "latest", "invalid_content") == 1
    assert set(consumer.registry._parked) == set(good_state["registry"]["sets"])
    for cid in good_state["registry"]["sets"]:  # the restored sets work
        assert consumer.registry.estimate(cid).observations > 0
    consumer.writer.close()


def test_both_bad_start_fresh(tmp_path: Path, good_state: dict[str, Any]) -> None:
    bad = _bad_states(good_state)
    _write(tmp_path / "state", latest=bad["no_priors"], previous=bad["list"])
    with structlog.testing.capture_logs() as logs:
        consumer, registry = _consumer(tmp_path / "state")
    errors = [e for e in logs if e["log_level"] == "error"]
    assert [e["event"] for e in errors] == ["no usable checkpoint; starting fresh"]
    assert not consumer.restored and len(consumer.registry._parked) == 0
    assert _unusable(registry, "latest", "invalid_content") == 1
    assert _unusable(registry, "previous", "invalid_content") == 1
    # and it learns from scratch
    decoder = Decoder()
    for req in fleet_requests("steady", 5):
        consumer.consume(decoder.decode_bytes(req.SerializeToString()).records)
    consumer.close()
    assert len(consumer.registry) == 1


def test_corrupt_and_garbage_extension_payloads(tmp_path: Path, good_state: dict[str, Any]) -> None:
    d = tmp_path / "state"
    _write(d, previous=good_state)
    data = bytearray(encode_state(good_state))
    data[-1] ^= 0xFF  # checksum no longer holds
    (d / LATEST).write_bytes(bytes(data))
    consumer, registry = _consumer(d)
    assert consumer.restored and _unusable(registry, "latest", "corrupt") == 1
    consumer.writer.close()
    # a numpy array of an object dtype, with a valid checksum
    import msgspec

    from coeffd.daemon.learning.checkpoints import _EXT_NDARRAY

    ext = msgspec.msgpack.Ext(_EXT_NDARRAY, msgspec.msgpack.encode(["|O", [1], b"12345678"]))
    state = {"version": 1, "registry": {"sets": {}, "beta_pool": ext}}
    (d / LATEST).write_bytes(encode_state(state))
    consumer, registry = _consumer(d)
    assert consumer.restored and _unusable(registry, "latest", "invalid_content") == 1
    consumer.writer.close()


# ------------------------------------------------------------------ fuzz (bounded)
_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    st.floats(allow_nan=True),
    st.text(max_size=8),
    st.binary(max_size=8),
)
_values = st.recursive(
    _leaf,
    lambda kids: (
        st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=6), kids, max_size=4)
    ),
    max_leaves=20,
)


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(node, list) and len(node) <= 12:
        for i, v in enumerate(node):
            out += _paths(v, (*prefix, i))
    return out


def _replace(state: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    out = copy.deepcopy(state)
    node = out
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return out


def _restores_cleanly(directory: Path, state: Any) -> None:
    (directory / LATEST).write_bytes(encode_state(state))
    consumer, registry = _consumer(directory)  # must not raise
    try:
        if consumer.restored:  # accepted: then every set it holds must work
            for cid in list(consumer.registry._parked):
                consumer.registry.estimate(cid)
        else:
            assert _unusable(registry, "latest", "invalid_content") == 1
    finally:
        consumer.writer.close()


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(value=_values)
def test_fuzz_arbitrary_content(tmp_path_factory: pytest.TempPathFactory, value: Any) -> None:
    _restores_cleanly(tmp_path_factory.mktemp("fuzz"), value)


@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
@given(seed=st.integers(0, 2**32 - 1), value=_values)
def test_fuzz_mutated_real_state(
    tmp_path_factory: pytest.TempPathFactory, good_state: dict[str, Any], seed: int, value: Any
) -> None:
    paths = _paths(good_state)
    path = random.Random(seed).choice(paths)
    _restores_cleanly(tmp_path_factory.mktemp("fuzz"), _replace(good_state, path, value))


@pytest.mark.parametrize(
    ("state", "problem"),
    [
        ({"version": 7, "made_by": "another tool"}, "version 7 (this build writes 1)"),
        ({"version": 1, "registry": {}, "configs": {"x": {"model": 3}}}, "no learner sets"),
    ],
)
def test_unrecognised_content_is_a_warning_not_restored(
    tmp_path: Path, state: dict[str, Any], problem: str
) -> None:
    """A good checksum and nothing that breaks the content check, but not what coeffd
    writes: a warning naming what differs, never "learner state restored" at info
    (issue 32, item 10)."""
    _write(tmp_path / "state", latest=state)
    with structlog.testing.capture_logs() as logs:
        consumer, _ = _consumer(tmp_path / "state")
    consumer.writer.close()
    assert not [e for e in logs if e["event"] == "learner state restored"]
    warnings = [e for e in logs if e["event"].startswith("checkpoint content not recognised")]
    assert len(warnings) == 1 and warnings[0]["log_level"] == "warning"
    assert problem in warnings[0]["problems"]
