"""The fleet model: one α/β learned over every configuration, and coefficients for the
configurations nobody has deployed.

BLIS's basis carries the physics, so one coefficient vector can serve every model, GPU
and TP degree; coeffd's learners hold one per configuration. This package fits the
shared vector jointly over their statistics, scores candidate predictions for an unseen
configuration by leaving one configuration out, and states how far a prediction is
expected to be off. One module a job:

- :mod:`~learners.fleet.members`: what one configuration brings (:class:`MemberStats`),
  its step noise, and its own quirk marginalised out of its information;
- :mod:`~learners.fleet.model`: :class:`FleetModel` — the joint fit, the candidates,
  their leave-one-configuration-out errors, and the prediction;
- :mod:`~learners.fleet.factors`: the factor model (a shared vector plus offsets per GPU,
  model family and TP degree), the ``fleet_factors`` candidate;
- :mod:`~learners.fleet.error`: the expected error a prediction states;
- :mod:`~learners.fleet.results`: what the model answers (:class:`FleetResult`, the
  fleet vector with its errors; :class:`Prediction`, coefficients for one configuration).

Callers import each name from the module that defines it. How the model came to be this
way, with the measurements behind each choice: ``bench/README.md``, "fleet".
"""
