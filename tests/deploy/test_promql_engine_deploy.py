"""The PromQL engine's sidecar forms in deploy/ (PROTOCOL §5) agree with the code that
configures it: the Kubernetes pod's engine container runs exactly the flags
`collector.promql.engine_config.engine_flags` gives for the query collector's settings,
over the files its ``promql-config`` init container writes into a volume both
containers mount at ``query.promql.credentials_dir``; the systemd engine unit is
``BindsTo=`` the query collector's unit, whose ``ExecStartPre`` writes the
``prometheus.env`` the engine unit reads; the image holds the engine."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from collector.__main__ import build_parser
from collector.promql.config_cli import ENV_FILE
from collector.promql.engine_config import EngineFiles, engine_flags
from collector.promql.engine_setup import engine_memory_limit
from config import Settings, load_settings
from tests.deploy.deploy_files import DEPLOY, read_dockerfile, read_unit

try:
    import yaml  # type: ignore[import-untyped]
except ImportError:  # pragma: no cover - PyYAML comes with the test extras
    yaml = None

K8S = DEPLOY / "kubernetes"
SYSTEMD = DEPLOY / "systemd"


def _listen(settings: Settings) -> str:
    url = urlsplit(settings.query.promql.url or "")
    assert url.scheme == "http" and url.hostname == "127.0.0.1", "the engine stays on loopback"
    return f"{url.hostname}:{url.port}"


def _flags(settings: Settings, tsdb: str) -> list[str]:
    directory = settings.query.promql.credentials_dir
    assert directory is not None
    return engine_flags(
        EngineFiles(directory),
        settings.query.promql,
        max_concurrency=settings.query.max_concurrent_promql,
        listen=_listen(settings),
        tsdb_path=Path(tsdb),
    )


def _bytes(quantity: str) -> int:
    units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30}
    return int(quantity[:-2]) * units[quantity[-2:]] if quantity[-2:] in units else int(quantity)


def _promql_config_args(argv: list[str]) -> dict[str, str]:
    args = build_parser().parse_args(argv)
    assert args.command == "promql-config"
    return {"listen": args.listen, "tsdb": str(args.tsdb_path), "config": str(args.config)}


@pytest.mark.skipif(yaml is None, reason="PyYAML is not installed")
def test_the_query_collector_pod_runs_the_engine_it_configures() -> None:
    assert yaml is not None
    (deployment,) = [
        d
        for d in yaml.safe_load_all((K8S / "query-collector-deployment.yaml").read_text())
        if d and d["kind"] == "Deployment"
    ]
    spec = deployment["spec"]["template"]["spec"]
    assert deployment["spec"]["replicas"] == 1
    settings = load_settings(K8S / "query-collector.toml", environ={"LM_INGEST__COLLECTOR_ID": "q"})
    assert settings.query.designated and settings.query.promql.prometheus is None
    containers = {c["name"]: c for c in spec["containers"]}
    assert set(containers) == {"collector", "promql-engine", "self-scrape"}
    collector, engine = containers["collector"], containers["promql-engine"]
    served = build_parser().parse_args(collector["args"])
    assert (served.command, served.workers) == ("serve", 1)
    assert str(served.config).endswith("/query-collector.toml")
    (init,) = spec["initContainers"]
    config = _promql_config_args(init["args"])
    assert config["config"] == str(served.config)
    assert config["listen"] == _listen(settings)
    assert engine["command"][-1] == "/usr/bin/prometheus"
    assert engine["args"] == _flags(settings, config["tsdb"])
    # Its heap bounded like the supervised engine's (Go's GC lets it reach ~2x what is live).
    env = {e["name"]: e["value"] for e in engine.get("env", [])}
    assert env["GOMEMLIMIT"] == str(engine_memory_limit(settings.query))
    assert engine_memory_limit(settings.query) < _bytes(engine["resources"]["limits"]["memory"])
    volumes = {v["name"]: v for v in spec["volumes"]}

    def mounts(container: Mapping[str, Any]) -> dict[str, str]:
        return {m["mountPath"]: m["name"] for m in container["volumeMounts"]}

    shared = str(settings.query.promql.credentials_dir)
    assert mounts(init)[shared] == mounts(collector)[shared] == mounts(engine)[shared]
    assert volumes[mounts(engine)[shared]]["emptyDir"]["medium"] == "Memory"
    assert "emptyDir" in volumes[mounts(engine)[config["tsdb"]]]  # disposable TSDB
    # The sealed hours' totals survive a container restart, and /tmp holds an hour's
    # local catalog copies (a compacted busy hour is ~420 MB).
    history = volumes[mounts(collector)[str(settings.query.history_cache_dir)]]
    assert "emptyDir" in history
    assert _bytes(volumes[mounts(collector)["/tmp"]]["emptyDir"]["sizeLimit"]) >= 1 << 30
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    generated = {g["name"]: g["files"] for g in kustomization["configMapGenerator"]}
    assert generated[volumes["config"]["configMap"]["name"]] == ["query-collector.toml"]
    assert {"query-collector-deployment.yaml", "query-collector-service.yaml"} <= set(
        kustomization["resources"]
    )
    service = yaml.safe_load((K8S / "query-collector-service.yaml").read_text())
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]


def test_the_engine_unit_is_bound_to_the_query_collector_unit() -> None:
    collector = read_unit(SYSTEMD / "lightmetrics-query-collector.service")
    engine = read_unit(SYSTEMD / "lightmetrics-promql-engine.service")
    assert engine.value("Unit", "BindsTo") == "lightmetrics-query-collector.service"
    assert engine.value("Unit", "After") == "lightmetrics-query-collector.service"
    assert engine.value("Install", "WantedBy") == "lightmetrics-query-collector.service"
    assert "lightmetrics-promql-engine.service" in collector.value("Unit", "Wants").split()
    settings = load_settings(SYSTEMD / "query-collector.toml", environ={})
    assert settings.query.designated
    pre = collector.exec_argv("ExecStartPre")
    config = _promql_config_args(pre[1:])
    assert config["config"] == "/etc/lightmetrics/query-collector.toml"
    assert config["listen"] == _listen(settings)
    served = build_parser().parse_args(collector.exec_argv()[1:])
    assert (served.command, served.workers, str(served.config)) == (
        "serve",
        1,
        config["config"],
    )
    directory = settings.query.promql.credentials_dir
    assert engine.value("Service", "EnvironmentFile") == f"{directory}/{ENV_FILE}"
    assert shlex.split(engine.value("Service", "ExecStart")) == [
        "/usr/bin/prometheus",
        "$PROMETHEUS_ARGS",
    ]
    runtime = engine.value("Service", "RuntimeDirectory")
    assert config["tsdb"].startswith(f"/run/{runtime}/")  # emptied at every stop
    assert directory is not None and str(directory).startswith(
        f"/var/lib/{collector.value('Service', 'StateDirectory')}/"
    )
    cache = collector.value("Service", "CacheDirectory")  # writable under ProtectSystem
    assert str(settings.query.history_cache_dir) == f"/var/cache/{cache}"


def test_promql_config_writes_the_env_the_engine_unit_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from collector.__main__ import main

    collector = read_unit(SYSTEMD / "lightmetrics-query-collector.service")
    pre = collector.exec_argv("ExecStartPre")
    settings_file = tmp_path / "query-collector.toml"
    settings_file.write_text((SYSTEMD / "query-collector.toml").read_text())
    monkeypatch.setenv("LM_QUERY__PROMQL__CREDENTIALS_DIR", str(tmp_path / "promql"))
    argv = [*pre[1:]]
    argv[argv.index("--config") + 1] = str(settings_file)
    assert main(argv) == 0
    args_line, memory_line = (tmp_path / "promql" / ENV_FILE).read_text().splitlines()
    name, _, flags = args_line.partition("=")
    settings = load_settings(settings_file, environ={})
    settings = settings.model_copy(
        update={
            "query": settings.query.model_copy(
                update={
                    "promql": settings.query.promql.model_copy(
                        update={"credentials_dir": tmp_path / "promql"}
                    )
                }
            )
        }
    )
    assert name == "PROMETHEUS_ARGS"
    assert flags.split() == _flags(settings, _promql_config_args(pre[1:])["tsdb"])
    # The sidecar's heap is bounded like the supervised engine's (and the pod's says the same).
    assert memory_line == f"GOMEMLIMIT={engine_memory_limit(settings.query)}"


def test_the_image_holds_the_engine() -> None:
    _, stages = read_dockerfile(DEPLOY / "container" / "Dockerfile")
    final = stages[-1]
    runs = " ".join(
        argument for instruction, argument in final.instructions if instruction == "RUN"
    )
    assert "apt-get install" in runs and " prometheus" in runs
