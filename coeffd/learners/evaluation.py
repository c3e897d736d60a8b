"""Prequential evaluation: every observation is predicted before it is learned.

Why prequential. It is the only honest error of an online learner (test-then-train,
Dawid 1984): nothing is ever scored on data it has seen, and it needs no hold-out set.
Errors are kept per configuration, target and *coefficient source* — ``learned``,
``blis_default`` (BLIS's shipped vector) and ``batch_refit`` (NNLS over a sliding window,
refitted every M rows, the usual offline recipe run online) — on the same stream, so the
gain over both is visible, and sliced by regime (prefill-heavy, decode-heavy, mixed,
KV-saturated) because a single mean hides a model that is right on decode steps and wrong
on prefills.

>>> ev = Evaluator(window=100)
>>> for y, p in [(100.0, 110.0), (200.0, 190.0)]:
...     _ = ev.record("cfg", "step_period", y, {"learned": p, "blis_default": 2 * p}, "mixed")
>>> s = ev.summary("cfg", "step_period")
>>> round(s["learned"]["all"]["mape"], 4), s["learned"]["mixed"]["n"]
(0.075, 2.0)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from coeffd.learners import native as _native
from coeffd.learners.nnls import nnls_fast

__all__ = [
    "REGIMES",
    "Evaluator",
    "RollingError",
    "WindowedRefit",
    "regime_batches",
    "regime_error",
    "regime_std",
    "step_regime",
    "step_regimes",
]

FloatArray = npt.NDArray[np.float64]

REGIMES: tuple[str, ...] = ("prefill_heavy", "decode_heavy", "mixed", "kv_saturated")


def step_regime(
    prefill_tokens: float,
    decode_tokens: float,
    kv_usage: float,
    *,
    heavy_fraction: float = 0.8,
    kv_saturated: float = 0.9,
) -> str:
    """Regime of a step; KV saturation wins over the token mix.

    >>> step_regime(4000, 10, 0.3), step_regime(0, 64, 0.5), step_regime(500, 500, 0.95)
    ('prefill_heavy', 'decode_heavy', 'kv_saturated')
    """
    if kv_usage >= kv_saturated:
        return "kv_saturated"
    total = prefill_tokens + decode_tokens
    if total <= 0:
        return "mixed"
    if prefill_tokens / total >= heavy_fraction:
        return "prefill_heavy"
    if decode_tokens / total >= heavy_fraction:
        return "decode_heavy"
    return "mixed"


def step_regimes(
    prefill_tokens: FloatArray,
    decode_tokens: FloatArray,
    kv_usage: FloatArray,
    *,
    heavy_fraction: float = 0.8,
    kv_saturated: float = 0.9,
) -> list[str]:
    """:func:`step_regime` of many steps (arrays of the three figures), in a few array
    operations instead of a call per step: the same comparisons of the same quotients.

    >>> import numpy as np
    >>> step_regimes(np.array([4000.0, 0, 500, 0]), np.array([10.0, 64, 500, 0]),
    ...              np.array([0.3, 0.5, 0.95, 0.1]))
    ['prefill_heavy', 'decode_heavy', 'kv_saturated', 'mixed']
    """
    total = prefill_tokens + decode_tokens
    some = total > 0
    with np.errstate(divide="ignore", invalid="ignore"):
        pre = some & (prefill_tokens / total >= heavy_fraction)
        dec = some & ~pre & (decode_tokens / total >= heavy_fraction)
    code = np.where(kv_usage >= kv_saturated, 3, np.where(pre, 0, np.where(dec, 1, 2)))
    return [_REGIME_OF_CODE[c] for c in code.tolist()]


#: step_regimes' codes
_REGIME_OF_CODE = ("prefill_heavy", "decode_heavy", "mixed", "kv_saturated")


def regime_batches(max_tokens: int = 2048, max_seqs: int = 256) -> dict[str, list[list[Any]]]:
    """A fixed set of batches per regime (BLIS ``BatchRequest`` lists), for judging a β
    where it matters rather than on whatever the engine happened to run.

    Deterministic for a token budget and sequence limit: prefill-heavy (one long
    chunked prefill, or a few short prompts, filling the budget), decode-heavy (8, 32
    and 128 decodes at 500–3,000 tokens of context), mixed (a prefill chunk beside 16–64
    decodes), KV-saturated (as many long decodes as fit ~130,000 KV tokens, an 8B model
    on an 80 GB GPU, with a small prefill chunk).

    >>> b = regime_batches()
    >>> sorted(b) == sorted(REGIMES), all(len(v) >= 3 for v in b.values())
    (True, True)
    """
    from coeffd.records.observations import BatchRequest as R

    budget = max(64, int(max_tokens))
    seqs = max(4, int(max_seqs))

    def decodes(n: int, ctx: int) -> list[Any]:
        return [R(ctx // 2, ctx + 7 * i, 1, 256) for i in range(min(n, seqs))]

    chunk = budget // 2
    return {
        "prefill_heavy": [
            [R(4 * budget, 0, budget, 128)],  # first chunk of a long prompt
            [R(4 * budget, 2 * budget, budget, 128)],  # a later chunk: more attention
            [R(budget // 4, 0, budget // 4, 128) for _ in range(4)],  # short prompts
        ],
        "decode_heavy": [decodes(8, 500), decodes(32, 1500), decodes(128, 3000)],
        "mixed": [
            [R(2000, 0, chunk, 200), *decodes(16, 800)],
            [R(6000, 2000, chunk, 200), *decodes(64, 1500)],
            [R(chunk, 0, chunk, 200), R(chunk, 0, chunk // 2, 200), *decodes(32, 1000)],
        ],
        "kv_saturated": [
            decodes(96, 1300),
            decodes(64, 2000),
            [R(budget, 0, 256, 100), *decodes(120, 1000)],
        ],
    }


def regime_error(
    terms: Mapping[str, FloatArray], beta: Sequence[float], truth: Sequence[float]
) -> dict[str, float]:
    """Mean ``|x·β − x·β_true| / x·β_true`` over each regime's batch terms ``x`` (rows):
    the error of a coefficient vector against the noiseless truth, per regime.

    >>> import numpy as np
    >>> t = {"mixed": np.array([[1.0, 1.0], [2.0, 0.0]])}
    >>> regime_error(t, [1.1, 1.0], [1.0, 1.0])["mixed"]  # doctest: +ELLIPSIS
    0.075...
    """
    b = np.asarray(beta, dtype=float)
    tb = np.asarray(truth, dtype=float)
    out = {}
    for regime, x in terms.items():
        ref = x @ tb
        out[regime] = float(np.mean(np.abs(x @ b - ref) / ref))
    return out


def regime_std(
    terms: Mapping[str, FloatArray], beta: Sequence[float], covariance: FloatArray
) -> dict[str, float]:
    """Mean relative standard error ``√(xᵀΣx) / x·β`` of the predicted step time over each
    regime's batches: the learner's own estimate of its error against the noiseless
    truth (``Σ``: the posterior covariance of β).

    >>> import numpy as np
    >>> regime_std({"mixed": np.array([[1.0, 0.0]])}, [2.0, 1.0], np.eye(2) * 0.01)
    {'mixed': 0.05}
    """
    b = np.asarray(beta, dtype=float)
    out = {}
    for regime, x in terms.items():
        var = np.einsum("ij,jk,ik->i", x, covariance, x)
        out[regime] = float(np.mean(np.sqrt(np.maximum(var, 0.0)) / np.maximum(x @ b, 1e-300)))
    return out


class _Ring:
    """The last ``size`` values (floats, or rows of ``width`` floats) in a preallocated
    array: 4 bytes a float32 value, not a boxed float in a deque. These windows exist per
    configuration × target × source × regime; an error rate needs no more than float32's
    7 digits."""

    __slots__ = ("_buf", "_i", "n")

    def __init__(self, size: int, width: int | None = None, dtype: Any = np.float32) -> None:
        self._buf = np.empty(size if width is None else (size, width), dtype=dtype)
        self._i = 0
        self.n = 0

    def append(self, v: float | Sequence[float] | FloatArray) -> None:
        self._buf[self._i] = v
        self._i = (self._i + 1) % len(self._buf)
        if self.n < len(self._buf):
            self.n += 1

    def extend(self, values: npt.NDArray[Any]) -> None:
        """Append many values in order (the same ring content as appending one by one)."""
        buf, size, n = self._buf, len(self._buf), len(values)
        if n >= size:
            buf[:] = values[n - size :]
            self._i, self.n = 0, size
            return
        i = self._i
        end = i + n
        if end <= size:
            buf[i:end] = values
        else:
            k = size - i
            buf[i:] = values[:k]
            buf[: end - size] = values[k:]
        self._i = end % size
        self.n = min(size, self.n + n)

    def values(self) -> npt.NDArray[Any]:
        """The values held (storage order, not arrival order)."""
        return self._buf[: self.n]

    def last(self, k: int) -> npt.NDArray[Any]:
        """The ``k`` values appended last (``k`` ≤ :attr:`n`), oldest first, as a copy.

        >>> r = _Ring(4, dtype=np.float64)
        >>> r.extend(np.arange(6.0))
        >>> r.last(3).tolist()
        [3.0, 4.0, 5.0]
        """
        i, size = self._i, len(self._buf)
        if k <= i:
            return self._buf[i - k : i].copy()
        return np.concatenate([self._buf[size - (k - i) :], self._buf[:i]])

    def mean(self) -> float:
        return float(self.values().mean(dtype=np.float64)) if self.n else math.nan


class RollingError:
    """Rolling absolute-percentage and squared error over the last ``window`` rows."""

    __slots__ = ("_ape", "_se", "n_total")

    def __init__(self, window: int) -> None:
        self._ape = _Ring(window)
        self._se = _Ring(window)
        self.n_total = 0

    def update(self, y: float, yhat: float) -> float:
        """Record one prediction; returns its relative error ``|y − ŷ| / |y|``."""
        err = y - yhat
        rel = abs(err) / abs(y) if y != 0 else (0.0 if err == 0 else math.inf)
        if math.isfinite(rel):
            self._ape.append(rel)
        self._se.append(err * err)
        self.n_total += 1
        return rel

    def update_many(self, y: FloatArray, yhat: FloatArray) -> None:
        """:meth:`update` for many rows, in order."""
        rel, se = _errors(y, yhat)
        self.update_errors(rel, se)

    def update_errors(self, rel: FloatArray, se: FloatArray) -> None:
        """:meth:`update_many` of rows whose relative and squared errors are known
        (:func:`_errors`): a burst's errors are computed once and split by regime."""
        self._ape.extend(rel[np.isfinite(rel)])
        self._se.extend(se)
        self.n_total += len(se)

    @property
    def mape(self) -> float:
        return self._ape.mean()

    @property
    def rmse(self) -> float:
        return math.sqrt(self._se.mean()) if self._se.n else math.nan

    def as_dict(self) -> dict[str, float]:
        return {"mape": self.mape, "rmse": self.rmse, "n": float(self._se.n)}


