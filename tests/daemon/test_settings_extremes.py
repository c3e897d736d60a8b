"""A setting that passes validation never crashes a component (``joiner.window_s = inf``
validated, then ``Joiner`` raised ``OverflowError`` converting it to nanoseconds).

Every numeric key of every settings section is tried with extreme values (infinities,
NaN, overflowing magnitudes, zero, the largest int64, -1, a denormal-sized 1e-300) and
with its own bounds, through the environment: each either stops ``load_settings`` (or
the start-up checks) with the one-line message naming the key, or yields settings from
which the daemon builds (``build_app``, not started) and learns a small synthetic stream
— joiner, learners, load control, publishing, checkpoints, fleet, statistics, the trace
ring — without an exception.
"""

from __future__ import annotations

import math
import time
import typing
from pathlib import Path
from typing import Any

import pytest
from annotated_types import Ge, Gt, Le, Lt
from prometheus_client import CollectorRegistry
from pydantic import BaseModel

from coeffd.daemon.assemble import build_app
from coeffd.daemon.learning.consumer import LearningConsumer
from coeffd.daemon.settings import (
    Settings,
    SettingsError,
    _section_model,
    check_startup,
    load_settings,
)
from coeffd.joiner import Joiner
from coeffd.learners.features.config import ServingConfig
from tests.support.synthetic_engine import S_NS, Batch, SynthConfig, generate


def _numeric(annotation: Any) -> bool:
    kinds = (annotation, *typing.get_args(annotation))
    return any(t in (int, float) for t in kinds) and bool not in kinds


def _keys(model: type[BaseModel], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    keys: list[tuple[str, ...]] = []
    for name, field in model.model_fields.items():
        sub = _section_model(field.annotation)
        if sub is not None:
            keys += _keys(sub, (*prefix, name))
        elif _numeric(field.annotation):
            keys.append((*prefix, name))
    return keys


# a numpy warning here is a result gone odd silently (learners.fleet_quirk = 1e-300 made
# an infinite quirk precision before it was capped): it fails the test
pytestmark = pytest.mark.filterwarnings("error::RuntimeWarning")

KEYS = _keys(Settings)
EXTREMES = ("inf", "-inf", "nan", "1e300", "-1e300", "0", str(2**63 - 1), "-1", "1e-300")


def _values(key: tuple[str, ...]) -> list[str]:
    """The extremes, then the key's own bounds (the largest and smallest values it takes)."""
    model: type[BaseModel] = Settings
    for part in key[:-1]:
        sub = _section_model(model.model_fields[part].annotation)
        assert sub is not None
        model = sub
    field = model.model_fields[key[-1]]
    integer = int in (field.annotation, *typing.get_args(field.annotation))
    values = list(EXTREMES)
    for m in field.metadata:  # the bounds, and the values just inside an open bound
        if isinstance(m, Ge):
            values.append(str(m.ge))
        elif isinstance(m, Le):
            values.append(str(m.le))
        elif isinstance(m, Gt):
            gt: Any = m.gt
            values.append(str(gt + 1) if integer else repr(math.nextafter(gt, math.inf)))
        elif isinstance(m, Lt):
            lt: Any = m.lt
            values.append(str(lt - 1) if integer else repr(math.nextafter(lt, -math.inf)))
    return values


#: The one configuration the stream is learned as (every numeric key of the
#: ``configuration`` section is then tried too).
MODEL = "llama-3.1-8b-instruct"


def test_every_section_is_walked() -> None:
    sections = {k[0] for k in KEYS}
    assert {"joiner", "learners", "pipeline", "publish", "receivers", "query"} <= sections
    assert ("joiner", "window_s") in KEYS and ("joiner", "anchor_priors", "queued_hi_us") in KEYS
    assert ("configuration", "tp") in KEYS and ("learners", "drift", "grace") in KEYS
    assert "2592000.0" in _values(("joiner", "window_s"))  # its bound is tried too


@pytest.fixture(scope="module")
def batches() -> list[Batch]:
    return generate(
        SynthConfig(duration_s=2, rate_per_s=10, step_rate=0.2, kv_offload=True, seed=3)
    )[0]


@pytest.mark.parametrize("key", KEYS, ids=".".join)
def test_extreme_values_fail_at_start_or_work(
    key: tuple[str, ...], batches: list[Batch], tmp_path: Path
) -> None:
    dotted = ".".join(key)
    accepted = []
    for i, value in enumerate(_values(key)):
        environ = {  # each value starts afresh: no checkpoint of the previous one restored
            "COEFFD_PUBLISH__SNAPSHOT_DIR": str(tmp_path / str(i) / "snapshots"),
            "COEFFD_STATE__STATE_DIR": str(tmp_path / str(i) / "state"),
            "COEFFD_CONFIGURATION__MODEL": MODEL,
            "COEFFD_" + "__".join(key).upper(): value,
        }
        try:
            settings = load_settings(None, None, environ)
            check_startup(settings)  # what `coeffd serve` checks next
        except SettingsError as e:
            text = str(e)
            assert "\n" not in text and text.startswith("invalid setting"), text
            assert dotted in text, (value, text)
            continue
        accepted.append(value)
        try:
            _run(settings, batches)
        except Exception as e:
            raise AssertionError(
                f"{dotted}={value} passed validation but broke a component: {e!r}"
            ) from e
    # numbers are finite: no key takes an infinity or NaN (each broke some component)
    assert not {"inf", "-inf", "nan"} & set(accepted), accepted


def _run(settings: Settings, batches: list[Batch]) -> None:
    """Build what the settings configure and feed it one small stream."""
    # the joiner alone, live (the receiver's clock finishes idle sources) and flushed
    joiner = Joiner(settings.joiner)
    for _, records in batches:
        joiner.push_many(records)
    last = batches[-1][0]
    joiner.tick(last + 1 * S_NS)
    joiner.tick(last + 3600 * S_NS)
    joiner.flush()
    # the whole daemon, built but not started: its learning consumer joins the stream
    # (a joiner of settings.joiner) and learns what it joins in the learners' registry
    # (of settings.learners), publishing, checkpointing and pooling the fleet on its ticks
    app = build_app(settings, CollectorRegistry())
    consumer = app.consumer
    assert isinstance(consumer, LearningConsumer)
    assert consumer.registry.settings is settings.learners
    now = time.time()
    half = len(batches) // 2
    for i, (_, records) in enumerate(batches):
        consumer.consume(records)
        if i == half:
            consumer.tick(now)
    consumer.tick(now + 3600)
    consumer.close()
    config = ServingConfig(model=MODEL, gpu="H100")
    if consumer.registry.get(config.id) is not None:
        consumer.registry.pool(consumer.registry.estimate(config.id))
