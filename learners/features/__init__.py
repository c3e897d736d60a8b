"""Features: model/hardware descriptions, configuration identity, BLIS basis."""
