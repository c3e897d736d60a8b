"""``python -m bench serve``: ``coeffd serve`` end to end, one core, real gRPC.

A daemon process pinned to one core receives simfleet's OTLP export requests from a
sender pinned to the other core, at rising rates (events/s), until the daemon pushes back
(gRPC ``UNAVAILABLE``: its pipeline queue is full). Measured in the same run:

* **baseline**: the same daemon with ``pipeline.consumer = "counting"`` — receivers and
  queue only — so the ratio shows what joining and learning cost on top of ingest;
* **learning**: the real daemon (joiner → learners → snapshots), which under load first
  sheds learning (``pipeline.shed_*``) and then samples engines (``pipeline.sample_engines``:
  decodes and joins a share of each configuration's engines);
* **learning, every engine joined**: the same with ``pipeline.sample_engines = false``.

Reported: the sustained rate (highest level with no push-back, no request sent over 1 s
late and ≥ 90 % of the rate delivered; the learning daemon is held at each level for ``joiner.window_s`` first, since
it builds step observations a window after their spans arrive), the share of step
observations it learned there (``coeffd_learning_keep_ratio``: under load it sheds
steps rather than push back), the engine share and the part of the events sampled out
(``coeffd_engine_sample_ratio``, ``coeffd_events_sampled_out_total``), the freshness at half of it — observation → snapshot
(``coeffd_snapshot_freshness_seconds``, what coeffd controls) and step summary arrival →
snapshot (``coeffd_step_freshness_seconds``, which includes the joiner's wait for the
journey events around a step, ~``joiner.window_s``) — and the RSS of a daemon that
learns 100 configurations.

Fresh data without generating millions of events: a base recording (60 s of the
9-engine fleet, every step sampled) is replayed live — data time runs at real time — as
``K`` phase-shifted copies at once (:class:`LiveSender`; ``K`` = rate / the recording's
own rate), each request rewritten on the sender's core with new trace/span ids, a new
engine identity (``coeffd.engine``, same configuration) and wall times shifted to when
it is sent. So nothing is a duplicate, the daemon's live clock sees current data, and
its window behaves as in production: 30,000 events/s is ~240 engines.

Targets: ≥ 150,000 events/s, p99 freshness ≤ 1 s at half load, RSS ≤ 150 MB (100 configs).

``--sampling default`` sizes a fleet instead: engines per core learned with nothing shed
at vLLM's default sampling, beside a baseline revision's daemon (``bench/_fleetsize.py``).
"""

from __future__ import annotations

import argparse
import bisect
import collections
import dataclasses
import heapq
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from prometheus_client.parser import text_string_to_metric_families

from coeffd.receivers.otlp.decode import Decoder
from coeffd.simfleet import SampleRates, build, replica, run

ROOT = Path(__file__).resolve().parents[1]
EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
RATES = SampleRates(1.0, 1.0, 0.02, 100)
WINDOW_S = 30.0  # the daemon's default joiner.window_s
LAG_LIMIT_S = 1.0
NO_SAMPLING = "learning daemon, every engine joined (pipeline.sample_engines = false)"  # a level is sustained if no request leaves later than this


@dataclasses.dataclass
class Recording:
    """Base export requests (parsed), their record counts, and the earliest wall time."""

    requests: list[ExportTraceServiceRequest]
    events: list[int]
    wall0: int

    @property
    def total(self) -> int:
        return sum(self.events)


def record(scenario: str | list[Any], seconds: float, seed: int, rates: SampleRates) -> Recording:
    """Run simfleet into memory; count records per request with the project's decoder."""
    reqs: list[ExportTraceServiceRequest] = []
    dec = Decoder()
    events: list[int] = []

    def sink(req: ExportTraceServiceRequest) -> None:
        copy = ExportTraceServiceRequest()
        copy.CopyFrom(req)
        reqs.append(copy)
        events.append(len(dec.decode(req).records))

    run(scenario, seconds, seed, rates=rates, trace_sinks=[sink], max_events=100_000, drain_s=5)
    wall0 = min(
        s.start_time_unix_nano
        for r in reqs
        for rs in r.resource_spans
        for ss in rs.scope_spans
        for s in ss.spans
    )
    return Recording(reqs, events, wall0)


