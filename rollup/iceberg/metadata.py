"""Apache Iceberg table metadata for one rollup table at one committed snapshot. Pure:
no I/O; the bytes it returns are written by `rollup.iceberg.publish` (an empty table: `rollup.iceberg.schema`).

Mapping (format version 2, one Iceberg table per rollup table):
- Iceberg snapshot id = sequence number = the rollup version; ``timestamp-ms`` = its
  ``created_at``; summary properties ``lightmetrics.version``, ``lightmetrics.setsum``
  (the sum of every ledger hour's setsum: the setsum of every included batch) and
  ``lightmetrics.manifest-key``. Operation ``overwrite`` (a commit may replace files).
- Each snapshot's manifest list holds ONE data manifest listing every live data file of
  the table (ADDED for files the version added, EXISTING with their ``added_version`` as
  snapshot id and sequence number otherwise): the same Parquet files, no copy, record
  count and size from the rollup manifest (no column statistics: engines prune by the
  partition). Writing the whole list per version costs what the rollup manifest costs.
- Schema from `rollup.table.schemas` with field ids 1..n in column order, then the map key and
  value; the Parquet files carry no field ids, so the table property
  ``schema.name-mapping.default`` maps names to ids (as ``add_files`` does).
- Partition spec ``hour(<partition column>)`` (``ts``, ``window_start``, ``hour_start``),
  the value being hours since the epoch of the file's partition hour; ``series_day``'s
  is ``day(day_start)``, days since the epoch (`rollup.iceberg.schema.partition_value`).
- Locations are absolute (`rollup.table.storage.engine_url`): a plain path on a ``file://``
  store, ``s3://bucket/prefix/...`` on S3; a store moved elsewhere needs republishing.
- Expiry: the new metadata keeps the snapshots created within ``retention_s`` of the new
  one, plus the newest older one (it was current at the cutoff) — vacuum's time rule.

Deletes (tombstones, PROTOCOL §4.1): rows a delete masks in a data file not yet rewritten
by compaction are published as Iceberg position-delete files (`rollup.iceberg.deletes`),
listed in a second manifest of content ``deletes`` in the same manifest list, each with
the sequence number of the newest tombstone it applies (never below its data file's).
"""

from __future__ import annotations

import io
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pyiceberg.io import InputFile, OutputFile, OutputStream
from pyiceberg.manifest import (
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
    ManifestWriter,
    ManifestWriterV2,
    write_manifest,
    write_manifest_list,
)
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.refs import SnapshotRefType
from pyiceberg.table.snapshots import Operation, Snapshot, Summary
from pyiceberg.table.update import (
    AddSnapshotUpdate,
    RemoveSnapshotsUpdate,
    SetSnapshotRefUpdate,
    TableUpdate,
    update_table_metadata,
)
from pyiceberg.typedef import Record

from protocol.keys import UtcHour
from protocol.setsum import Setsum
from rollup.iceberg.deletes import PositionDeletes
from rollup.iceberg.schema import FORMAT_VERSION, partition_value
from rollup.table.manifest import Snapshot as RollupSnapshot
from rollup.table.manifest import parse_created_at


@dataclass(frozen=True, slots=True)
class WrittenFile:
    """A metadata file to write: its object key and bytes."""

    key: str
    body: bytes


@dataclass(frozen=True, slots=True)
class PublishedVersion:
    """Everything one publish of one table writes: Avro files first, then the metadata."""

    avro_files: tuple[WrittenFile, ...]
    metadata: TableMetadata
    metadata_body: bytes


class _BytesOutput(OutputFile):
    """An `OutputFile` that keeps what pyiceberg writes in memory, for a conditional PUT."""

    def __init__(self, location: str) -> None:
        super().__init__(location)
        self.body = b""

    def __len__(self) -> int:
        return len(self.body)

    def exists(self) -> bool:
        return False

    def to_input_file(self) -> InputFile:
        raise NotImplementedError("written through the object store, never read back here")

    def create(self, overwrite: bool = False) -> OutputStream:
        owner = self

        class Stream(io.BytesIO):
            def close(self) -> None:
                if not self.closed:
                    owner.body = self.getvalue()
                super().close()

        return Stream()


