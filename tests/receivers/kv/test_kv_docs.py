"""The docs say what KV's security is (issue 32, item 5): vLLM's ZMQ publisher has no TLS
and no token, so coeffd's KV subscriber has none either, and every place that tells an
operator how to run KV says to keep it on localhost or behind a NetworkPolicy. (They
said every receiver had TLS and auth.)"""

from __future__ import annotations

import re
from pathlib import Path

import coeffd.base.security
from coeffd.daemon.settings import KVSettings

ROOT = Path(__file__).resolve().parents[3]


def _says_kv_is_unauthenticated(text: str) -> bool:
    flat = re.sub(r"\s+", " ", text)
    return (
        re.search(r"no TLS (and|or) no token|no TLS or token|neither", flat) is not None
        and "localhost" in flat
        and "NetworkPolicy" in flat
    )


def _section(path: Path, start: str, end: str) -> str:
    text = path.read_text()
    i = text.index(start)
    return text[i : text.index(end, i + len(start))]


def test_operator_docs_say_kv_has_no_transport_security() -> None:
    places = {
        "README 'Pointing vLLM at coeffd'": _section(
            ROOT / "README.md", "## Pointing vLLM at coeffd", "\n## "
        ),
        "helm README 'Data, KV events'": _section(
            ROOT / "helm/coeffd/README.md", "## Data, KV events", "\n## "
        ),
        "config.example.toml [kv]": _section(ROOT / "config.example.toml", "[kv]", "\n["),
        "KVSettings": KVSettings.__doc__ or "",
        "base.security": coeffd.base.security.__doc__ or "",
    }
    for where, text in places.items():
        assert _says_kv_is_unauthenticated(text), where


def test_no_doc_claims_every_receiver_or_listener_is_guarded() -> None:
    guarded = r"(TLS|token|auth)"
    every = r"(every|each|all) (receiver|listener)s?\b"
    claim = re.compile(rf"{every}[^.\n]*\b{guarded}|{guarded}[^.\n]*\b{every}", re.I)
    for path in [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *ROOT.glob("coeffd/**/*.py")]:
        for m in claim.finditer(path.read_text()):
            context = m.group(0)
            assert re.search(r"HTTP|OTLP|gRPC", context), f"{path}: {context!r}"
