"""The ``fleet-shared`` scenario: structured truth, documented in the truth file."""

from __future__ import annotations

import json
import math

from coeffd.learners.features import MODELS
from coeffd.simfleet import run, write_truth


def test_truth_file_documents_structure_that_rebuilds_every_vector(tmp_path):
    res = run("fleet-shared", 0.5, 1, telemetry=False, drain_s=0.5)
    path = tmp_path / "truth.json"
    with path.open("w") as fh:
        write_truth(res.truth, fh)
    confs = json.loads(path.read_text())["configurations"]
    assert len(confs) >= 8
    assert {c["serving"]["gpu"] for c in confs} == {"H100", "A100-80"}
    assert {c["serving"]["tp"] for c in confs} >= {1, 2, 4}
    moe = {MODELS[c["serving"]["model"]].num_experts >= 2 for c in confs}
    assert moe == {True, False}
    assert len({c["config_id"] for c in confs}) == len(confs)
    for c in confs:
        s = c["structure"]
        beta = c["coefficients"]["points"][0]["beta"]
        for i, b in enumerate(beta):
            rebuilt = (
                s["base_beta"][i]
                * s["gpu_factors"][i]
                * s["family_factors"][i]
                * s["tp_factors"][i]
                * math.exp(s["idiosyncrasy"][i])
            )
            assert math.isclose(b, rebuilt, rel_tol=0, abs_tol=5e-7), (c["engine"], i)
        assert max(abs(e) for e in s["idiosyncrasy"]) <= s["idiosyncrasy_bound"]
    # shared structure: two configurations differing only in GPU share the family factors
    by_name = {c["engine"]: c["structure"] for c in confs}
    a, h = by_name["shared-llama8b-a100-tp1"], by_name["shared-llama8b-h100-tp1"]
    assert a["family_factors"] == h["family_factors"] and a["gpu_factors"] != h["gpu_factors"]