def ledger_setsum(snapshot: RollupSnapshot) -> str:
    total = Setsum()
    for hour in snapshot.ledger_hours.values():
        total = total + Setsum.from_hex(hour.setsum)
    return total.hex


def _created_ms(snapshot: RollupSnapshot) -> int:
    return int(parse_created_at(snapshot.created_at).timestamp() * 1000)


def _entry(
    content: DataFileContent,
    location: str,
    table: str,
    partition: UtcHour,
    record_count: int,
    size_bytes: int,
    *,
    spec_id: int,
    version: int,
    first_version: int,
) -> ManifestEntry:
    """The manifest entry of one Parquet file of ``partition``: ADDED when
    ``first_version`` is the snapshot's ``version``, else EXISTING with that version as its
    snapshot id and sequence number."""
    data_file = DataFile.from_args(
        _table_format_version=FORMAT_VERSION,
        content=content,
        file_path=location,
        file_format=FileFormat.PARQUET,
        partition=Record(partition_value(table, partition)),
        record_count=record_count,
        file_size_in_bytes=size_bytes,
        sort_order_id=None,
        spec_id=spec_id,
        equality_ids=None,
        key_metadata=None,
    )
    added = first_version == version
    return ManifestEntry.from_args(
        _table_format_version=FORMAT_VERSION,
        status=ManifestEntryStatus.ADDED if added else ManifestEntryStatus.EXISTING,
        snapshot_id=version if added else first_version,
        sequence_number=None if added else first_version,
        file_sequence_number=None if added else first_version,
        data_file=data_file,
    )


def table_files(
    snapshot: RollupSnapshot, table: str, spec_id: int, data_url_of: Callable[[str], str]
) -> list[ManifestEntry]:
    """The manifest entries of ``table``'s live data files at ``snapshot``."""
    return [
        _entry(
            DataFileContent.DATA,
            data_url_of(f.path),
            table,
            f.partition,
            f.row_count,
            f.size_bytes,
            spec_id=spec_id,
            version=snapshot.version,
            first_version=f.added_version,
        )
        for f in sorted(snapshot.data_files(table), key=lambda f: f.path)
    ]


class _DeleteManifestWriter(ManifestWriterV2):
    """A v2 manifest of content ``deletes`` (pyiceberg 0.12 writes data manifests only)."""

    def content(self) -> ManifestContent:
        return ManifestContent.DELETES

    @property
    def _meta(self) -> dict[str, str]:
        return {**super()._meta, "content": "deletes"}


def _delete_entries(
    deletes: Sequence[PositionDeletes], version: int, spec_id: int, url_of: Callable[[str], str]
) -> list[ManifestEntry]:
    return [
        _entry(
            DataFileContent.POSITION_DELETES,
            url_of(deleted.key),
            deleted.data_file.table,
            deleted.data_file.partition,
            deleted.record_count,
            deleted.size_bytes,
            spec_id=spec_id,
            version=version,
            first_version=deleted.sequence_number,
        )
        for deleted in deletes
    ]


def _manifest(writer: ManifestWriter, entries: list[ManifestEntry]) -> ManifestFile:
    """Write ``entries`` (ADDED or EXISTING) with ``writer``; its manifest-list record."""
    with writer:
        for entry in entries:
            if entry.status == ManifestEntryStatus.ADDED:
                writer.add(entry)
            else:
                writer.existing(entry)
    return writer.to_manifest_file()


