"""``coeffd simfleet`` writes the files it is asked for and refuses bad arguments."""

from __future__ import annotations

import json

from coeffd.daemon.cli import main


def test_cli_writes_traces_kv_and_truth(tmp_path):
    out, kv, truth = tmp_path / "t.jsonl", tmp_path / "kv.jsonl", tmp_path / "truth.json"
    code = main(
        [
            "simfleet",
            "--scenario",
            "abrupt-drift",
            "--duration",
            "2",
            "--drain",
            "2",
            "--seed",
            "4",
            "--out",
            str(out),
            "--kv-out",
            str(kv),
            "--truth",
            str(truth),
            "--sample-rates",
            "1,0.5,0.01,10",
        ]
    )
    assert code == 0
    lines = out.read_bytes().splitlines()
    assert lines and all(json.loads(x)["resourceSpans"] for x in lines)
    assert kv.read_text().count("\n") > 0
    t = json.loads(truth.read_text())
    assert t["scenario"] == "abrupt-drift" and t["sample_rates"]["closure_interval"] == 10
    assert t["configurations"][0]["coefficients"]["change_points_s"] == [1.0]


def test_cli_rejects_bad_sample_rates(tmp_path, capsys):
    assert main(["simfleet", "--out", str(tmp_path / "x"), "--sample-rates", "1,2"]) == 2
    assert main(["simfleet"]) == 2  # nothing to emit


def test_run_in_thread_stops_early():
    from coeffd import simfleet

    th, stop, out = simfleet.run_in_thread("steady", 3600.0, 1, speed=50.0, telemetry=False)
    stop.set()
    th.join(timeout=60)
    assert not th.is_alive() and out and out[0].sim_seconds < 3600
