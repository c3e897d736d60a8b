"""The serve consumer skips and counts streams whose resource names no known model or GPU
(issue 17.1): a FIFO or /dev/zero as ``coeffd.gpu`` / ``coeffd.model`` costs nothing.

simfleet's engine telemetry, decoded by the real decoder and learned by the consumer
``coeffd serve`` builds, with the resource attributes an attacker would set.
"""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

import pytest
from daemon_support import fleet_requests
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from prometheus_client import CollectorRegistry

from coeffd.daemon.assemble import build_consumer
from coeffd.daemon.settings import load_settings
from coeffd.receivers.otlp.decode import Decoder

BUNDLED = Path(__file__).resolve().parents[2] / "coeffd/learners/features/data/models"


@pytest.fixture(scope="module")
def requests() -> list[ExportTraceServiceRequest]:
    return fleet_requests()


def _named(reqs: list[ExportTraceServiceRequest], **attrs: str) -> list[bytes]:
    out = []
    for req in reqs:
        copy = ExportTraceServiceRequest()
        copy.CopyFrom(req)
        for rs in copy.resource_spans:
            for kv in rs.resource.attributes:
                if kv.key.removeprefix("coeffd.") in attrs:
                    kv.value.string_value = attrs[kv.key.removeprefix("coeffd.")]
        out.append(copy.SerializeToString())
    return out


def _learn(tmp: Path, bodies: list[bytes], **catalog: str) -> CollectorRegistry:
    settings = load_settings(
        overrides={
            "publish": {"snapshot_dir": str(tmp / "snap")},
            "state": {"state_dir": ""},
            "catalog": catalog,
        },
        environ={},
    )
    registry = CollectorRegistry()
    consumer, _ = build_consumer(settings, registry, live=False)
    decoder = Decoder()

    def work() -> None:
        for body in bodies:
            consumer.consume(decoder.decode_bytes(body).records)
        consumer.close()

    t = threading.Thread(target=work, daemon=True)
    t.start()
    t.join(120)
    assert not t.is_alive(), "the pipeline blocked on a resource attribute"
    return registry


def _unconfigured(registry: CollectorRegistry, reason: str) -> float:
    return (
        registry.get_sample_value("coeffd_observations_unconfigured_total", {"reason": reason})
        or 0.0
    )


def test_paths_in_resource_attributes_are_counted_not_opened(
    tmp_path: Path, requests: list[ExportTraceServiceRequest]
) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    bodies = (
        _named(requests, gpu=str(fifo))
        + _named(requests, model="/dev/zero")
        + _named(requests, model="../../../../dev/zero", gpu="H101")
    )
    registry = _learn(tmp_path, bodies)
    assert _unconfigured(registry, "invalid_name") > 0
    assert registry.get_sample_value("coeffd_configurations") == 0
    assert not list((tmp_path / "snap").glob("*/latest.json"))


def test_unknown_names_are_counted_by_reason(
    tmp_path: Path, requests: list[ExportTraceServiceRequest]
) -> None:
    registry = _learn(
        tmp_path, _named(requests, model="no-such-model") + _named(requests, gpu="H101")
    )
    assert _unconfigured(registry, "unknown_model") > 0
    assert _unconfigured(registry, "unknown_gpu") > 0
    assert registry.get_sample_value("coeffd_configurations") == 0


def test_a_model_of_the_operators_directory_is_learned(
    tmp_path: Path, requests: list[ExportTraceServiceRequest]
) -> None:
    models = tmp_path / "models"
    (models / "house-llama").mkdir(parents=True)
    shutil.copy(BUNDLED / "llama-3.1-8b-instruct/config.json", models / "house-llama/config.json")
    registry = _learn(tmp_path, _named(requests, model="house-llama"), models_dir=str(models))
    assert registry.get_sample_value("coeffd_configurations") == 1
    assert (
        sum(
            _unconfigured(registry, r)
            for r in ("invalid_name", "unknown_model", "no_configuration")
        )
        == 0
    )
