"""Features: model/hardware descriptions, configuration identity, BLIS basis.

Entry points (see ``learners/features/README.md``):

* :class:`~learners.features.model.ModelSpec` — a HuggingFace ``config.json`` read as BLIS reads it;
* :func:`~learners.features.hardware.load_hardware` — GPU sheets (BLIS format + link bandwidths);
* :class:`~learners.features.basis.BlisBasis` — the eleven trained-physics terms and step time;
* :data:`~learners.features.catalog.MODELS` — bundled model descriptions by name;
* :class:`~learners.features.config.ServingConfig` — configuration identity (``.id``).
"""

from coeffd.learners.features.basis import (
    BLIS_DEFAULT_ALPHA,
    BLIS_DEFAULT_BETA,
    TERM_NAMES,
    BasisConfigError,
    BlisBasis,
)
from coeffd.learners.features.catalog import MODELS, load_model, resolve_model
from coeffd.learners.features.config import (
    BasisResolver,
    ConfigurationSettings,
    ServingConfig,
    ServingConfigError,
)
from coeffd.learners.features.hardware import HardwareError, HardwareSpec, load_hardware
from coeffd.learners.features.model import ModelConfigError, ModelSpec

__all__ = [
    "BLIS_DEFAULT_ALPHA",
    "BLIS_DEFAULT_BETA",
    "MODELS",
    "TERM_NAMES",
    "BasisConfigError",
    "BasisResolver",
    "BlisBasis",
    "ConfigurationSettings",
    "HardwareError",
    "HardwareSpec",
    "ModelConfigError",
    "ModelSpec",
    "ServingConfig",
    "ServingConfigError",
    "load_hardware",
    "load_model",
    "resolve_model",
]
