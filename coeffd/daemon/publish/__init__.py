"""Output side of coeffd: versioned coefficient snapshots and the formats BLIS reads.

``atomic`` (crash-safe file replacement), ``snapshot`` (the ``Snapshot`` record,
BLIS validation, the versioned ``SnapshotStore`` and the publishing policy) and ``blis``
(CLI flags, the ``defaults.yaml`` block, in-place rewrite of a ``defaults.yaml``).
"""
