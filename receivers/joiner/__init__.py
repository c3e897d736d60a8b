"""Sliding-window joiner: event records → training observations (issue #4).

See :mod:`receivers.joiner.joiner` for the flow, :mod:`receivers.joiner.engine` for
the step-period reconstruction and :mod:`receivers.joiner.requests` for the alpha
targets.
"""

from receivers.joiner.config import AnchorPriors, JoinerConfig
from receivers.joiner.joiner import Joiner
from receivers.joiner.metrics import JoinerMetrics

__all__ = ["AnchorPriors", "Joiner", "JoinerConfig", "JoinerMetrics"]
