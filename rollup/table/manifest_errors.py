"""The errors of the rollup snapshot model (`rollup.table.manifest`), apart so that the
modules it is split into (`rollup.table.manifest_ledger`) raise the same ones."""

from __future__ import annotations


class RollupManifestError(ValueError):
    """A stored snapshot (or pointer target) is malformed: an operator must look."""


class RollupInvariantError(ValueError):
    """A proposed commit breaks an invariant against its base: a planning bug or a stale
    base. Nothing was written; re-read the latest snapshot and plan again."""