def _expired(metadata: TableMetadata, newest_ms: int, retention_s: float) -> list[int]:
    cutoff = newest_ms - int(retention_s * 1000)
    older = sorted(metadata.snapshots, key=lambda s: s.snapshot_id, reverse=True)
    keep_one_more = True
    expired = []
    for snapshot in older:
        if snapshot.timestamp_ms >= cutoff:
            continue
        if keep_one_more:
            keep_one_more = False  # the one current at the cutoff
            continue
        expired.append(snapshot.snapshot_id)
    return expired


def publish_version(
    base: TableMetadata,
    snapshot: RollupSnapshot,
    table: str,
    *,
    key_of: Callable[[str], str],
    url_of: Callable[[str], str],
    data_url_of: Callable[[str], str],
    retention_s: float,
    deletes: Sequence[PositionDeletes] = (),
) -> PublishedVersion:
    """The metadata of ``table`` at ``snapshot``, on top of ``base`` (the previous
    published metadata, or `new_table`). ``key_of(name)`` is the object key of a file
    named ``name`` in the table's metadata directory, ``url_of(key)`` its absolute
    location; ``data_url_of(path)`` the absolute location of a data file; ``deletes``
    the position-delete files in effect (`rollup.iceberg.deletes.position_deletes`)."""
    version = snapshot.version
    spec = base.spec()
    schema = base.schema()
    attempt = uuid.uuid4().hex[:12]
    written: list[WrittenFile] = []
    manifests: list[ManifestFile] = []
    entries = table_files(snapshot, table, spec.spec_id, data_url_of)
    if entries:
        manifest_key = key_of(f"{version}-{attempt}-m0.avro")
        output = _BytesOutput(url_of(manifest_key))
        writer = write_manifest(FORMAT_VERSION, spec, schema, output, version, "deflate")
        manifests.append(_manifest(writer, entries))
        written.append(WrittenFile(manifest_key, output.body))
    if deletes:
        manifest_key = key_of(f"{version}-{attempt}-d0.avro")
        output = _BytesOutput(url_of(manifest_key))
        writer = _DeleteManifestWriter(spec, schema, output, version, "deflate")
        manifests.append(_manifest(writer, _delete_entries(deletes, version, spec.spec_id, url_of)))
        written.append(WrittenFile(manifest_key, output.body))
    parent = base.current_snapshot_id
    list_key = key_of(f"snap-{version}-{attempt}.avro")
    list_output = _BytesOutput(url_of(list_key))
    with write_manifest_list(
        FORMAT_VERSION, list_output, version, parent, version, "deflate"
    ) as lw:
        lw.add_manifests(manifests)
    written.append(WrittenFile(list_key, list_output.body))
    records = sum(f.row_count for f in snapshot.data_files(table))
    summary = Summary(
        Operation.OVERWRITE,
        **{
            "lightmetrics.version": str(version),
            "lightmetrics.setsum": ledger_setsum(snapshot),
            "lightmetrics.manifest-key": snapshot.manifest_key,
            "total-records": str(records),
            "total-data-files": str(len(entries)),
        },
    )
    new_snapshot = Snapshot(
        snapshot_id=version,
        parent_snapshot_id=parent,
        sequence_number=version,
        timestamp_ms=_created_ms(snapshot),
        manifest_list=url_of(list_key),
        summary=summary,
        schema_id=schema.schema_id,
    )
    updates: list[TableUpdate] = [
        AddSnapshotUpdate(snapshot=new_snapshot),
        SetSnapshotRefUpdate.model_validate(
            {"ref-name": "main", "type": SnapshotRefType.BRANCH, "snapshot-id": version}
        ),
    ]
    expired = _expired(base, new_snapshot.timestamp_ms, retention_s)
    if expired:
        updates.append(RemoveSnapshotsUpdate(snapshot_ids=expired))
    metadata = update_table_metadata(base, tuple(updates))
    metadata = metadata.model_copy(update={"last_updated_ms": new_snapshot.timestamp_ms})
    return PublishedVersion(tuple(written), metadata, metadata.model_dump_json().encode())
