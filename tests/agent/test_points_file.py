from __future__ import annotations

import math
from pathlib import Path

import pytest

from agent.points_file import PointsFileError, batches_of, parse_ts, read_points


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_jsonl_points(tmp_path: Path):
    path = write(
        tmp_path,
        "p.jsonl",
        "\n".join(
            [
                '{"ts": 1760000000000000001, "metric": "cpu", "value": 1.5, "labels": {"host": "a"}}',
                "",
                '{"ts": "2025-10-09T08:53:20.123456789Z", "metric": "mem", "value": 2}',
                '{"ts": "2025-10-09T10:53:20+02:00", "metric": "mem", "value": 3, "labels": null}',
            ]
        ),
    )
    points = list(read_points(path))
    assert [p.ts_ns for p in points] == [
        1760000000000000001,
        1760000000123456789,
        1760000000000000000,  # 10:53:20+02:00 is 08:53:20Z
    ]
    assert points[0].labels == {"host": "a"} and points[2].labels is None
    assert points[1].value == 2.0


def test_csv_points_with_header_and_both_label_forms(tmp_path: Path):
    path = write(
        tmp_path,
        "p.csv",
        "\n".join(
            [
                "ts,metric,value,labels",
                "1760000000000000000,cpu,1.0,host=a;region=eu",
                '2025-10-09T08:53:20Z,cpu,nan,"{""host"": ""b""}"',
                "1760000000000000002,up,1,",
                "1760000000000000003,up,2",
            ]
        ),
    )
    points = list(read_points(path))
    assert points[0].labels == {"host": "a", "region": "eu"}
    assert points[1].labels == {"host": "b"} and math.isnan(points[1].value)
    assert points[2].labels is None and points[3].value == 2.0


@pytest.mark.parametrize(
    ("text", "line", "field"),
    [
        ('{"ts": 1, "metric": "m", "value": 1}\n{"ts": 1, "metric": "m", "value": 1\n', 2, None),
        ('{"ts": 1, "metric": "m"}\n', 1, "value"),
        ('\n\n{"ts": "yesterday", "metric": "m", "value": 1}\n', 3, "ts"),
        ('{"ts": 1, "metric": "", "value": 1}\n', 1, "metric"),
        ('{"ts": 1, "metric": "m", "value": "high"}\n', 1, "value"),
        ('{"ts": 1, "metric": "m", "value": 1, "labels": {"k": 5}}\n', 1, "labels.k"),
        ('{"ts": 1, "metric": "m", "value": 1, "labels": ["k"]}\n', 1, "labels"),
        ('{"ts": 1.5, "metric": "m", "value": 1}\n', 1, "ts"),
        ('{"ts": "2025-13-01T00:00:00Z", "metric": "m", "value": 1}\n', 1, "ts"),
        ('{"ts": "2025-10-01T00:00:00", "metric": "m", "value": 1}\n', 1, "ts"),
    ],
)
def test_jsonl_errors_name_line_and_field(tmp_path: Path, text: str, line: int, field: str | None):
    path = write(tmp_path, "bad.jsonl", text)
    with pytest.raises(PointsFileError) as caught:
        list(read_points(path))
    assert (caught.value.line, caught.value.field) == (line, field)
    assert f"bad.jsonl:{line}" in str(caught.value)
    if field:
        assert repr(field) in str(caught.value)


@pytest.mark.parametrize(
    ("text", "line", "field"),
    [
        ("ts,metric,value\n1,m,1\n2,m,abc\n", 3, "value"),
        ("1,m,1,host\n", 1, "labels"),
        ('1,m,1,"{""a"": 1"\n', 1, "labels"),
        ("1,m\n", 1, None),
        ("1,m,1,a=1;a=2\n", 1, "labels"),
        ("x,m,1\n", 1, "ts"),
    ],
)
def test_csv_errors_name_line_and_field(tmp_path: Path, text: str, line: int, field: str | None):
    path = write(tmp_path, "bad.csv", text)
    with pytest.raises(PointsFileError) as caught:
        list(read_points(path))
    assert (caught.value.line, caught.value.field) == (line, field)


def test_batches_of_splits_in_order(tmp_path: Path):
    path = write(tmp_path, "p.csv", "".join(f"{i},m,{i}\n" for i in range(7)))
    tables = list(batches_of(read_points(path), 3))
    assert [t.num_rows for t in tables] == [3, 3, 1]
    assert tables[2].column("value").to_pylist() == [6.0]


def test_unknown_suffix_is_refused(tmp_path: Path):
    with pytest.raises(ValueError, match="format"):
        list(read_points(write(tmp_path, "p.txt", "")))
    assert list(read_points(write(tmp_path, "p.txt", "1,m,1\n"), file_format="csv"))


def test_parse_ts_forms():
    assert parse_ts(5) == 5 and parse_ts("5") == 5
    assert parse_ts("1970-01-01T00:00:00.000000001Z") == 1
    assert parse_ts("2025-10-09t10:53:20.5+02:00") == 1_760_000_000_500_000_000
    for bad in (True, -1, "2025-10-09", 1.0):
        with pytest.raises(ValueError):
            parse_ts(bad)
