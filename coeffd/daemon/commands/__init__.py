"""coeffd subcommands, one module each (``coeffd.daemon.commands.<name>``).

:data:`COMMANDS` names them in help order with their one-line help, so ``coeffd --version``
and ``coeffd -h`` import none of them, and ``coeffd NAME`` imports only NAME's module
(:func:`coeffd.daemon.cli.build_parser`): importing every command up front pulled in numpy,
River and gRPC and made ``coeffd --version`` take 2.1 s. Each module's ``add_parser`` gives
the same help (``tests/daemon/test_cli_lazy.py`` compares them).
"""

from __future__ import annotations

__all__ = ["COMMANDS"]

#: Command name → its one-line help, in help order. A new command is a module here and a line.
COMMANDS: dict[str, str] = {
    "serve": "run the daemon: receivers, joiner, learners, snapshots, /metrics and /v1 API",
    "demo": "run the daemon fed by a built-in synthetic vLLM fleet, with a live view",
    "replay": "replay OTLP trace files (Collector file exporter) through the pipeline",
    "simfleet": "run a synthetic vLLM fleet emitting vLLM's telemetry with known true coefficients",
    "pull": "fetch learned coefficients (BLIS flags, blis run args, YAML, JSON) or "
    "rewrite a BLIS defaults.yaml",
    "configurations": "list the learned configurations: id, model, GPU, TP, knobs, version, "
    "observations, learned vs BLIS-default error",
    "basis": "print the BLIS trained-physics basis terms (and step time) for a batch",
    "trace": "write a configuration's recent requests as a BLIS TraceV2 pair "
    "(for blis replay and blis calibrate)",
}
