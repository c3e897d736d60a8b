"""``?version=`` is strict: ASCII decimal digits, bounded; anything else is a 400 (issue 17.10).

Before: 300 digits reached the file system (``File name too long`` → HTTP 500), and
``int()`` accepted ``1_0``, ``+3``, `` 7`` and non-ASCII digits as versions.
"""

from __future__ import annotations

import urllib.error
import urllib.parse
import urllib.request

import pytest
from publish_support import make_snapshot

from coeffd.daemon import api
from coeffd.daemon.publish.store import SnapshotStore

CID = "llama8b-h100-tp1"
BAD = [
    "9" * 300,  # was 500: File name too long
    "1" * (api.MAX_VERSION_DIGITS + 1),
    "1_0",
    "+3",
    " 7",
    "7 ",
    "\u0661",  # ARABIC-INDIC DIGIT ONE
    "\uff13",  # FULLWIDTH DIGIT THREE
    "\u00b2",  # SUPERSCRIPT TWO
    "0",
    "00",
    "-1",
    "",
    "1.0",
    "0x10",
]


@pytest.fixture
def populated(store: SnapshotStore) -> SnapshotStore:
    for v in (1, 2, 3):
        store.publish(make_snapshot(CID, v))
    return store


@pytest.mark.parametrize("raw", BAD)
def test_bad_versions_are_400(populated: SnapshotStore, raw: str) -> None:
    resp = api.get_coefficients(populated, CID, {"version": [raw]})
    assert resp.status == 400, (raw, resp.body)
    assert b"version must be" in resp.body


@pytest.mark.parametrize(("raw", "status"), [("3", 200), ("003", 200), ("999999999999999", 404)])
def test_good_versions_still_work(populated: SnapshotStore, raw: str, status: int) -> None:
    resp = api.get_coefficients(populated, CID, {"version": [raw]})
    assert resp.status == status, (raw, resp.body)


@pytest.mark.parametrize("raw", ["9" * 300, "1_0", "\u0661"])
def test_bad_versions_over_http(populated: SnapshotStore, server_url: str, raw: str) -> None:
    url = f"{server_url}/v1/coefficients/{CID}?" + urllib.parse.urlencode({"version": raw})
    with pytest.raises(urllib.error.HTTPError) as ei:
        urllib.request.urlopen(url, timeout=10)
    assert ei.value.code == 400


def test_a_directory_in_place_of_a_version_file_is_skipped(populated: SnapshotStore) -> None:
    (populated.directory / CID / "v77.json").mkdir()
    assert populated.get(CID, 77) is None
    assert api.get_coefficients(populated, CID, {"version": ["77"]}).status == 404
