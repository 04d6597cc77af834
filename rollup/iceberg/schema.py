"""A rollup table as an empty Iceberg table (format version 2): its schema (field ids 1..n
for the columns in order, then nested ids; the Parquet files carry no ids, so the name
mapping property maps names to ids), its partition spec ``hour(<partition column>)``, and
its metadata before any snapshot (uuid derived from the location). Pure."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Literal

import pyarrow as pa
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table.metadata import TableMetadata, TableMetadataUtil, new_table_metadata
from pyiceberg.table.name_mapping import create_mapping_from_schema
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER
from pyiceberg.transforms import DayTransform, HourTransform
from pyiceberg.types import (
    DoubleType,
    IcebergType,
    IntegerType,
    LongType,
    MapType,
    NestedField,
    StringType,
    TimestampType,
    TimestamptzType,
)

from protocol.keys import UtcHour
from rollup.table import schemas

FORMAT_VERSION: Literal[2] = 2
PARTITION_FIELD_ID = 1000
_NAMESPACE = uuid.UUID("6b0f3c1e-4a55-4c3f-9d7e-1a2b3c4d5e6f")


def _field_type(data_type: pa.DataType, next_id: Callable[[], int]) -> IcebergType:
    if pa.types.is_timestamp(data_type):
        return TimestamptzType() if data_type.tz is not None else TimestampType()
    if pa.types.is_map(data_type):
        key_id, value_id = next_id(), next_id()
        return MapType(
            key_id=key_id,
            key_type=_field_type(data_type.key_type, next_id),
            value_id=value_id,
            value_type=_field_type(data_type.item_type, next_id),
            value_required=False,
        )
    simple: dict[pa.DataType, IcebergType] = {
        pa.string(): StringType(),
        pa.float64(): DoubleType(),
        pa.int64(): LongType(),
        pa.int32(): IntegerType(),
    }
    if data_type in simple:
        return simple[data_type]
    raise ValueError(f"no Iceberg type for {data_type}")


def iceberg_schema(table: str) -> Schema:
    """The table's Iceberg schema: ids 1..n for the columns in order, then nested ids."""
    arrow = schemas.table_schema(table)
    counter = iter(range(len(arrow) + 1, 10_000))
    fields = [
        NestedField(
            field_id=i,
            name=f.name,
            field_type=_field_type(f.type, lambda: next(counter)),
            required=False,
        )
        for i, f in enumerate(arrow, start=1)
    ]
    return Schema(*fields)


def partition_spec(table: str, schema: Schema) -> PartitionSpec:
    """``hour(<partition column>)``; ``day(day_start)`` for ``series_day``, whose files sit
    in their day's last hour (an hour transform would prune its rows wrongly)."""
    column = schemas.PARTITION_COLUMN[table]
    daily = schemas.partition_span_hours(table) == 24
    return PartitionSpec(
        PartitionField(
            source_id=schema.find_field(column).field_id,
            field_id=PARTITION_FIELD_ID,
            transform=DayTransform() if daily else HourTransform(),
            name=f"{column}_{'day' if daily else 'hour'}",
        )
    )


def partition_value(table: str, partition: UtcHour) -> int:
    """A file's value under `partition_spec`: hours (days for ``series_day``) since the
    epoch of its partition."""
    hours = partition.start_ns // (3600 * 10**9)
    return hours // 24 if schemas.partition_span_hours(table) == 24 else hours


def new_table(table: str, location: str) -> TableMetadata:
    """Metadata of the table before any snapshot; its uuid is derived from ``location``."""
    schema = iceberg_schema(table)
    metadata = new_table_metadata(
        schema=schema,
        partition_spec=partition_spec(table, schema),
        sort_order=UNSORTED_SORT_ORDER,
        location=location,
        properties={"format-version": str(FORMAT_VERSION)},
        table_uuid=uuid.uuid5(_NAMESPACE, location),
    )
    mapping = create_mapping_from_schema(metadata.schema()).model_dump_json()
    properties = {**metadata.properties, "schema.name-mapping.default": mapping}
    return metadata.model_copy(update={"properties": properties})


def parse_metadata(body: bytes) -> TableMetadata:
    return TableMetadataUtil.parse_raw(body.decode())
