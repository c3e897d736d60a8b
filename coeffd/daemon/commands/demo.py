"""``coeffd demo``: the daemon with an embedded synthetic vLLM fleet (what ``make run`` runs).

The fleet (simfleet) talks to the daemon over the real wires — OTLP/gRPC to the
receiver's port and ZMQ to the KV subscriber — exactly as vLLM would, so the demo
exercises the whole pipeline. A compact live view shows, per configuration, how many
observations were learned and the step-time error of the learned coefficients next to the
noise floor (the error the *true* coefficients would have) and BLIS's shipped defaults.

The demo samples densely (``--sample-rates 1.0,0.5,0.05``: every second step traced, where
vLLM's default is one in a hundred) and runs the fleet at ``--speed 3``, so it learns in
a minute what a real engine at default rates gives in an hour; a line under the table says
so (:func:`sampling_note`). When stdout is not a terminal (a log file, ``| tee``) the
table is printed again only when a configuration appears or drifts, else once a minute
(:class:`Reprint`), not every ``--refresh`` seconds.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
import threading
import time
from typing import Any

import numpy as np
import structlog

from coeffd.daemon.app import App, ListenerError
from coeffd.daemon.assemble import build_app
from coeffd.daemon.commands.common import EXIT_USAGE, add_settings_arguments, settings_from_args
from coeffd.daemon.learning import LearningConsumer

__all__ = ["add_parser", "noise_floor", "run"]

log = structlog.get_logger(__name__)

#: Demo defaults, applied before the user's own --set/flags (which win).
_DEMO_SETTINGS = (
    "publish.snapshot_dir=out/demo/snapshots",
    "state.state_dir=out/demo/state",
    "kv.endpoints=tcp://127.0.0.1:5557",
    "kv.bind=true",
    "kv.topic_sources=true",
    "log.level=warning",
)


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``demo``."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "demo",
        help="run the daemon fed by a built-in synthetic vLLM fleet, with a live view",
        description="Start coeffd and a simulated vLLM fleet that sends it real OTLP spans "
        "and ZMQ KV events; watch coefficients being learned.",
    )
    p.add_argument("--scenario", default="fleet", help="simfleet scenario (default: fleet)")
    p.add_argument("--duration", type=float, default=900.0, help="simulated seconds")
    p.add_argument("--speed", type=float, default=3.0, help="simulated/real time ratio")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--sample-rates",
        default="1.0,0.5,0.05,100",
        metavar="J,S,R[,K]",
        help="vLLM journey,step,rich sample rates [,closure] (demo: dense step sampling)",
    )
    p.add_argument("--refresh", type=float, default=3.0, help="seconds between live views")
    p.add_argument(
        "--exit-when-done",
        action="store_true",
        help="stop when the simulation ends (default: keep serving until Ctrl-C)",
    )
    add_settings_arguments(p, serve=True)
    p.set_defaults(run=run)
    return p


def noise_floor(sigma: float, samples: int = 200_000, seed: int = 0) -> float:
    """MAPE the true coefficients get on periods ``S·exp(σz)``: ``E|1 − exp(−σz)|``.

    >>> round(noise_floor(0.03), 3)
    0.024
    """
    z = np.random.default_rng(seed).standard_normal(samples)
    return float(np.mean(np.abs(1.0 - np.exp(-sigma * z))))


def _pct(x: float) -> str:
    return "   -  " if not math.isfinite(x) else f"{100 * x:5.1f}%"


def render(
    rows: list[dict[str, Any]],
    floors: dict[str, float],
    elapsed: float,
    true_alpha: dict[str, list[float]] | None = None,
) -> str:
    """The live view: one line per configuration.

    α columns: the learned α's error against the simulator's truth when it is known (a
    per-request MAPE of α0 would mostly show how long requests waited for the engine
    loop, which is noise around a correct mean), else the rolling MAPE.
    """
    true_alpha = true_alpha or {}
    head = (
        f"coeffd demo — {elapsed:6.0f} s   (step-time MAPE: learned | noise floor | BLIS default)\n"
        f"{'id':<12} {'configuration':<52} {'obs':>6}  {'learned':>7} {'floor':>7} "
        f"{'default':>7}  {'α0 α1 α2 vs truth':>21}  drift\n"
    )
    lines = []
    for r in sorted(rows, key=lambda r: r["label"]):
        truth = true_alpha.get(r["config"])
        if truth is not None:
            errs = [(a - t) / t for a, t in zip(r["alpha"], truth, strict=True)]
            alpha = " ".join(f"{100 * e:+.1f}%" for e in errs)
        else:
            alpha = " ".join(_pct(a).strip() for a in r["alpha_mape"])
        lines.append(
            f"{r['config']:<12} {r['label'][:52]:<52} {r['observations']:>6}  "
            f"{_pct(r['step_mape']):>7} "
            f"{_pct(floors.get(r['config'], math.nan)):>7} {_pct(r['step_mape_default']):>7}  "
            f"{alpha:>21}  {r['drift']:>5}"
        )
    return head + "\n".join(lines or ["(waiting for the first observations…)"]) + "\n"


def _truth(scenario: str, duration: float) -> tuple[dict[str, float], dict[str, list[float]]]:
    """Per configuration id of the scenario's engines: the noise floor and the true α
    (its mean: delays are α·exp(σz)) at the end of the run."""
    from coeffd.learners.features.config import ServingConfig
    from coeffd.receivers.source import source_from_attributes
    from coeffd.simfleet import build, resource_attributes

    floors: dict[str, float] = {}
    alphas: dict[str, list[float]] = {}
    for i, spec in enumerate(build(scenario, duration)):
        src = source_from_attributes(resource_attributes(spec, "engine_core", i))
        cid = ServingConfig.from_resource(src).id
        floors[cid] = noise_floor(spec.noise.sigma)
        boost = math.exp(spec.noise.alpha_sigma**2 / 2)
        alphas[cid] = [a * boost for a in spec.truth.at(duration).alpha]
    return floors, alphas


#: vLLM's default step sampling rate (``--step-tracing-sample-rate``; simfleet's default).
VLLM_STEP_RATE = 0.01
#: Seconds between tables when stdout is not a terminal and nothing new happened.
QUIET_REPRINT_S = 60.0


def sampling_note(step_rate: float, speed: float) -> str:
    """What the demo's sampling means for a real deployment (a line under the table).

    >>> print(sampling_note(0.5, 3.0))
    note: the demo traces 50% of steps at 3× speed; vLLM's default traces 1% (50× fewer step observations): with it a real engine shows under one step observation a second and α0 at BLIS's default for its first minutes, as expected (α0 needs thousands of requests)
    """
    ratio = step_rate / VLLM_STEP_RATE
    fewer = f" ({ratio:.0f}× fewer step observations)" if ratio > 1.5 else ""
    return (
        f"note: the demo traces {100 * step_rate:.0f}% of steps at {speed:g}× speed; vLLM's "
        f"default traces {100 * VLLM_STEP_RATE:.0f}%{fewer}: with it a real engine shows "
        "under one step observation a second and α0 at BLIS's default for its first minutes, "
        "as expected (α0 needs thousands of requests)"
    )


class Reprint:
    """When to print the live table: every refresh on a terminal (it redraws in place);
    otherwise only when a configuration appears or its drift count changes, or
    :data:`QUIET_REPRINT_S` after the last one (a log must not hold a copy every 3 s).

    >>> r = Reprint(tty=False)
    >>> rows = [{"config": "a1", "drift": 0, "observations": 5}]
    >>> r.due(rows, 0.0), r.due(rows, 3.0), r.due(rows + [{"config": "b2", "drift": 0}], 6.0)
    (True, False, True)
    >>> r.due(rows + [{"config": "b2", "drift": 0}], 66.5)
    True
    """

    def __init__(self, tty: bool, quiet_s: float = QUIET_REPRINT_S) -> None:
        self.tty = tty
        self.quiet_s = quiet_s
        self._shown: tuple[tuple[str, int], ...] | None = None
        self._at = -math.inf

    def due(self, rows: list[dict[str, Any]], now: float) -> bool:
        """Whether to print the table for ``rows`` at monotonic time ``now`` (if so, it
        counts as printed)."""
        shown = tuple(sorted((str(r["config"]), int(r.get("drift", 0))) for r in rows))
        if not (self.tty or shown != self._shown or now - self._at >= self.quiet_s):
            return False
        self._shown, self._at = shown, now
        return True


def _server_flag(app: App) -> str:
    """``--server URL`` for the commands, or nothing on their default port."""
    url = f"http://127.0.0.1:{app.http_port}"
    return "" if app.http_port == 9464 else f" --server {url}"


def command_name(argv0: str | None = None) -> str:
    """How to call coeffd again from this shell: ``make run`` starts ``.venv/bin/coeffd``,
    which is not on a fresh clone's PATH.

    >>> command_name("/srv/coeffd/daemon/__main__.py"), command_name("coeffd")
    ('coeffd', 'coeffd')
    """
    argv0 = sys.argv[0] if argv0 is None else argv0
    if os.path.basename(argv0) != "coeffd" or not os.path.dirname(argv0):
        return "coeffd"
    found = shutil.which("coeffd")
    if found and os.path.realpath(found) == os.path.realpath(argv0):
        return "coeffd"  # on PATH: the short name works
    return argv0


def where(app: App) -> str:
    """Where to look while the demo runs (printed under every live table)."""
    s = app.settings
    url = f"http://127.0.0.1:{app.http_port}"
    server = _server_flag(app)
    coeffd = command_name()
    return (
        f"  metrics  {url}/metrics     API  {url}/v1/configurations\n"
        f"  names    {coeffd} configurations{server}\n"
        f"  BLIS     {coeffd} pull{server} --config <id> --format blis-args\n"
        f"  files    {s.publish.snapshot_dir}/<id>/latest.json   state  {s.state.state_dir}/\n"
        f"Ctrl-C to stop (learner state is kept for the next run)\n"
    )


def restored_note(app: App) -> str | None:
    """A line saying the learners continue from an earlier run's state, if they do."""
    consumer = app.consumer
    if not (isinstance(consumer, LearningConsumer) and consumer.restored):
        return None
    return (
        f"continuing from the learner state of an earlier run in {app.settings.state.state_dir}/ "
        "(start fresh: --set state.restore=false, or delete it)"
    )


