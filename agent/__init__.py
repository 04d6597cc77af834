"""The reference agent: a durable spool, an uploader that follows the agent contract
(PROTOCOL §2), a synthetic load generator with ground truth, and ``lm-agent send``.
Imports `protocol`, `store`, `config` only.

Programmatic use (demo, benchmarks, collector tests)::

    from agent import LoadSpec, RunOptions, SpoolSettings, run_fleet

    result = await run_fleet(
        urls=["http://127.0.0.1:8080", "http://127.0.0.1:8081"],
        token="secret",
        spool=SpoolSettings(directory=tmp_path / "spool"),
        spec=LoadSpec(agents=4, batches=50, points_per_batch=200,
                      duplicate_rate=0.1, conflict_rate=0.05, seed=7),
    )
    result.summary.exit_code, result.summary.to_dict()
    result.truth.accepted      # identity -> TruthRecord(frame_sha256, point_count, value_sum)
    result.truth.totals()      # Totals(batches, points, value_sum) the collectors now hold

Lower levels: `Spool`, `BatchProducer`, `Uploader` (``send`` posts bytes without a spool),
`SyntheticLoad` (frames of a `LoadSpec` without sending them), `read_points`. The
long-running scraping agent (``lm-agent scrape``) is `agent.scrape.ScrapeAgent`.
"""

from agent.fleet import FleetResult, RunOptions, SpoolSettings, run_fleet, send_points
from agent.load import LoadSpec, SyntheticLoad
from agent.points_file import Point, PointsFileError, batches_of, read_points
from agent.producer import BatchProducer
from agent.spool import ParkKind, Spool, SpoolEntry, SpoolError, SpoolFull, SpoolLocked
from agent.summary import DeliveryRecord, RunSummary
from agent.truth import BatchKind, GroundTruth, PlannedFrame, Totals, TruthRecord
from agent.uploader import BatchResult, Outcome, Uploader, UploadPolicy

__all__ = [
    "BatchKind",
    "BatchProducer",
    "BatchResult",
    "DeliveryRecord",
    "FleetResult",
    "GroundTruth",
    "LoadSpec",
    "Outcome",
    "ParkKind",
    "PlannedFrame",
    "Point",
    "PointsFileError",
    "RunOptions",
    "RunSummary",
    "Spool",
    "SpoolEntry",
    "SpoolError",
    "SpoolFull",
    "SpoolLocked",
    "SpoolSettings",
    "SyntheticLoad",
    "Totals",
    "TruthRecord",
    "UploadPolicy",
    "Uploader",
    "batches_of",
    "read_points",
    "run_fleet",
    "send_points",
]
