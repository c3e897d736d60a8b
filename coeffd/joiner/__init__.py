"""Sliding-window joiner: event records → training observations (issue #4).

Flow (``Joiner.push``/``push_many`` per record batch, ``tick`` on a timer, ``flush`` at
shutdown; single-threaded):

* **Steps** (:mod:`.engine`), per EngineCore (``Source.id``), never globally. Every
  ``step.BATCH_SUMMARY`` waits ``window_s`` of that engine's wall clock for the journey
  anchors around it, then becomes a ``StepObservation`` or a counted rejection. The target
  is the busy-loop time of batch N: ``S(N+1)-S(N)`` (sync) or ``S(N+2)-S(N+1)`` (async,
  spec §2.5.5). Each ``S(n)`` is exact from a summary or an interval from journey anchors
  of the same process clock (SCHEDULED/PREEMPTED(n), QUEUED(n-1), FIRST_TOKEN/FINISHED
  (n-1-async)); the anchor offsets start from safe priors and are calibrated on steps
  that carry both. Period = difference of the two intervals; method = consecutive
  summaries / completion anchors (both ends) / journey anchors; uncertainty = half-width
  + a loop-jitter floor. Rejected: warm-up steps, empty steps (the 1 ms sleeps, the
  hand-off before idling), async batches followed by an empty schedule, periods above
  ``max_period_ms`` or ``outlier_factor`` × the recent median (idle gaps/stalls),
  inconsistent anchors, and uncertainty above ``max_uncertainty_fraction``.
  Async mode: ``JoinerConfig.async_scheduling``, else the resource attribute
  ``coeffd.async_scheduling``, else inferred per engine from FIRST_TOKEN/FINISHED(N-1)
  falling before ``S(N)`` (sync) or after ``E(N)`` (async).
  Composition: snapshots of every running request (exact), else the journeys of the
  requests running in that step (accepted only if they reproduce the summary totals),
  else the summary aggregates. A journey is exported only when its request ends, so a
  step whose requests outlive the window (long generations: minutes in production) has
  its period decided at the window but waits for the journeys still missing, up to
  ``composition_wait_s`` (default ``max_lateness_s``) after its summary and at most
  ``max_composition_waits`` steps per engine (:mod:`.waits`): the aggregates' decode
  context is an estimate (12 % low under prefix sharing), so such steps otherwise bias
  the learned step time. The ``S(n)`` estimates and the loop mode live in
  :mod:`.starts`; the loop wait of request observations in :mod:`.loopwait`.
* **Requests** (:mod:`.requests`): ``llm_core`` ↔ ``llm_request`` by trace id and parent
  span id; API and EngineCore mono clocks are compared only after equal wall−mono offsets
  prove one host (else rejected ``different_hosts``). Queue state = nearest summary to the
  QUEUED step, final once the step spans around it have all arrived.
* **KV transfers** (:mod:`.kv`): Initiated ↔ Completed per (publisher, DP rank,
  transfer id), TP copies counted once, either order; attached to the step observation of
  the step they were issued in (publisher linked to the engine by source id or a shared
  resource key).
"""

from coeffd.joiner.config import AnchorPriors, JoinerConfig
from coeffd.joiner.joiner import Joiner
from coeffd.joiner.metrics import JoinerMetrics

__all__ = ["AnchorPriors", "Joiner", "JoinerConfig", "JoinerMetrics"]