def rewrite(req: ExportTraceServiceRequest, rnd: int, shift_ns: int) -> bytes:
    """A fresh copy of ``req`` for replay round ``rnd``: new ids, engine and wall times."""
    return replica(req, rnd, shift_ns).SerializeToString()


class Sender:
    """Paced sender: replays ``rec`` in rounds at a target event rate, counting push-back.

    Each round is sent as fast as the rate allows, so the data's own clock runs faster
    than real time (a 60 s recording in a couple of seconds): fine for throughput and
    memory, but it turns the joiner's window into bursts. :class:`LiveSender` keeps
    data time equal to real time.
    """

    def __init__(self, port: int, rec: Recording) -> None:
        self.channel = grpc.insecure_channel(
            f"127.0.0.1:{port}", options=[("grpc.max_send_message_length", 64 << 20)]
        )
        self.export = self.channel.unary_unary(EXPORT)
        self.rec = rec
        self.idx = 0
        self.round = 0
        self.shift = 0
        self.lag = 0.0

    def plan(self, rate: float) -> Iterator[tuple[float, bytes, int]]:
        """(monotonic send time, request bytes, events) in sending order."""
        rec, t, step = self.rec, time.monotonic(), 1.0 / rate
        while True:
            if self.idx == 0:
                self.round += 1
                self.shift = time.time_ns() - rec.wall0
            i = self.idx
            self.idx = (i + 1) % len(rec.requests)
            yield t, rewrite(rec.requests[i], self.round, self.shift), rec.events[i]
            t += rec.events[i] * step

    def offered(self, rate: float) -> float:
        return rate

    def level(
        self, rate: float, seconds: float, window: int = 8, warm: float = 0.0
    ) -> tuple[int, int, float]:
        """Send at ``rate`` events/s for ``warm + seconds`` with up to ``window`` requests
        in flight (as the SDK's exporters of several processes would); returns (events
        delivered in the last ``seconds``, push-backs in all, those seconds). A
        pushed-back request is sent again."""
        sent = pushbacks = 0
        self.lag = 0.0  # how far behind its plan a request left (measured part only)
        base: int | None = None if warm else 0
        t_base = time.monotonic() + warm
        inflight: collections.deque[tuple[Any, bytes, int]] = collections.deque()
        retry: list[tuple[bytes, int]] = []
        t0 = time.monotonic()
        plan = self.plan(rate)
        due, data, n = next(plan)

        def settle(block: bool) -> None:
            nonlocal sent, pushbacks
            while inflight and (block or inflight[0][0].done()):
                fut, body, k = inflight.popleft()
                try:
                    fut.result(timeout=30)
                    sent += k
                except grpc.RpcError as e:
                    if e.code() not in (
                        grpc.StatusCode.UNAVAILABLE,
                        grpc.StatusCode.RESOURCE_EXHAUSTED,
                    ):
                        raise
                    pushbacks += 1
                    retry.append((body, k))
                block = False

        while (now := time.monotonic()) - t0 < warm + seconds:
            if base is None and now >= t_base:
                base, t_base = sent, now
            settle(False)
            if len(inflight) >= window:
                settle(True)
                continue
            if retry:
                time.sleep(0.01)  # back off as the exporter would
                body, k = retry.pop(0)
            elif due <= now:
                body, k = data, n
                if now - t0 >= warm:
                    self.lag = max(self.lag, now - due)
                due, data, n = next(plan)
            else:
                if inflight:
                    settle(True)
                else:
                    time.sleep(min(due - now, 0.0005))
                continue
            inflight.append((self.export.future(body, timeout=30), body, k))
        while inflight:
            settle(True)
        return sent - (base or 0), pushbacks, time.monotonic() - (t_base if warm else t0)

    def close(self) -> None:
        self.channel.close()


