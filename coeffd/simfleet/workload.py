"""Request arrival processes and prompt/output length distributions."""

from __future__ import annotations

import math
import random
from array import array
from collections.abc import Iterator
from dataclasses import dataclass

from coeffd.simfleet.config import Workload

# (prompt median, prompt sigma, output median, output sigma) of log-normal lengths
PROFILES: dict[str, tuple[float, float, float, float]] = {
    "mixed": (700.0, 0.8, 200.0, 0.8),
    "prefill-heavy": (2500.0, 0.5, 40.0, 0.6),
    "decode-heavy": (200.0, 0.6, 600.0, 0.5),
}

_VOCAB = 128_000


def _tokens(rng: random.Random, n: int) -> list[int]:
    """``n`` pseudo token ids < 65536 (uint16 from random bytes: ~50× faster than randrange)."""
    return list(array("H", rng.randbytes(2 * n))) if n > 0 else []


@dataclass(slots=True)
class Arrival:
    """One client request as the API server sees it (before rendering delays)."""

    index: int
    t_ns: int  # API-process mono time of api.ARRIVED
    prompt: list[int]  # token ids
    prefix_len: int  # tokens shared with other requests (system prompt)
    output_len: int  # tokens the model will generate before stopping
    max_tokens: int
    route: str  # /v1/chat/completions | /v1/completions
    stream: bool
    temperature: float
    top_p: float


class ArrivalProcess:
    """Deterministic (seeded) stream of ``Arrival``s from a ``Workload``."""

    def __init__(self, wl: Workload, seed: int, t0_ns: int) -> None:
        self._wl = wl
        self._rng = random.Random(seed)
        self._t0 = t0_ns
        prng = random.Random(seed ^ 0x5EED)
        self._prefixes = [
            _tokens(prng, prng.choice((256, 384, 512, 768, 1024)))
            for _ in range(max(1, wl.num_prefixes))
        ]
        if wl.profile not in PROFILES:
            raise ValueError(f"unknown workload profile {wl.profile!r}; known: {sorted(PROFILES)}")
        self._lengths = PROFILES[wl.profile]

    def _rate(self, t_s: float) -> float:
        wl = self._wl
        mult = 1.0
        for ts, m in wl.rate_schedule:
            if t_s >= ts:
                mult = m
        rate = wl.rate_per_s * mult
        if wl.process == "bursty":
            cycle = wl.burst_on_s + wl.burst_off_s
            on = (t_s % cycle) < wl.burst_on_s
            # Keep the long-run mean at rate_per_s: on-phase × burst_factor, off-phase scaled down.
            frac_on = wl.burst_on_s / cycle
            hi = rate * wl.burst_factor
            lo = max(0.0, (rate - hi * frac_on) / max(1e-9, 1 - frac_on))
            rate = hi if on else lo
        return max(rate, 1e-6)

    def __iter__(self) -> Iterator[Arrival]:
        rng = self._rng
        wl = self._wl
        pm, ps, om, os_ = self._lengths
        t_s = 0.0
        i = 0
        # Thinning against the max rate so rate changes are exact (Lewis–Shedler).
        rmax = wl.rate_per_s * max([1.0] + [m for _, m in wl.rate_schedule])
        if wl.process == "bursty":
            rmax *= wl.burst_factor
        while True:
            t_s += rng.expovariate(rmax)
            if rng.random() * rmax > self._rate(t_s):
                continue
            prompt_len = int(
                min(wl.max_model_len // 2, max(8, rng.lognormvariate(math.log(pm), ps)))
            )
            out_len = int(min(wl.max_model_len // 4, max(1, rng.lognormvariate(math.log(om), os_))))
            prefix: list[int] = []
            if rng.random() < wl.prefix_share:
                prefix = self._prefixes[rng.randrange(len(self._prefixes))]
                prefix = prefix[: max(0, prompt_len - 16)]
            body = _tokens(rng, prompt_len - len(prefix))
            chat = rng.random() < wl.chat_fraction
            at_length = rng.random() < wl.length_finish_fraction
            max_tokens = out_len if at_length else out_len + 1 + rng.randrange(256)
            yield Arrival(
                index=i,
                t_ns=self._t0 + int(t_s * 1e9),
                prompt=prefix + body,
                prefix_len=len(prefix),
                output_len=out_len,
                max_tokens=max_tokens,
                route="/v1/chat/completions" if chat else "/v1/completions",
                stream=chat and rng.random() < wl.stream_fraction,
                temperature=rng.choice((0.0, 0.7, 1.0)),
                top_p=rng.choice((1.0, 0.95, 0.9)),
            )
            i += 1
