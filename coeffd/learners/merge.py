"""Merge what several instances learned about the same configuration, exactly.

Why this is exact. Every learner keeps its statistics in information form
(:mod:`learners.rls`): ``A = Σ λ-decayed w x xᵀ`` and ``b = Σ λ-decayed w y x``, plus a
prior that is kept apart. Two instances that learned *in parallel* from disjoint streams of
one configuration (ten vLLM replicas, each with its sidecar) have each already applied
their own forgetting, so the statistics of one learner that had seen every row with the
same weights are the plain sums ``A = Σᵢ Aᵢ``, ``b = Σᵢ bᵢ`` — with the prior counted once.
(:meth:`RLSRegressor.merge` is the other case: one stream cut in two *in time*.)

What is not a sum. The prior of a configuration is set when its learners are created
(the pooled prior over whatever that instance had seen), so two members may carry
different priors; the merge keeps the *reference* member's (the one with the most
observations; ties go to the first given, so callers pass members in a stable order).
The drift monitors' and the steady estimator's comparison state are the reference's too,
except that the merged estimate tracks a change (``mode = tracking``) when any member
does: a member that saw the physics change is believed.

Parameters of the learners (features, forgetting, weighting) must agree; a member whose
learner differs is refused with :class:`MergeError` naming the key, never averaged in.

>>> import numpy as np
>>> from coeffd.learners.rls import RLSRegressor
>>> def fed(rows):
...     m = RLSRegressor(features=["a", "b"], forgetting=1.0, prior_precision=1e-6)
...     for a, y in rows:
...         m.learn_one({"a": a, "b": 1.0}, y)
...     return m
>>> s1, s2 = [(1.0, 5.0), (2.0, 7.1)], [(3.0, 8.9), (4.0, 11.0)]
>>> both = fed(s1 + s2)
>>> merged = RLSRegressor([])
>>> merged.load_state(merge_learner_states([fed(s1).state_dict(), fed(s2).state_dict()]))
>>> bool(np.allclose(merged.coef, both.coef, rtol=1e-12)), merged.n_learned
(True, 4)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["MergeError", "merge_learner_states", "merge_set_states"]

#: Learner parameters that must agree for statistics to add (the prior may differ).
_MUST_AGREE = ("features", "forgetting", "forget_prior", "weighting")


class MergeError(ValueError):
    """Members whose learners cannot be merged (different features or parameters)."""


def _reference(observations: Sequence[float]) -> int:
    """Index of the member with the most observations (first on ties)."""
    return max(range(len(observations)), key=lambda i: (observations[i], -i))


def merge_learner_states(states: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One :meth:`RLSRegressor.state_dict` for the parallel learners ``states``.

    Data information, counts and effective window add; the prior, drift monitor and the
    weighting state come from the member with the most learned rows.
    """
    if not states:
        raise MergeError("nothing to merge")
    ref_i = _reference([float(s["n_learned"]) for s in states])
    ref = states[ref_i]
    for s in states:
        for key in _MUST_AGREE:
            if s["params"][key] != ref["params"][key]:
                raise MergeError(
                    f"learner parameter {key!r} differs between members: "
                    f"{s['params'][key]!r} vs {ref['params'][key]!r}"
                )
    a = np.sum([np.asarray(s["a"], dtype=float) for s in states], axis=0)
    b = np.sum([np.asarray(s["b"], dtype=float) for s in states], axis=0)
    n_eff = [float(s["n_eff"]) for s in states]
    # the residual scale of the merged learner: the members' mean, by effective rows
    sigmas = [(s["sigma_ew"], w) for s, w in zip(states, n_eff, strict=True) if s["sigma_ew"]]
    total_w = sum(w for _, w in sigmas)
    sigma = sum(float(v) * w for v, w in sigmas) / total_w if total_w > 0 else ref["sigma_ew"]
    return dict(ref) | {
        "a": a.tolist(),
        "b": b.tolist(),
        "n_eff": sum(n_eff),
        "n_learned": sum(int(s["n_learned"]) for s in states),
        "n_rejected": sum(int(s["n_rejected"]) for s in states),
        "n_downweighted": sum(int(s["n_downweighted"]) for s in states),
        "since_refresh": 0,
        "sigma_w": sigma,
        "sigma_ew": sigma,
    }


def _merge_steady(states: Sequence[Mapping[str, Any]], ref: int) -> dict[str, Any]:
    if not any(states):
        return {}
    base = dict(states[ref] or next(s for s in states if s))
    if any(s.get("mode") == "tracking" for s in states if s):
        base["mode"] = "tracking"
    base["switches"] = sum(int(s.get("switches", 0)) for s in states if s)
    return base


def merge_set_states(states: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One :meth:`LearnerSet.state_dict` for members of the same configuration.

    Every learner present in any member is merged over the members that have it; the
    set's ``version`` is the members' sum (it grows whenever any member learned), its
    observations add, its wall times span the members'.
    """
    if not states:
        raise MergeError("nothing to merge")
    configs = {str(sorted(s["config"].items())) for s in states}
    if len(configs) > 1:
        raise MergeError("members describe different configurations")
    obs = [int(s["observations"]) for s in states]
    ri = _reference([float(o) for o in obs])
    ref = states[ri]
    names = sorted({name for s in states for name in s["learners"]})
    learners = {
        name: merge_learner_states([s["learners"][name] for s in states if name in s["learners"]])
        for name in names
    }
    total = sum(obs)
    share = (
        sum(float(s.get("exact_share", 0.0)) * o for s, o in zip(states, obs, strict=True)) / total
        if total > 0
        else float(ref.get("exact_share", 0.0))
    )
    alpha_targets = sorted({t for s in states for t in (s.get("steady_alpha") or {})})
    return dict(ref) | {
        "learners": learners,
        "version": sum(int(s["version"]) for s in states),
        "observations": total,
        "created_wall_ns": min(int(s["created_wall_ns"]) for s in states),
        "updated_wall_ns": max(int(s["updated_wall_ns"]) for s in states),
        "exact_share": share,
        "exact_rows": sum(int(s.get("exact_rows", 0)) for s in states),
        "steady": _merge_steady([s.get("steady") or {} for s in states], ri),
        "steady_alpha": {
            t: _merge_steady([(s.get("steady_alpha") or {}).get(t) or {} for s in states], ri)
            for t in alpha_targets
        },
    }