class LiveSender(Sender):
    """Replays ``rec`` the way a live fleet sends: data time runs at real time.

    ``K`` phase-shifted copies of the recording play at once, each under its own engine
    identities, copy ``k`` a ``k/K`` of the recording ahead (so all are mid-stream from
    the first second, like a fleet coeffd joins while it runs); each request goes out
    when its spans have ended in the copy's shifted clock. The offered rate is ``K``
    times the recording's natural rate (rounded to whole copies); each level starts new
    engines.
    """

    def __init__(self, port: int, rec: Recording) -> None:
        super().__init__(port, rec)
        ends = [
            max(
                s.end_time_unix_nano
                for rs in r.resource_spans
                for ss in rs.scope_spans
                for s in ss.spans
            )
            - rec.wall0
            for r in rec.requests
        ]
        self.order = sorted(range(len(ends)), key=ends.__getitem__)
        self.ends = [ends[i] for i in self.order]
        self.duration_ns = self.ends[-1] + 1_000_000_000
        self.levels = 0

    def copies(self, rate: float) -> int:
        return max(1, round(rate * self.duration_ns / 1e9 / self.rec.total))

    def offered(self, rate: float) -> float:
        return self.copies(rate) * self.rec.total / (self.duration_ns / 1e9)

    def plan(self, rate: float) -> Iterator[tuple[float, bytes, int]]:
        k_n, d = self.copies(rate), self.duration_ns
        self.levels += 1
        wall0, mono0 = time.time_ns(), time.monotonic()
        heap: list[tuple[int, int, int, int]] = []  # (due wall ns, copy, cycle, position)
        for k in range(k_n):
            lead = k * d // k_n
            j = bisect.bisect_left(self.ends, lead)
            if j < len(self.ends):
                heap.append((wall0 - lead + self.ends[j], k, 0, j))
            else:
                heap.append((wall0 - lead + d + self.ends[0], k, 1, 0))
        heapq.heapify(heap)
        while True:
            due, k, c, j = heapq.heappop(heap)
            start = due - self.ends[j]  # this copy-cycle's wall time of the recording's t=0
            tag = (self.levels * 1000 + k) * 1000 + c
            i = self.order[j]
            body = rewrite(self.rec.requests[i], tag, start - self.rec.wall0)
            nxt = (
                (start + self.ends[j + 1], k, c, j + 1)
                if j + 1 < len(self.ends)
                else (start + d + self.ends[0], k, c + 1, 0)
            )
            heapq.heappush(heap, nxt)
            yield mono0 + (due - wall0) / 1e9, body, self.rec.events[i]


def _launcher(tree: Path) -> list[str]:
    """A command running ``coeffd`` from ``tree`` (the editable install's finder, which
    would pick this work tree, dropped)."""
    code = (
        "import sys; sys.meta_path[:] = [f for f in sys.meta_path"
        " if 'editable' not in repr(f).lower()]; "
        f"sys.path.insert(0, {str(tree)!r}); sys.argv[0] = 'coeffd'; "
        "from coeffd.daemon.cli import main; sys.exit(main())"
    )
    return [sys.executable, "-c", code]


def old_http_tree(tmp: Path, rev: str | None = None) -> tuple[Path, str]:
    """The coeffd package of ``rev`` (default: the last commit served by the stdlib
    ``ThreadingHTTPServer``) extracted under ``tmp``; (its root, the commit)."""
    if rev is None:
        changed = subprocess.run(
            ["git", "log", "--format=%H", "-S", "ThreadingHTTPServer", "--", "coeffd/base/http.py"],
            cwd=ROOT, capture_output=True, text=True, check=True,
        ).stdout.split()  # fmt: skip
        rev = f"{changed[0]}~1"
    parsed = subprocess.run(
        ["git", "rev-parse", "--short", "--verify", f"{rev}^{{commit}}"],
        cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    if parsed.returncode != 0:  # a typo: say so, not a CalledProcessError traceback
        raise SystemExit(f"baseline revision {rev!r} is not a commit of this repository")
    commit = parsed.stdout.strip()
    root = tmp / f"tree-{commit}"
    root.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(
        ["git", "archive", commit, "coeffd"], cwd=ROOT, capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(root)], input=archive, check=True)
    return root, commit