def run(args: argparse.Namespace) -> int:
    """Serve + simulate; live view until the simulation ends (or Ctrl-C)."""
    from coeffd.simfleet import SampleRates, run_in_thread

    args.set_values = list(_DEMO_SETTINGS) + list(args.set_values)
    settings = settings_from_args(args)
    if settings is None:
        return EXIT_USAGE
    try:
        rates = SampleRates.parse(args.sample_rates)
    except ValueError as e:
        print(f"coeffd demo: --sample-rates: {e}", file=sys.stderr)
        return EXIT_USAGE
    try:
        app = build_app(settings)
        app.start()
    except ListenerError as e:
        example = e.example()
        print(
            f"coeffd demo: cannot start: {e}"
            + (f' (make run ARGS="{example}"; is another coeffd running?)' if example else ""),
            file=sys.stderr,
        )
        return 1
    except (OSError, ValueError) as e:
        print(f"coeffd demo: cannot start: {e}", file=sys.stderr)
        return 1
    stop_requested = threading.Event()
    try:
        import signal

        signal.signal(signal.SIGTERM, lambda *_: stop_requested.set())
    except ValueError:  # not the main thread (tests)
        pass
    kv = app.kv_endpoints[0] if app.kv_endpoints else None
    thread, stop_sim, _result = run_in_thread(
        args.scenario,
        args.duration,
        args.seed,
        rates=rates,
        otlp_endpoint=f"127.0.0.1:{app.grpc_port}",
        kv_endpoint=kv.replace("0.0.0.0", "127.0.0.1") if kv else None,
        speed=args.speed,
        max_events=100_000,
    )
    consumer = app.consumer
    if isinstance(consumer, LearningConsumer):
        consumer.live_view = True
    floors, true_alpha = _truth(args.scenario, args.duration)
    note = restored_note(app)
    print(f"coeffd is learning from a simulated fleet ({args.scenario}).", flush=True)
    if note:
        print(note, flush=True)
    print(where(app), flush=True)
    t0 = time.monotonic()
    tty = sys.stdout.isatty()
    reprint = Reprint(tty)
    sampling = sampling_note(rates.step, args.speed)
    code = 0
    finished = False
    try:
        while not stop_requested.is_set():
            stop_requested.wait(args.refresh)
            rows = consumer.live_rows() if isinstance(consumer, LearningConsumer) else None
            if rows is not None and reprint.due(rows, time.monotonic()):
                view = render(rows, floors, time.monotonic() - t0, true_alpha)
                status = "simulation finished; still serving\n" if finished else ""
                # the URLs stay under the table: clearing the screen would lose them
                footer = sampling + "\n" + (note + "\n" if note else "") + status + where(app)
                print(("\x1b[2J\x1b[H" if tty else "") + view + "\n" + footer, flush=True)
            if not thread.is_alive() and not finished:
                app.pipeline.wait_idle(10.0)
                finished = True
                if args.exit_when_done:
                    break
    except KeyboardInterrupt:
        pass
    finally:
        stop_sim.set()
        thread.join(timeout=30)
        app.stop()
        if isinstance(consumer, LearningConsumer):
            print(
                render(consumer.live_rows(), floors, time.monotonic() - t0, true_alpha), flush=True
            )
        state = app.settings.state.state_dir
        print(
            f"coeffd stopped. Snapshots stay in {app.settings.publish.snapshot_dir}/"
            + (f", learner state in {state}/ (the next run continues from it)" if state else "")
            + ".",
            flush=True,
        )
    return code
