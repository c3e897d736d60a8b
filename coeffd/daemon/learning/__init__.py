"""Learning: records → joiner → learners → snapshots, checkpoints, metrics.

One job per module:

* :mod:`.consumer` — :class:`LearningConsumer`, the pipeline worker's consumer: joins
  records, routes each observation to its configuration's learners;
* :mod:`.configs` — :class:`ConfigResolver`: which configuration a telemetry source
  belongs to (static, or from its resource attributes);
* :mod:`.cadence` — :class:`Publisher`: when a configuration gets a new snapshot;
* :mod:`.checkpoints` — restore and checkpoint the learners' state; write health;
* :mod:`.freshness` — observation → snapshot-on-disk latency;
* :mod:`.metrics` — :class:`ServeMetrics`, the learning-side metric families.
"""

from coeffd.daemon.learning.configs import ConfigResolver
from coeffd.daemon.learning.consumer import LearningConsumer
from coeffd.daemon.learning.metrics import ServeMetrics

__all__ = ["ConfigResolver", "LearningConsumer", "ServeMetrics"]