def _errors(y: FloatArray, yhat: FloatArray) -> tuple[FloatArray, FloatArray]:
    """Relative errors ``|y − ŷ| / |y|`` (0 where exact, inf/NaN where ``y`` is 0) and
    squared errors of rows, as :meth:`RollingError.update` computes them one by one."""
    err = y - yhat
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.where(err == 0.0, 0.0, np.abs(err) / np.abs(y))
    return rel, err * err


class Evaluator:
    """Rolling prequential errors per (configuration, target, coefficients, regime)."""

    def __init__(self, window: int = 500) -> None:
        self.window = window
        self._err: dict[tuple[str, str, str, str], RollingError] = {}
        # Rows recorded one at a time wait here (y, ŷ per window) and enter their windows
        # in one array update when anything reads them: a finished request scores four
        # targets, and two ring appends per source and row cost more than learning it.
        self._pending: dict[tuple[str, str, str, str], tuple[list[float], list[float]]] = {}

    def record(
        self,
        config: str,
        target: str,
        y: float,
        predictions: Mapping[str, float],
        regime: str | None = None,
    ) -> dict[str, float]:
        """Score one observation for each coefficient source; returns relative errors."""
        out: dict[str, float] = {}
        if not math.isfinite(y):
            return out
        for source, yhat in predictions.items():
            if yhat is None or not math.isfinite(yhat):
                continue
            for reg in ("all", regime) if regime else ("all",):
                key = (config, target, source, reg)
                rows = self._pending.get(key)
                if rows is None:
                    rows = self._pending[key] = ([], [])
                rows[0].append(y)
                rows[1].append(yhat)
                if len(rows[0]) >= self.window:  # bounded while nothing reads
                    self._flush()
            err = y - yhat
            out[source] = abs(err) / abs(y) if y != 0 else (0.0 if err == 0 else math.inf)
        return out

    def add_scored(
        self, config: str, target: str, y: float, learned: float, default: float | None
    ) -> None:
        """:meth:`record` of a row without a regime, returning nothing, for the
        predictions ``learned`` and ``default`` (sources ``"learned"`` and
        ``"blis_default"``; ``default`` None: the learned one alone): a finished request's
        scores (:class:`~learners.estimates.RequestScores`), one call per target, so no
        dict is built and the loop is kept short."""
        if not math.isfinite(y):
            return
        pending = self._pending
        for source, yhat in (("learned", learned), ("blis_default", default)):
            if yhat is None or not math.isfinite(yhat):
                continue
            key = (config, target, source, "all")
            rows = pending.get(key)
            if rows is None:
                rows = pending[key] = ([], [])
            rows[0].append(y)
            rows[1].append(yhat)
            if len(rows[0]) >= self.window:  # bounded while nothing reads
                self._flush()
                pending = self._pending

    def add_scored_rows(
        self, config: str, rows: Sequence[tuple[str, float, float, float | None]]
    ) -> None:
        """:meth:`add_scored` of each ``(target, y, learned, default)`` row, in order: a
        burst of finished requests' scores in one call (the windows are per target and
        source, so each keeps its rows' order; when they are flushed does not matter)."""
        pending = self._pending
        window = self.window
        isfinite = math.isfinite
        # each target's pending (ys, predictions) per source, found once a burst (a
        # burst holds a few targets) and again after a flush replaces them; made on the
        # first row a source scores, as add_scored makes them
        lists: dict[tuple[str, str], tuple[list[float], list[float]]] = {}
        for target, y, learned, default in rows:
            if not isfinite(y):
                continue
            full = False
            for source, yhat in (("learned", learned), ("blis_default", default)):
                if yhat is None or not isfinite(yhat):
                    continue
                got = lists.get((target, source))
                if got is None:
                    key = (config, target, source, "all")
                    got = pending.get(key)
                    if got is None:
                        got = pending[key] = ([], [])
                    lists[(target, source)] = got
                got[0].append(y)
                got[1].append(yhat)
                full = full or len(got[0]) >= window
            if full:  # bounded while nothing reads
                self._flush()
                pending = self._pending
                lists.clear()

    def _flush(self) -> None:
        """Put the rows recorded one at a time into their windows (the same windows as
        :meth:`RollingError.update` row by row: :meth:`RollingError.update_many`)."""
        if not self._pending:
            return
        pending, self._pending = self._pending, {}
        for (config, target, source, reg), (ys, ps) in pending.items():
            self._rolling(config, target, source, reg).update_many(np.array(ys), np.array(ps))

    def record_many(
        self,
        config: str,
        target: str,
        y: FloatArray,
        predictions: Mapping[str, FloatArray],
        regimes: Sequence[str] | None = None,
    ) -> None:
        """:meth:`record` for many rows at once (NaN = no prediction from that source);
        the windows end up exactly as after recording the rows one by one.

        >>> import numpy as np
        >>> a, b = Evaluator(window=4), Evaluator(window=4)
        >>> y, p = np.array([10.0, 20.0, 40.0]), np.array([11.0, np.nan, 30.0])
        >>> for i in range(3):
        ...     _ = a.record("c", "t", float(y[i]), {"m": float(p[i])}, ["x", "y", "x"][i])
        >>> b.record_many("c", "t", y, {"m": p}, ["x", "y", "x"])
        >>> a.summary("c", "t") == b.summary("c", "t")
        True
        """
        self._flush()  # rows recorded one at a time first, in order
        finite_y = np.isfinite(y)
        # regimes as small integer codes, numbered in order of first appearance, and each
        # one's rows found once for every source (not a string comparison per source)
        names: list[str] = []
        codes = masks = None
        if regimes is not None:
            names = list(dict.fromkeys(regimes))
            index = {r: i for i, r in enumerate(names)}
            codes = np.array([index[r] for r in regimes], dtype=np.intp)
            masks = [codes == i for i in range(len(names))]
        for source, yhat in predictions.items():
            ok = finite_y & np.isfinite(yhat)
            every = bool(ok.all())
            if not every and not ok.any():
                continue
            ys, ps = (y, yhat) if every else (y[ok], yhat[ok])
            rel, se = _errors(ys, ps)  # once, then split by regime
            self._rolling(config, target, source, "all").update_errors(rel, se)
            if codes is None or masks is None:
                continue
            if every:
                order, rows = range(len(names)), masks
            else:
                c = codes[ok]
                seen, first = np.unique(c, return_index=True)
                order = seen[np.argsort(first)].tolist()  # first appearance, like record()
                rows = [c == i for i in range(len(names))]
            for i in order:
                reg = names[i]
                if reg:
                    m = rows[i]
                    self._rolling(config, target, source, reg).update_errors(rel[m], se[m])

    def _rolling(self, config: str, target: str, source: str, regime: str) -> RollingError:
        key = (config, target, source, regime)
        e = self._err.get(key)
        if e is None:
            e = self._err[key] = RollingError(self.window)
        return e

    def summary(self, config: str, target: str) -> dict[str, dict[str, dict[str, float]]]:
        """``{source: {regime or "all": {"mape", "rmse", "n"}}}``."""
        self._flush()
        out: dict[str, dict[str, dict[str, float]]] = {}
        for (c, t, source, reg), e in self._err.items():
            if c == config and t == target:
                out.setdefault(source, {})[reg] = e.as_dict()
        return out

    def mape(self, config: str, target: str, source: str = "learned", regime: str = "all") -> float:
        self._flush()
        e = self._err.get((config, target, source, regime))
        return e.mape if e is not None else math.nan

    def targets(self, config: str) -> list[str]:
        self._flush()
        return sorted({t for (c, t, _, _) in self._err if c == config})

    def drop(self, config: str) -> None:
        """Forget a configuration (bounded memory when the registry evicts it)."""
        self._flush()
        for key in [k for k in self._err if k[0] == config]:
            del self._err[key]


