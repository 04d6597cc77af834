"""The full audit (PROTOCOL §3.7, §3.9), in its phases and where each lives:

1. **start** — `records` (`resume_or_start`: resume the newest audit or create a record;
   a run left running first gets its missing markers, `remark`); `schedule` says when;
2. **pin** — `run` (`AuditRun.list_catalog`: list the catalog files and narrow the pin,
   renewed as it goes; compaction honours it through `records.live_pin`);
3. **list** — `ranges` (disjoint key ranges, as many as the store's size asks),
   `listing` (streams of ranges written as Parquet parts, `parts`), `partitions`
   (closing a listing), or an S3 Inventory (`inventory`);
4. **join** — `audit_inputs` (local copies of the pinned catalog and the listing),
   `retired` (raw retention's hours), and the engines in `engines` (the SQL both run,
   DuckDB out of core or Spark), run off the loop by `offload`, spilling under `spill`;
5. **act** — `records_act` (catalog what is missing, supersede what differs, phantoms)
   and `blobs_act` (the orphan file, `orphans`; missing blobs), `blob_verify` and `rate`
   (SHA-256 verification in rate-limited rounds);
6. **complete** — `run` (`run_full_audit`: the steps above, resumable from the record,
   and its completion), `progress` (reporting).

The daemon runs audits in a child process (`child`, `worker`, `wire`); ``spark-submit``
runs `spark_entry`. Imports `protocol`, `store`, `index`, `config` and the reconciler's
shared modules (`context`, `cataloger`, `store_calls`, `problems`); never `reconciler.gc`
except `gc.raw_retention`'s retired hours and `gc.catalog_since`'s entry listing.
"""