def http_blast(port: int, bodies: list[tuple[bytes, int]], seconds: float, conns: int = 4) -> str:
    """Closed-loop OTLP/HTTP: ``conns`` keep-alive connections post ``bodies`` (protobuf,
    events each) round-robin for ``seconds``; events/s acknowledged (200), and pushbacks."""
    import http.client

    acked = [0] * conns
    pushed = [0] * conns
    stop = time.monotonic() + seconds
    headers = {"Content-Type": "application/x-protobuf"}

    def run(i: int) -> None:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        j = i
        while time.monotonic() < stop:
            body, events = bodies[j % len(bodies)]
            j += conns
            c.request("POST", "/v1/traces", body=body, headers=headers)
            r = c.getresponse()
            r.read()
            if r.status == 200:
                acked[i] += events
            else:
                pushed[i] += 1
        c.close()

    t0 = time.monotonic()
    threads = [threading.Thread(target=run, args=(i,)) for i in range(conns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rate = sum(acked) / (time.monotonic() - t0)
    return f"{rate:,.0f} events/s acknowledged, {sum(pushed)} pushed back"


def http_compare(tmp: Path, rec: Recording, seconds: float, rounds: int, rev: str | None) -> int:
    """OTLP/HTTP ingest throughput (counting consumer) of this tree and of the old
    stdlib-server commit, alternated ``rounds`` times in this run."""
    tree, commit = old_http_tree(tmp, rev)
    bodies = [(r.SerializeToString(), n) for r, n in zip(rec.requests, rec.events, strict=True)]
    print(
        f"\nOTLP/HTTP ingest (counting consumer), closed loop, 4 keep-alive connections, "
        f"{seconds:.0f} s each; this tree vs {commit} (stdlib ThreadingHTTPServer)"
    )
    rates: dict[str, list[float]] = {"this tree": [], commit: []}
    for k in range(rounds):
        for name, t in (("this tree", None), (commit, tree)):
            d = DaemonProc(
                tmp / f"http-{k}-{name.split()[0]}", "--set", "pipeline.consumer=counting", tree=t
            )
            try:
                line = http_blast(d.ports["otlp_http"], bodies, seconds)
                rates[name].append(float(line.split()[0].replace(",", "")))
                print(f"  round {k + 1} {name:>10s}: {line}; daemon peak RSS {d.hwm_mb():.0f} MB")
            finally:
                d.stop()
    new, old = (sum(v) / len(v) for v in rates.values())
    print(f"  mean: this tree {new:,.0f} events/s = {new / old:.2f}x {commit}'s {old:,.0f}")
    return _verdict([("OTLP/HTTP throughput ≥ the stdlib server's (same run)", new >= old)])


def _pin(core: int) -> None:
    if hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) > 1:
        os.sched_setaffinity(0, {core})


class DaemonProc:
    """``python -m coeffd serve`` pinned to one core, JSON logs parsed for its ports."""

    def __init__(self, tmp: Path, *settings: str, tree: Path | None = None) -> None:
        # tree: run the coeffd package found there (another commit's), not this one
        launcher = [sys.executable, "-m", "coeffd"] if tree is None else _launcher(tree)
        cmd = [
            *launcher, "serve", "--log-format", "json", "--log-level", "info",
            "--http-endpoint", "127.0.0.1:0", "--otlp-grpc-endpoint", "127.0.0.1:0",
            "--otlp-http-endpoint", "127.0.0.1:0", "--snapshot-dir", str(tmp / "snapshots"),
            "--state-dir", str(tmp / "state"), *settings,
        ]  # fmt: skip
        if shutil.which("taskset") and (os.cpu_count() or 1) > 1:
            cmd = ["taskset", "-c", "1", *cmd]
        self.proc = subprocess.Popen(
            cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        self.ports: dict[str, int] = {}
        #: The last log lines (bench soak reports them when the daemon dies).
        self.tail: collections.deque[str] = collections.deque(maxlen=200)
        #: Warning and error log events: event -> [count, first line].
        self.notable: dict[str, list[Any]] = {}
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.tail.append(line)
            if '"coeffd started"' in line:
                self.ports = {
                    k: int(re.search(rf'"{k}": (\d+)', line).group(1))  # type: ignore[union-attr]
                    for k in ("http", "otlp_grpc", "otlp_http")
                }
                break
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.tail.append(line)
            if '"level": "warning"' in line or '"level": "error"' in line or "Traceback" in line:
                m = re.search(r'"event": "([^"]*)"', line)
                seen = self.notable.setdefault(m.group(1) if m else line[:80], [0, line.strip()])
                seen[0] += 1

    def last_lines(self, n: int) -> str:
        """The last ``n`` log lines, joined."""
        return " | ".join(line.strip() for line in list(self.tail)[-n:])

    def find(self, text: str) -> str | None:
        """The last kept log line containing ``text``."""
        return next((line.strip() for line in reversed(self.tail) if text in line), None)

    def metrics(self) -> dict[str, Any]:
        url = f"http://127.0.0.1:{self.ports['http']}/metrics"
        with urllib.request.urlopen(url, timeout=10) as r:
            text = r.read().decode()
        out: dict[str, Any] = {}
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                out.setdefault(s.name, []).append((s.labels, s.value))
        return out

    def total(self, name: str, **labels: str) -> float:
        return sum(
            v
            for lab, v in self.metrics().get(name, [])
            if all(lab.get(k) == want for k, want in labels.items())
        )

    def rss_mb(self) -> float:
        pid = self.proc.pid
        # taskset execs the daemon in place, so the pid is the daemon's
        status = Path(f"/proc/{pid}/status").read_text()
        return int(re.search(r"VmRSS:\s+(\d+)", status).group(1)) / 1024  # type: ignore[union-attr]

    def hwm_mb(self) -> float:
        """Peak RSS so far (``VmHWM``)."""
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        return int(re.search(r"VmHWM:\s+(\d+)", status).group(1)) / 1024  # type: ignore[union-attr]

    def stop(self) -> None:
        self.stop_code()

    def stop_code(self) -> int | None:
        """SIGTERM, wait up to 60 s (then SIGKILL); the exit code (None if killed)."""
        self.proc.terminate()
        try:
            return self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            return None


def quantile(buckets: list[tuple[float, float]], q: float) -> float:
    """``q`` quantile of a cumulative Prometheus histogram (upper bucket bound)."""
    if not buckets or buckets[-1][1] == 0:
        return float("nan")
    total = buckets[-1][1]
    for le, c in buckets:
        if c >= q * total:
            return le
    return float("inf")


def histogram(d: DaemonProc, name: str) -> list[tuple[float, float]]:
    rows = d.metrics().get(name + "_bucket", [])
    return sorted((float(lab["le"]), v) for lab, v in rows)


def ramp(
    d: DaemonProc, rec: Recording, levels: list[float], seconds: float, warm: float = 0.0
) -> tuple[float, list[str]]:
    """Rising levels until push-back; returns the sustained rate and report lines.

    ``warm``: seconds each level runs before its measured ``seconds`` (push-backs count
    in both). The learning daemon needs ``joiner.window_s`` of it: step observations are
    learned a window after their spans arrive, so without it a level would be measured
    while the learners still work on the previous, lower level's data.
    """
    sender = LiveSender(d.ports["otlp_grpc"], rec)
    sustained = 0.0
    lines = []
    try:
        for level in levels:
            rate = sender.offered(level)
            learned0 = d.total("coeffd_learner_observations_total", target="step_period")
            out0, in0 = (
                d.total("coeffd_events_sampled_out_total"),
                d.total("coeffd_events_received_total"),
            )
            t_level = time.monotonic()
            sent, pushbacks, dt = sender.level(rate, seconds, warm=warm)
            got = sent / dt
            steps = d.total("coeffd_learner_observations_total", target="step_period")
            keep = d.total("coeffd_learning_keep_ratio")
            share = d.total("coeffd_engine_sample_ratio")
            out = d.total("coeffd_events_sampled_out_total") - out0
            taken = d.total("coeffd_events_received_total") - in0
            # Live data is bursty (a request carries tens to thousands of events), so a
            # window's deliveries scatter around the rate (±6 % seen unloaded); saturation
            # shows as push-back, as requests leaving late because earlier ones are still
            # in flight, or as deliveries clearly short of the rate.
            ok = pushbacks == 0 and sender.lag < LAG_LIMIT_S and got >= 0.9 * rate
            learning = (
                f"  steps learned {(steps - learned0) / (time.monotonic() - t_level):6,.0f}/s"
                f" (keep ratio {keep:.2f})  engine share {share:.3f}"
                f" ({out / max(1.0, out + taken):4.0%} of events sampled out)"
                if warm
                else ""
            )
            lines.append(
                f"  {rate:>9,.0f} ev/s offered  {got:>9,.0f} delivered  push-backs {pushbacks:>4}"
                f"  lag {sender.lag:5.2f} s{learning}  {'ok' if ok else 'saturated'}"
            )
            if not ok:
                break
            sustained = rate
    finally:
        sender.close()
    return sustained, lines


def accuracy(d: DaemonProc, target: str = "step_period") -> str:
    """The rolling step-time error per configuration, learned vs BLIS's defaults: what
    learning under load (shedding, engine sampling) still achieves."""
    by: dict[str, dict[str, float]] = {}
    for lab, v in d.metrics().get("coeffd_prediction_mape_ratio", []):
        if lab.get("target") == target:
            by.setdefault(lab["coefficients"], {})[lab["config"]] = v
    learned, default = sorted(by.get("learned", {}).values()), by.get("blis_default", {})
    if not learned:
        return "  no configuration has a rolling step-time error yet"
    ratios = sorted(v / default[c] for c, v in by["learned"].items() if default.get(c))
    return (
        f"  step-time MAPE over {len(learned)} configurations: learned median "
        f"{learned[len(learned) // 2]:.1%} (max {learned[-1]:.1%}); learned/default median "
        f"{ratios[len(ratios) // 2] if ratios else float('nan'):.2f}"
    )


def hundred_configs(seconds: float) -> list[Any]:
    """100 engines, each its own configuration (the fleet's models/GPUs, varied knobs)."""
    base = [s for s in build("fleet", seconds) if s.serving.dp == 1]
    out = []
    for i in range(100):
        b = base[i % len(base)]
        serving = dataclasses.replace(b.serving, max_num_seqs=128 + i)
        out.append(dataclasses.replace(b, name=f"bench-{i}", serving=serving))
    return out


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench serve", description=__doc__)
    p.add_argument("--seconds", type=float, default=6.0, help="seconds per rate level")
    p.add_argument("--quick", action="store_true", help="fewer levels, shorter recording")
    p.add_argument(
        "--part",
        choices=("all", "rate", "rss", "http"),
        default="all",
        help="rate: throughput and freshness only; rss: the 100-configuration RSS only; "
        "http: OTLP/HTTP ingest of this tree vs the stdlib-server commit (--base); with "
        "--sampling default, rate: this tree and the baseline revision only",
    )
    p.add_argument("--base", default=None, help="--part http: the commit to compare with")
    p.add_argument("--rounds", type=int, default=2, help="--part http: alternations")
    p.add_argument(
        "--sampling",
        choices=("dense", "default"),
        default="dense",
        help="dense: events/s with every step sampled (the parts above); default: engines "
        "per core at vLLM's default sampling with nothing shed (bench/_fleetsize.py)",
    )
    p.add_argument(
        "--baseline-rev",
        default="7e2957b",
        help="--sampling default: the revision whose daemon is measured beside ('none': skip)",
    )
    p.add_argument(
        "--start",
        type=int,
        default=None,
        help="--sampling default: engines at the first level (8; --quick: 64)",
    )
    p.add_argument(
        "--bisect", type=int, default=None, help="--sampling default: bisections (3; --quick: 1)"
    )
    args = p.parse_args(argv)
    if args.sampling == "default":
        from bench import _fleetsize

        return _fleetsize.main(args)
    levels = [10e3, 20e3, 40e3, 60e3, 80e3, 100e3, 120e3, 135e3, 150e3, 175e3, 200e3, 250e3, 300e3]
    coarse = [20e3, 40e3, 60e3, 70e3, 80e3, 90e3, 100e3, 120e3, 150e3, 175e3, 200e3]
    if args.quick:
        levels = coarse = [10e3, 40e3, 80e3, 150e3]
    _pin(0)
    print("recording the fleet scenario (simfleet, in memory)…", flush=True)
    rec = record("fleet", 20 if args.quick else 60, 7, RATES)
    print(f"  {len(rec.requests)} export requests, {rec.total:,} events per round")
    tmp = Path(tempfile.mkdtemp(prefix="coeffd-bench-"))
    if args.part == "http":
        try:
            return http_compare(tmp, rec, args.seconds, args.rounds, args.base)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    fast = ("--set", "pipeline.tick_interval_seconds=0.25", "--set", "publish.interval_seconds=0.5")
    results: dict[str, float] = {}
    verdicts: list[tuple[str, bool]] = []
    try:
        daemons = (
            ("baseline (counting consumer)", ("--set", "pipeline.consumer=counting"), 0.0),
            ("learning daemon", (), WINDOW_S + 2),
            # the same without engine sampling: every engine decoded and joined
            (NO_SAMPLING, ("--set", "pipeline.sample_engines=false"), WINDOW_S + 2),
        )
        for name, extra, warm in daemons if args.part != "rss" else ():
            d = DaemonProc(tmp / name.split()[0], *fast, *extra)
            try:
                print(
                    f"\n{name}: rising rates, {args.seconds:.0f} s each"
                    + (f" after {warm:.0f} s at the rate (steady state)" if warm else "")
                )
                sustained, lines = ramp(d, rec, levels if not warm else coarse, args.seconds, warm)
                print("\n".join(lines))
                print(f"  sustained: {sustained:,.0f} events/s")
                if warm:
                    print(accuracy(d))
                results[name] = sustained
                if name == "learning daemon" and sustained > 0:
                    d.stop()
                    d = DaemonProc(tmp / "fresh", *fast)
                    sender = LiveSender(d.ports["otlp_grpc"], rec)
                    half = sender.offered(sustained / 2)
                    sender.level(half, 60.0)
                    sender.close()
                    time.sleep(2)
                    obs = histogram(d, "coeffd_snapshot_freshness_seconds")
                    step = histogram(d, "coeffd_step_freshness_seconds")
                    p99 = quantile(obs, 0.99)
                    print(
                        f"  freshness at {half:,.0f} ev/s (live clock, publish.interval_seconds"
                        f" = 0.5): observation→snapshot p50 ≤ {quantile(obs, 0.5)} s, "
                        f"p99 ≤ {p99} s; step summary→snapshot p50 ≤ {quantile(step, 0.5)} s, "
                        f"p99 ≤ {quantile(step, 0.99)} s (waits joiner.window_s for journeys)"
                    )
                    verdicts.append(("p99 freshness ≤ 1 s at half load", p99 <= 1.0))
            finally:
                d.stop()
        if results:
            base, learn, every = results.values()
            verdicts.append(("≥ 150,000 events/s end to end", learn >= 150_000))
            print(
                f"\nend to end: {learn:,.0f} events/s sustained = {learn / base:.2f}× the "
                f"counting-only baseline ({base:,.0f}), which decodes every engine; joining "
                f"every engine (no engine sampling): {every:,.0f} = {every / base:.2f}×; "
                "target ≥ 150,000"
            )
        if args.part == "rate":
            return _verdict(verdicts)
        print("\n100 configurations: recording…", flush=True)
        rec100 = record(hundred_configs(10), 10, 8, SampleRates(1.0, 0.5, 0.02, 100))
        d = DaemonProc(tmp / "hundred", *fast)
        try:
            idle = d.rss_mb()
            paced = Sender(d.ports["otlp_grpc"], rec100)
            paced.level(20e3, 1.2 * rec100.total / 20e3)
            paced.close()
            time.sleep(3)
            configs = d.total("coeffd_configurations")
            rss = d.rss_mb()
            print(
                f"  RSS {rss:.0f} MB with {configs:.0f} configurations learned "
                f"(idle daemon {idle:.0f} MB, ratio {rss / idle:.2f}×); target ≤ 150 MB"
            )
            verdicts.append(("RSS ≤ 150 MB with 100 configurations", rss <= 150))
        finally:
            d.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return _verdict(verdicts)


def _verdict(verdicts: list[tuple[str, bool]]) -> int:
    for what, ok in verdicts:
        print(f"  [{'PASS' if ok else 'FAIL'}] {what}")
    return 0 if all(ok for _, ok in verdicts) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