class WindowedRefit:
    """Batch baseline: NNLS on the last ``window`` rows, refitted every ``refit_every`` rows.

    Rows are weighted by ``1/y²`` so it minimises relative error, like the online learner.
    It is fed feature rows as arrays (the step basis' column order), not River dicts:
    :meth:`learn_row` / :meth:`predict_row`, or :meth:`learn_many_prequential`.

    Parameters
    ----------
    window
        Rows kept (the most recent).
    refit_every
        Learned rows between refits.
    n_features
        Columns of a row.
    initial
        Coefficients before the first refit (default zeros).

    Examples
    --------
    >>> m = WindowedRefit(window=50, refit_every=10, n_features=2)
    >>> for i in range(40):
    ...     m.learn_row([float(i % 7 + 1), 1.0], 2.0 * (i % 7 + 1) + 5.0)
    >>> round(m.predict_row([10.0, 1.0]), 6)
    25.0
    """

    def __init__(
        self, window: int, refit_every: int, n_features: int, initial: Sequence[float] | None = None
    ) -> None:
        self.window = window
        self.refit_every = refit_every
        # Ring buffers, not a deque of row arrays (~200 B of object overhead per row);
        # features stored as float32 (the refit is a reference fit: 7 digits are plenty,
        # and this window is the largest per-configuration buffer), fitted in float64.
        self._x = _Ring(window, n_features)
        self._y = _Ring(window, dtype=np.float64)
        self._since = 0
        # The window's information as a sum of per-refit blocks (the rows learned between
        # two refits), when the window is a whole number of them: a refit then weighs only
        # its new rows and adds the blocks, instead of the whole window's product (~10×
        # the work, every refit). Each row is [A (d×d) | b (d)] of one block.
        self._block_n = window // refit_every if window % refit_every == 0 else 0
        d = n_features
        self._blocks = np.zeros((max(self._block_n, 1), d * d + d))
        self._block_i = 0  # next block slot
        self._block_count = 0  # blocks held (≤ _block_n)
        self._fresh = 0  # rows learned since the last refit
        self.coef: FloatArray = (
            np.zeros(n_features) if initial is None else np.asarray(initial, dtype=float)
        )

    def learn_row(self, x: Sequence[float] | FloatArray, y: float) -> None:
        """Learn one row (``n_features`` values); ``y`` not finite and positive: ignored."""
        if not (math.isfinite(y) and y > 0):
            return
        self._x.append(x)
        self._y.append(y)
        self._since += 1
        self._fresh += 1
        if self._since >= self.refit_every:
            self._since = 0
            self.refit()

    def refit(self) -> None:
        if not self._y.n:
            return
        k, fresh = self.refit_every, self._fresh
        self._fresh = 0
        a = b = None
        fn = _native.refit
        if self._block_n and fresh == k and fn is not None and self._x._buf.dtype == np.float32:
            # the block and the solve below in one call of the compiled fold
            slot = self._block_i
            self._block_i = (slot + 1) % self._block_n
            self._block_count = min(self._block_count + 1, self._block_n)
            count = self._block_count
            if count * k == self._y.n:
                theta = np.empty(len(self.coef))
                if fn(
                    self._x._buf,
                    self._y._buf,
                    self._x._i,
                    k,
                    self._blocks,
                    slot,
                    count,
                    self.coef > 0,
                    theta,
                ):
                    self.coef = theta
                    return
            else:  # the block only: the window is not (yet) the blocks
                fn(
                    self._x._buf,
                    self._y._buf,
                    self._x._i,
                    k,
                    self._blocks,
                    slot,
                    1,
                    None,
                    np.empty(len(self.coef)),
                )
        elif self._block_n and fresh == k:
            # this refit's block: the rows since the last one (the same float32 values)
            x = self._x.last(k).astype(np.float64)
            y = self._y.last(k)
            w = 1.0 / (y * y)
            d = len(x[0])
            row = self._blocks[self._block_i]
            row[: d * d] = ((x * w[:, None]).T @ x).reshape(-1)
            row[d * d :] = x.T @ (w * y)
            self._block_i = (self._block_i + 1) % self._block_n
            self._block_count = min(self._block_count + 1, self._block_n)
            if self._block_count * k == self._y.n:  # the blocks are the window
                total = self._blocks[: self._block_count].sum(axis=0)
                a, b = total[: d * d].reshape(d, d), total[d * d :]
        else:
            self._block_count = 0  # out of step with the refits: start the blocks over
        if a is None or b is None:
            x = self._x.values().astype(np.float64)
            y = self._y.values()
            w = 1.0 / (y * y)
            a = (x * w[:, None]).T @ x
            b = x.T @ (w * y)
        # Tiny ridge keeps all-zero / collinear columns at 0 rather than undefined.
        a += np.eye(len(b)) * 1e-12 * max(float(np.trace(a)), 1e-300)
        # warm: the window moves by refit_every rows, its active set rarely (same optimum)
        self.coef = nnls_fast(a, b, self.coef > 0)

    def predict_row(self, x: Sequence[float] | FloatArray) -> float:
        """Predict one row (``n_features`` values) with the last refit's coefficients."""
        return float(np.asarray(x, dtype=float) @ self.coef)

    def rows(self) -> tuple[FloatArray, FloatArray]:
        """The rows held (float64 copies, storage order): what the fleet model scores
        leave-one-configuration-out errors on (``learners.fleet``)."""
        return self._x.values().astype(np.float64), self._y.values().astype(np.float64)

    def learn_many_prequential(self, X: FloatArray, y: FloatArray) -> FloatArray:
        """Predict each row, then learn it: the same as ``predict_row`` and ``learn_row``
        row by row, a segment (up to the next refit) at a time. Rows whose ``y`` is not
        finite and positive are predicted but not learned, as in ``learn_row``.

        >>> import numpy as np
        >>> a, b = WindowedRefit(8, 3, 1), WindowedRefit(8, 3, 1)
        >>> X, y = np.ones((10, 1)), np.arange(1.0, 11.0)
        >>> p = a.learn_many_prequential(X, y)
        >>> q = []
        >>> for i in range(10):
        ...     q.append(b.predict_row(X[i])); b.learn_row(X[i], float(y[i]))
        >>> bool(np.array_equal(p, q))
        True
        """
        out = np.empty(len(y))
        valid = np.isfinite(y) & (y > 0)
        i, n = 0, len(y)
        if valid.all():  # the usual batch: segments are plain slices, no index arrays
            while i < n:
                end = min(n, i + self.refit_every - self._since)
                out[i:end] = X[i:end] @ self.coef
                self._x.extend(X[i:end])
                self._y.extend(y[i:end])
                self._since += end - i
                self._fresh += end - i
                if self._since >= self.refit_every:
                    self._since = 0
                    self.refit()
                i = end
            return out
        while i < n:
            # rows up to (and including) the one that triggers the next refit
            need = self.refit_every - self._since
            hits = np.flatnonzero(valid[i:])
            end = n if len(hits) < need else i + int(hits[need - 1]) + 1
            seg = slice(i, end)
            out[seg] = X[seg] @ self.coef
            rows = np.flatnonzero(valid[seg]) + i
            self._x.extend(X[rows])
            self._y.extend(y[rows])
            self._since += len(rows)
            self._fresh += len(rows)
            if self._since >= self.refit_every:
                self._since = 0
                self.refit()
            i = end
        return out

    def summary(self) -> dict[str, Any]:
        return {"window": self.window, "refit_every": self.refit_every, "rows": self._y.n}
