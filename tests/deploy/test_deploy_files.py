"""The operator files under deploy/ agree with the code they deploy.

Cheap, offline checks: every file parses; every ``LM_*`` variable names a real setting;
every settings file loads; every command line is accepted by the CLI it names; ports,
probes, mounts and stop budgets match the settings; the IAM documents never let anyone
delete an acceptance record; the image copies every package and runs as the pods' user.
"""

from __future__ import annotations

import configparser
import importlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
import uuid
import zipfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from collector.__main__ import build_parser as collector_parser
from collector.metrics import CollectorMetrics
from config import Settings, SettingsError, load_settings
from protocol import keys
from tests.deploy.deploy_files import (
    ACCOUNT,
    DEPLOY,
    POLICIES,
    POLICY_FILES,
    ROOT,
    allowed,
    copy_sources,
    docker_ignores,
    dockerignore_patterns,
    exec_form,
    k8s_bytes,
    load_policy,
    pod_specs,
    read_dockerfile,
    read_unit,
    role_arn,
    role_may,
    systemd_seconds,
)

try:
    import yaml
except ImportError:  # pragma: no cover - PyYAML arrives with the test extras (ministack)
    yaml = None

needs_yaml = pytest.mark.skipif(
    yaml is None,
    reason="PyYAML is not installed (it comes with the test extras through ministack and is "
    "not a declared dependency); the Kubernetes manifests cannot be parsed",
)

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
SCRIPTS: dict[str, str] = PYPROJECT["project"]["scripts"]
LATER_MARK = "LATER ISSUE"
K8S = DEPLOY / "kubernetes"
SYSTEMD = DEPLOY / "systemd"
CONTAINER = DEPLOY / "container"
UNITS = sorted(SYSTEMD.glob("*.service"))
# The PromQL engine runs Debian's prometheus, not a script of this project: its unit and
# its container are checked against the engine's configuration code in
# test_promql_engine_deploy.py, and never talk to the store.
ENGINE_UNIT = "lightmetrics-promql-engine.service"
ENGINE_COMMAND = "/usr/bin/prometheus"
SAMPLE_POD_NAME = "lightmetrics-collector-7d9f8c6b5-x2x4q"
IDLE_WORKER_RSS = 128 * 2**20  # measured ~125 MiB for one idle collector worker


def text_files() -> Iterator[Path]:
    for path in sorted(DEPLOY.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            yield path


def manifests() -> list[tuple[Path, dict[str, Any]]]:
    assert yaml is not None
    found = []
    for path in sorted(K8S.glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if document is not None:
                found.append((path, document))
    return found


def kind(name: str, kind_: str) -> dict[str, Any]:
    matches = [d for _, d in manifests() if d["kind"] == kind_ and d["metadata"]["name"] == name]
    assert len(matches) == 1, f"expected one {kind_} {name}, found {len(matches)}"
    return matches[0]


def kustomization() -> dict[str, Any]:
    assert yaml is not None
    document: dict[str, Any] = yaml.safe_load((K8S / "kustomization.yaml").read_text("utf-8"))
    return document


def generated_configmaps() -> dict[str, dict[str, Path]]:
    """configMapGenerator: ConfigMap name → {data key: source file}."""
    generated: dict[str, dict[str, Path]] = {}
    for generator in kustomization()["configMapGenerator"]:
        files: dict[str, Path] = {}
        for entry in generator["files"]:
            key, sep, source = entry.partition("=")
            files[key if sep else Path(key).name] = K8S / (source if sep else key)
        generated[generator["name"]] = files
    return generated


def k8s_settings(name: str) -> Settings:
    return load_settings(K8S / name, environ={"LM_INGEST__COLLECTOR_ID": SAMPLE_POD_NAME})


def module_available(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


# --- files are there and parse ------------------------------------------------------------


def test_the_operator_files_exist() -> None:
    expected = [
        "README.md",
        "systemd/lightmetrics-collector.service",
        "systemd/lightmetrics-collector@.service",
        "systemd/lightmetrics-reconciler.service",
        "systemd/lightmetrics-rollup.service",
        "systemd/lightmetrics-rollup.timer",
        "systemd/lightmetrics-rollup-compact.service",
        "systemd/lightmetrics-rollup-compact.timer",
        "systemd/lightmetrics-rollup-vacuum.service",
        "systemd/lightmetrics-rollup-vacuum.timer",
        "kubernetes/rollup-compact-cronjob.yaml",
        "kubernetes/rollup-vacuum-cronjob.yaml",
        "kubernetes/kustomization.yaml",
        "container/Dockerfile",
        "container/dockerignore",
        "bucket-policy/README.md",
        "bucket-policy/bucket-policy.json",
        "bucket-policy/lifecycle.json",
    ]
    missing = [name for name in expected if not (DEPLOY / name).is_file()]
    assert not missing


@needs_yaml
@pytest.mark.parametrize("path", sorted(K8S.glob("*.yaml")), ids=lambda p: p.name)
def test_every_manifest_parses_as_kubernetes_objects(path: Path) -> None:
    assert yaml is not None
    documents = [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]
    assert documents
    for document in documents:
        assert {"apiVersion", "kind"} <= document.keys(), f"{path.name}: {document}"
        if document["kind"] != "Kustomization":
            assert document["metadata"]["name"].startswith("lightmetrics")


@needs_yaml
def test_kustomization_lists_every_manifest_and_every_file_exists() -> None:
    resources = kustomization()["resources"]
    on_disk = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(resources) == on_disk
    for files in generated_configmaps().values():
        for source in files.values():
            assert source.is_file(), source


@pytest.mark.parametrize("path", sorted(DEPLOY.rglob("*.json")), ids=lambda p: p.name)
def test_every_json_document_parses(path: Path) -> None:
    document = json.loads(path.read_text(encoding="utf-8"))
    assert isinstance(document, dict)


# --- settings -----------------------------------------------------------------------------


def lm_variables() -> list[tuple[str, str | None, str]]:
    """(name, value or None, where) for every LM_* variable named in deploy/."""
    found: list[tuple[str, str | None, str]] = []
    pattern = re.compile(r"\b(LM_[A-Z][A-Z0-9_]*)(?:=([^\s`'\")]*))?")
    for path in text_files():
        for match in pattern.finditer(path.read_text(encoding="utf-8")):
            found.append((match.group(1), match.group(2), str(path.relative_to(ROOT))))
    if yaml is not None:
        for path, document in manifests():
            for spec in pod_specs(document):
                for container in spec["containers"]:
                    for entry in container.get("env", []):
                        if not entry["name"].startswith("LM_"):
                            continue
                        if "value" in entry:
                            value = str(entry["value"])
                        else:
                            assert entry["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
                            value = SAMPLE_POD_NAME
                        found.append((entry["name"], value, f"{path.name} env"))
    return found


def default_text(name: str) -> str:
    """The setting's default, written as an environment value."""
    section, key = name.removeprefix("LM_").lower().split("__")
    value = getattr(getattr(Settings(), section), key)
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def test_every_lm_variable_names_a_real_setting() -> None:
    variables = lm_variables()
    assert any(name == "LM_INGEST__COLLECTOR_ID" for name, _, _ in variables)
    problems = []
    for name, value, where in variables:
        if "__" not in name:
            problems.append(f"{where}: {name} is not LM_<SECTION>__<KEY>")
            continue
        try:
            text = value if value else default_text(name)
            load_settings(environ={name: text})
        except (SettingsError, ValueError, AttributeError) as exc:
            problems.append(f"{where}: {name}={value!r}: {exc}")
    assert not problems, "\n".join(problems)


@needs_yaml
def test_every_settings_file_in_a_configmap_loads(tmp_path: Path) -> None:
    loaded = 0
    for files in generated_configmaps().values():
        for key, source in files.items():
            if key.endswith(".toml"):
                k8s_settings(source.name)
                loaded += 1
    for _, document in manifests():
        if document["kind"] == "ConfigMap":
            for key, text in document.get("data", {}).items():
                if key.endswith(".toml"):
                    (tmp_path / key).write_text(text, encoding="utf-8")
                    load_settings(tmp_path / key, environ={})
                    loaded += 1
    assert loaded >= 3


def test_processes_share_one_store_and_the_gc_grace_outlasts_collector_requests() -> None:
    collector = k8s_settings("collector.toml")
    reconciler = k8s_settings("reconciler.toml")
    rollup = k8s_settings("rollup.toml")
    assert collector.store.url == reconciler.store.url == rollup.store.url
    assert collector.store.region == reconciler.store.region == rollup.store.region
    # Each process validates only its own file; GC safety (PROTOCOL.md §3.5 rule 3)
    # depends on the collectors' real budget and timeouts.
    assert reconciler.ingest.request_budget_s == collector.ingest.request_budget_s
    longest_request = (
        collector.ingest.request_budget_s
        + collector.store.connect_timeout_s
        + collector.store.read_timeout_s
    )
    assert reconciler.gc.mark_grace_s > longest_request
    assert reconciler.store.gc_credentials_profile is not None


def test_the_gc_profile_exists_in_the_reconciler_aws_config() -> None:
    profile = k8s_settings("reconciler.toml").store.gc_credentials_profile
    aws_config = configparser.ConfigParser()
    aws_config.read(K8S / "reconciler-aws-config", encoding="utf-8")
    assert aws_config.has_option(f"profile {profile}", "role_arn")


# --- command lines ------------------------------------------------------------------------


def check_command(argv: list[str], where: str, file_text: str) -> None:
    """``argv[0]`` is a console script of this project and its CLI accepts the rest."""
    script = Path(argv[0]).name
    assert script in SCRIPTS, f"{where}: {script} is not in [project.scripts]"
    if script == "lm-collector":
        collector_parser().parse_args(argv[1:])
        return
    module = SCRIPTS[script].partition(":")[0]
    if not module_available(module):
        assert LATER_MARK in file_text, f"{where}: {module} does not exist and is not marked later"
        return
    parser = getattr(importlib.import_module(module), "build_parser", None)
    if parser is not None:  # the later issue landed: its flags must match too
        parser().parse_args(argv[1:])


@pytest.mark.parametrize("path", [u for u in UNITS if u.name != ENGINE_UNIT], ids=lambda p: p.name)
def test_unit_commands_are_project_scripts_with_valid_arguments(path: Path) -> None:
    unit = read_unit(path)
    argv = unit.exec_argv()
    assert argv[0].startswith("/opt/lightmetrics/venv/bin/"), argv[0]
    check_command(argv, path.name, path.read_text(encoding="utf-8"))


def container_argv(container: Mapping[str, Any], entrypoints: Mapping[str, list[str]]) -> list[str]:
    command = container.get("command") or entrypoints[container["image"]]
    argv = [*command, *container.get("args", [])]
    if Path(argv[0]).name == "tini":
        argv = argv[argv.index("--") + 1 :]
    return argv


def image_entrypoints() -> dict[str, list[str]]:
    """Kubernetes image name → the ENTRYPOINT of the Dockerfile target it is built from."""
    _, stages = read_dockerfile(CONTAINER / "Dockerfile")
    by_name = {stage.name: stage for stage in stages}
    result = {}
    for image, target in (
        ("lightmetrics-ingest", stages[-1].name),
        ("lightmetrics-ingest-rollup", "rollup"),
    ):
        entrypoint = by_name[target].last("ENTRYPOINT")
        assert entrypoint is not None
        result[image] = exec_form(entrypoint)
    return result


@needs_yaml
def test_container_commands_are_project_scripts_with_valid_arguments() -> None:
    entrypoints = image_entrypoints()
    checked = 0
    for path, document in manifests():
        for spec in pod_specs(document):
            for container in spec["containers"]:
                argv = container_argv(container, entrypoints)
                if argv[0] == ENGINE_COMMAND:
                    continue
                if Path(argv[0]).name == "spark-submit":
                    entry = next(a for a in argv if a.endswith(".py"))
                    assert entry == "/opt/lightmetrics/rollup_entry.py"
                    argv = ["lm-rollup", *argv[argv.index(entry) + 1 :]]
                check_command(argv, path.name, path.read_text(encoding="utf-8"))
                checked += 1
    # collector, reconciler, rollup, its compaction and vacuum, scrape agent, the query
    # collector, and the self-scrape sidecars of the collector, query collector and
    # reconciler pods
    assert checked == 10


def test_the_spark_submit_entry_file_runs_the_job_on_the_submitted_session() -> None:
    # rollup.job.spark_entry, not lm-rollup's main: that one starts a local session of its
    # own and would ignore spark-submit's --master.
    text = (CONTAINER / "rollup_entry.py").read_text(encoding="utf-8")
    assert "from rollup.job.spark_entry import main" in text


# --- systemd ------------------------------------------------------------------------------


@pytest.mark.parametrize("path", UNITS, ids=lambda p: p.name)
def test_units_are_hardened_and_stop_with_sigterm(path: Path) -> None:
    unit = read_unit(path)
    for key, value in {
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "KillSignal": "SIGTERM",
        "User": "lightmetrics",
        "StateDirectory": "lightmetrics",
    }.items():
        assert unit.value("Service", key) == value, f"{path.name}: {key}"
    assert int(unit.value("Service", "LimitNOFILE")) >= 65536
    # Scrape agents (lm-agent scrape) never talk to the store: they need no AWS settings.
    if " scrape " not in unit.value("Service", "ExecStart") and path.name != ENGINE_UNIT:
        assert "-/etc/lightmetrics/aws.env" in unit.values("Service", "EnvironmentFile")
    if unit.value("Service", "Type") != "oneshot":
        assert unit.value("Service", "Restart") == "on-failure"
        assert unit.value("Service", "RestartPreventExitStatus") == "2"  # bad configuration


def test_collector_units_outlast_the_shutdown_grace() -> None:
    # A worker waits up to http.shutdown_grace_s for in-flight requests, then up to the
    # same grace again for the derived-index queue (collector/server.py).
    example = load_settings(ROOT / "config/examples/collector.toml", environ={})
    grace = max(example.http.shutdown_grace_s, Settings().http.shutdown_grace_s)
    for name in ("lightmetrics-collector.service", "lightmetrics-collector@.service"):
        unit = read_unit(SYSTEMD / name)
        assert systemd_seconds(unit.value("Service", "TimeoutStopSec")) >= 2 * grace + 5
        assert unit.value("Service", "KillMode") == "mixed"  # the supervisor forwards SIGTERM


def test_the_template_unit_matches_the_plain_collector_unit() -> None:
    plain = read_unit(SYSTEMD / "lightmetrics-collector.service")
    template = read_unit(SYSTEMD / "lightmetrics-collector@.service")
    varying = {"ExecStart", "Environment"}
    assert [kv for kv in plain.sections["Service"] if kv[0] not in varying] == [
        kv for kv in template.sections["Service"] if kv[0] not in varying
    ]
    exec_start = template.value("Service", "ExecStart")
    assert "collector-%i.toml" in exec_start
    assert exec_start.replace("collector-%i.toml", "collector.toml") == plain.value(
        "Service", "ExecStart"
    )
    assert plain.environment().keys() == template.environment().keys()


def test_the_state_directory_is_the_example_filesystem_store() -> None:
    settings = load_settings(ROOT / "config/examples/collector.toml", environ={})
    state = read_unit(SYSTEMD / "lightmetrics-collector.service").value("Service", "StateDirectory")
    assert settings.store.url == f"file:///var/lib/{state}"


def test_the_rollup_timer_starts_the_rollup_service() -> None:
    timer = read_unit(SYSTEMD / "lightmetrics-rollup.timer")
    assert timer.value("Timer", "Unit") == "lightmetrics-rollup.service"
    assert timer.value("Timer", "Persistent") == "yes"
    for path in SYSTEMD.glob("*.timer"):  # every timer starts a unit that exists
        assert (SYSTEMD / read_unit(path).value("Timer", "Unit")).is_file(), path.name


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_systemd_accepts_every_unit(tmp_path: Path) -> None:
    venv_bin = Path(sys.executable).parent  # where this project's console scripts are
    for path in [*UNITS, *sorted(SYSTEMD.glob("*.timer"))]:
        text = path.read_text(encoding="utf-8").replace(
            "/opt/lightmetrics/venv/bin/", f"{venv_bin}/"
        )
        name = path.name.replace("@.service", "@example.service")
        (tmp_path / name).write_text(text, encoding="utf-8")
    names = sorted(p.name for p in tmp_path.iterdir())
    result = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", *[f"./{n}" for n in names]],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    complaints = [line for line in result.stderr.splitlines() if "lightmetrics" in line]
    assert result.returncode == 0 and not complaints, result.stderr


# --- Kubernetes ---------------------------------------------------------------------------


def named_container(spec: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    """The pod's container called ``name`` (beside it: the self-scrape sidecar)."""
    (container,) = [c for c in spec["containers"] if c["name"] == name]
    return container


@needs_yaml
def test_collector_pod_matches_its_settings() -> None:
    settings = k8s_settings("collector.toml")
    deployment = kind("lightmetrics-collector", "Deployment")
    pod = deployment["spec"]["template"]
    container = named_container(pod["spec"], "collector")
    (port,) = container["ports"]
    assert port == {"name": "http", "containerPort": settings.http.port, "protocol": "TCP"}
    assert settings.http.host == "0.0.0.0" and settings.auth.tokens_file is not None
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert container["startupProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    annotations = pod["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(settings.http.port)
    assert annotations["prometheus.io/path"] == "/metrics"
    # One worker per pod: /metrics on the HTTP port is the whole pod.
    assert container["args"][container["args"].index("--workers") + 1] == "1"
    service = kind("lightmetrics-collector", "Service")
    assert service["spec"]["ports"][0]["targetPort"] == "http"
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    pdb = kind("lightmetrics-collector", "PodDisruptionBudget")
    assert pdb["spec"]["selector"] == deployment["spec"]["selector"]


@needs_yaml
def test_collector_pod_stops_within_its_grace_period() -> None:
    settings = k8s_settings("collector.toml")
    spec = kind("lightmetrics-collector", "Deployment")["spec"]["template"]["spec"]
    container = named_container(spec, "collector")
    pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    budget = float(pre_stop[1]) + 2 * settings.http.shutdown_grace_s
    assert spec["terminationGracePeriodSeconds"] > budget


@needs_yaml
def test_collector_memory_limit_holds_the_in_flight_bodies() -> None:
    settings = k8s_settings("collector.toml")
    spec = kind("lightmetrics-collector", "Deployment")["spec"]["template"]["spec"]
    container = named_container(spec, "collector")
    limit = k8s_bytes(container["resources"]["limits"]["memory"])
    assert limit - IDLE_WORKER_RSS >= settings.http.max_in_flight_bytes
    assert k8s_bytes(container["resources"]["requests"]["memory"]) >= IDLE_WORKER_RSS


def volume_sources(
    spec: Mapping[str, Any], container: Mapping[str, Any]
) -> dict[str, dict[str, Any]]:
    """mountPath → the volume mounted there."""
    volumes = {v["name"]: v for v in spec["volumes"]}
    return {m["mountPath"]: volumes[m["name"]] for m in container["volumeMounts"]}


def mounted_file(
    spec: Mapping[str, Any], container: Mapping[str, Any], path: str
) -> tuple[str, str, str]:
    """(source kind, source name, key) of the file at ``path`` in the container."""
    directory, _, filename = path.rpartition("/")
    volume = volume_sources(spec, container)[directory]
    for source_kind, name_field in (("configMap", "name"), ("secret", "secretName")):
        if source_kind in volume:
            source = volume[source_kind]
            items = {item["path"]: item["key"] for item in source.get("items", [])}
            if items:
                assert filename in items, f"{path} is not among the projected items"
            return source_kind, source[name_field], items.get(filename, filename)
    raise AssertionError(f"{path}: unsupported volume {volume}")


@needs_yaml
def test_config_and_tokens_files_are_mounted_where_the_commands_look() -> None:
    generated = generated_configmaps()
    entrypoints = image_entrypoints()
    for _, document in manifests():
        for spec in pod_specs(document):
            for container in spec["containers"]:
                argv = container_argv(container, entrypoints)
                if argv[0] == ENGINE_COMMAND:
                    continue
                config_path = argv[argv.index("--config") + 1]
                source_kind, name, key = mounted_file(spec, container, config_path)
                assert source_kind == "configMap" and key in generated[name]
                settings = k8s_settings(generated[name][key].name)
                if container["name"] == "collector":
                    tokens = str(settings.auth.tokens_file)
                    assert mounted_file(spec, container, tokens)[0] == "secret"
                for entry in container.get("env", []):
                    if entry["name"] == "AWS_CONFIG_FILE":
                        source_kind, name, key = mounted_file(spec, container, entry["value"])
                        assert source_kind == "configMap" and generated[name][key].is_file()


@needs_yaml
def test_pods_are_non_root_with_read_only_root_filesystems() -> None:
    _, stages = read_dockerfile(CONTAINER / "Dockerfile")
    image_users = {stage.last("USER") for stage in stages if stage.last("USER")}
    for path, document in manifests():
        for spec in pod_specs(document):
            context = spec["securityContext"]
            assert context["runAsNonRoot"] is True, path.name
            assert f"{context['runAsUser']}:{context['runAsGroup']}" in image_users
            assert spec["automountServiceAccountToken"] is False
            for container in spec["containers"]:
                security = container["securityContext"]
                assert security["readOnlyRootFilesystem"] is True
                assert security["allowPrivilegeEscalation"] is False
                assert security["capabilities"]["drop"] == ["ALL"]
                assert "/tmp" in volume_sources(spec, container)


@needs_yaml
def test_reconciler_runs_active_and_standby_and_rollup_never_overlaps() -> None:
    reconciler = kind("lightmetrics-reconciler", "Deployment")
    assert reconciler["spec"]["replicas"] == 2
    assert reconciler["spec"]["strategy"]["rollingUpdate"]["maxSurge"] == 0
    settings = k8s_settings("reconciler.toml")
    spec = reconciler["spec"]["template"]["spec"]
    assert spec["terminationGracePeriodSeconds"] > settings.reconciler.lease_ttl_s
    annotations = reconciler["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(settings.metrics.port)
    assert settings.metrics.host == "0.0.0.0"
    rollup = kind("lightmetrics-rollup", "CronJob")
    assert rollup["spec"]["concurrencyPolicy"] == "Forbid"


@needs_yaml
def test_compaction_and_vacuum_are_scheduled_apart_from_the_runs() -> None:
    """Issue 24 item 11: ``lm-rollup compact`` and ``vacuum`` run on a schedule (a CronJob
    and a systemd timer each), daily, never at the minute the hourly run starts, vacuum
    after compaction, each with the rollup's settings file and role."""
    run = kind("lightmetrics-rollup", "CronJob")["spec"]["schedule"].split()
    minutes: dict[str, tuple[int, int]] = {}
    for command in ("compact", "vacuum"):
        job = kind(f"lightmetrics-rollup-{command}", "CronJob")
        spec = job["spec"]
        assert spec["concurrencyPolicy"] == "Forbid" and spec["timeZone"] == "Etc/UTC"
        minute, hour, *rest = spec["schedule"].split()
        assert rest == ["*", "*", "*"] and minute != run[0]  # daily, off the run's minute
        minutes[command] = (int(hour), int(minute))
        pod = spec["jobTemplate"]["spec"]["template"]["spec"]
        assert pod["serviceAccountName"] == "lightmetrics-rollup"
        (container,) = pod["containers"]
        argv = container_argv(container, image_entrypoints())
        assert argv[:3] == ["lm-rollup", "--config", "/etc/lightmetrics/config/rollup.toml"]
        assert argv[3:] == [command]
        timer = read_unit(SYSTEMD / f"lightmetrics-rollup-{command}.timer")
        assert timer.value("Timer", "Unit") == f"lightmetrics-rollup-{command}.service"
        assert timer.value("Timer", "Persistent") == "yes"
        calendar = timer.value("Timer", "OnCalendar")
        assert calendar == f"*-*-* {int(hour):02d}:{int(minute):02d}:00 UTC"
        service = read_unit(SYSTEMD / f"lightmetrics-rollup-{command}.service")
        assert service.value("Service", "Type") == "oneshot"
        assert service.exec_argv()[-1] == command
        assert "/etc/lightmetrics/rollup.toml" in service.exec_argv()
    assert minutes["compact"] < minutes["vacuum"]


@needs_yaml
def test_service_accounts_carry_the_roles_the_policies_are_written_for() -> None:
    for role in ("collector", "reconciler", "rollup"):
        account = kind(f"lightmetrics-{role}", "ServiceAccount")
        assert account["metadata"]["annotations"]["eks.amazonaws.com/role-arn"] == role_arn(role)


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not installed")
def test_kustomize_renders_the_manifests() -> None:
    result = subprocess.run(
        ["kubectl", "kustomize", str(K8S)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert "kind: ConfigMap" in result.stdout and "lightmetrics-collector-config-" in result.stdout


# --- IAM and lifecycle --------------------------------------------------------------------

SHA = "ab" * 32
IDENTITY = keys.BatchIdentity("agent-a", uuid.UUID(int=1), 10, 20)
HOUR = keys.UtcHour.from_unix_ns(1_760_000_000 * 10**9)
SAMPLE_KEYS = {
    "raw_blob": keys.raw_blob_key(SHA),
    "raw_bundle": keys.raw_bundle_key(SHA),
    "raw_blob_by_time": keys.raw_blob_by_time_key(HOUR, SHA),
    "accepted": keys.accepted_manifest_key(IDENTITY),
    "accepted_by_time": keys.accepted_by_time_key(HOUR, IDENTITY),
    "accepted_by_blob": keys.accepted_by_blob_key(SHA, IDENTITY),
    "quarantine": keys.quarantine_key(IDENTITY, SHA),
    "quarantine_by_blob": keys.quarantine_by_blob_key(SHA, IDENTITY),
    "gc_mark": keys.gc_mark_key(SHA),
    "gc_veto": keys.gc_veto_key(SHA),
    "gc_log": keys.gc_log_key(HOUR.start_ns, 3),
    "reconciler_state": keys.RECONCILER_PREFIX + "lease.json",
    "rollup_dirty": keys.rollup_dirty_key(HOUR),
    "rollup_pointer": keys.ROLLUP_POINTER_KEY,
    "rollup_data": keys.rollup_data_key("points", HOUR, "f"),
    "probe": keys.probe_key("collector-1-1-x"),
    "index_log": keys.index_log_segment_key(1_760_000_000 * 10**9, "collector-1", 7),
    "index_catalog": keys.index_catalog_key(HOUR, 3, 9),
    "catalog_created": keys.catalog_created_key(3, 9),
    "rollup_work": keys.rollup_work_marker_key(keys.index_catalog_key(HOUR, 3, 9)),
    "feature_record": keys.INDEX_FEATURES_KEY,
    "collector_version": keys.version_entry_key("collector", "collector-1"),
    "rollup_version": keys.version_entry_key("rollup-job", "host-1-42"),
    "verify_version": keys.version_entry_key("rollup-verify", "host-1-43"),
}
# The rollup's own version entries (PROTOCOL §3.10 "Writing"): the job and `lm-rollup
# verify` register at start and delete their entry when they end.
ROLLUP_VERSIONS = {"rollup_version", "verify_version"}
ROLLUP_KINDS = {"rollup_pointer", "rollup_data"} | ROLLUP_VERSIONS
NEVER_DELETED = {"accepted", "quarantine"}
MAY_DELETE = {
    "collector": {"probe"},
    # The reconciler compacts its catalog, trims its records and, after migration, drops
    # the version-1 per-object index (lm-reconciler drop-v1-index).
    "reconciler": {
        "index_log",
        "index_catalog",
        "catalog_created",
        "reconciler_state",
        "raw_blob_by_time",
        "accepted_by_time",
        "accepted_by_blob",
        "quarantine_by_blob",
        # index/v1/* is the reconciler's: the feature record and the registry live there.
        "feature_record",
        "collector_version",
        "rollup_version",
        "verify_version",
    },
    # Every delete the GC makes (reconciler/gc.py through the GC role's store; running the
    # GC under these documents: test_policies_enforced.py).
    "gc": {"raw_blob", "raw_bundle", "gc_mark", "gc_veto"},
    "rollup": ROLLUP_KINDS | {"rollup_dirty", "rollup_work"},
}


def store_location() -> tuple[str, str]:
    location = k8s_settings("collector.toml").store.location
    return location.bucket, location.prefix  # type: ignore[union-attr]


def object_arn(key: str) -> str:
    bucket, prefix = store_location()
    return f"arn:aws:s3:::{bucket}/{prefix}/{key}"


def can(role: str, action: str, key: str, *, if_none_match: bool = True) -> bool:
    extra = {"s3:if-none-match": "*"} if if_none_match and action == "s3:PutObject" else {}
    return role_may(role, action, object_arn(key), extra=extra)


@pytest.mark.parametrize("role", sorted(POLICY_FILES))
def test_each_role_may_delete_exactly_what_it_needs(role: str) -> None:
    deletable = {
        name
        for name, key in SAMPLE_KEYS.items()
        if can(role, "s3:DeleteObject", key) or can(role, "s3:DeleteObjectVersion", key)
    }
    assert deletable == MAY_DELETE[role]
    assert not deletable & NEVER_DELETED


@pytest.mark.parametrize("role", ["collector", "reconciler", "rollup"])
def test_each_role_may_read_everything(role: str) -> None:
    assert all(can(role, "s3:GetObject", key) for key in SAMPLE_KEYS.values())


def test_only_rollup_writes_are_confined_to_its_dataset() -> None:
    for name, key in SAMPLE_KEYS.items():
        assert can("rollup", "s3:PutObject", key) == (name in ROLLUP_KINDS), name
        assert can("collector", "s3:PutObject", key), name
        assert can("reconciler", "s3:PutObject", key), name


def test_the_bucket_policy_denies_deleting_acceptance_records_to_everyone() -> None:
    bucket_policy = load_policy("bucket-policy.json")
    anyone = {
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}],
    }
    admin = {
        "aws:PrincipalArn": f"arn:aws:iam::{ACCOUNT}:role/admin",
        "aws:SecureTransport": "true",
    }
    for name in NEVER_DELETED:
        for action in ("s3:DeleteObject", "s3:DeleteObjectVersion"):
            assert not allowed(anyone, bucket_policy, action, object_arn(SAMPLE_KEYS[name]), admin)
        # Create-once objects: no unconditional PUT can replace one.
        unconditional = allowed(
            anyone, bucket_policy, "s3:PutObject", object_arn(SAMPLE_KEYS[name]), admin
        )
        assert not unconditional
    deny_delete = [
        s
        for s in bucket_policy["Statement"]
        if s["Effect"] == "Deny"
        and s["Principal"] == "*"
        and "Condition" not in s
        and "s3:DeleteObject" in s["Action"]
    ]
    assert deny_delete, "the deny must be unconditional and for every principal"


def test_the_gc_role_of_the_bucket_policy_is_the_reconciler_gc_profile() -> None:
    aws_config = configparser.ConfigParser()
    aws_config.read(K8S / "reconciler-aws-config", encoding="utf-8")
    profile = k8s_settings("reconciler.toml").store.gc_credentials_profile
    assert aws_config.get(f"profile {profile}", "role_arn") == role_arn("gc")


def test_policies_name_the_configured_bucket_and_prefix() -> None:
    bucket, prefix = store_location()
    for path in POLICIES.glob("*-policy.json"):
        for statement in load_policy(path.name)["Statement"]:
            resources = statement["Resource"]
            for resource in [resources] if isinstance(resources, str) else resources:
                within = resource == f"arn:aws:s3:::{bucket}" or resource.startswith(
                    f"arn:aws:s3:::{bucket}/{prefix}/"
                )
                # Only a deny may cover the whole bucket (e.g. TLS only).
                whole_bucket = resource == f"arn:aws:s3:::{bucket}/*"
                assert within or (whole_bucket and statement["Effect"] == "Deny"), (
                    f"{path.name}: {resource}"
                )


def test_no_role_may_delete_object_versions() -> None:
    # Permanent deletion of versions is the lifecycle rules' job (bucket-policy/README.md).
    for role in POLICY_FILES:
        for key in SAMPLE_KEYS.values():
            assert not can(role, "s3:DeleteObjectVersion", key), (role, key)


def test_lifecycle_rules_never_expire_or_archive_acceptance_records_or_raw_blobs() -> None:
    _, prefix = store_location()
    rules = json.loads((POLICIES / "lifecycle.json").read_text(encoding="utf-8"))["Rules"]
    protected = {
        name: f"{prefix}/{SAMPLE_KEYS[name]}"
        for name in ("accepted", "quarantine", "raw_blob", "raw_bundle", "accepted_by_blob")
    }
    for rule in rules:
        rule_prefix = rule.get("Filter", {}).get("Prefix", rule.get("Prefix", ""))
        assert "And" not in rule.get("Filter", {}), "teach the test about combined filters"
        for name, key in protected.items():
            if not key.startswith(rule_prefix):
                continue
            expiration = rule.get("Expiration", {})
            assert not {"Days", "Date"} & expiration.keys(), f"{rule['ID']} expires {name}"
            assert "Transitions" not in rule, f"{rule['ID']} moves {name} to another class"
            if name in NEVER_DELETED:
                assert "NoncurrentVersionExpiration" not in rule, f"{rule['ID']} on {name}"
                assert "NoncurrentVersionTransitions" not in rule, f"{rule['ID']} on {name}"


# --- container image ----------------------------------------------------------------------


def test_the_image_copies_every_package_and_runs_lm_collector_as_non_root() -> None:
    args, stages = read_dockerfile(CONTAINER / "Dockerfile")
    assert all(stage.base.startswith("python:3.11-slim") for stage in stages if ":" in stage.base)
    assert "python:3.11-slim" in args["PYTHON_IMAGE"]
    includes = PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = {pattern.rstrip("*") for pattern in includes}
    copied = {source for stage in stages for source in copy_sources(stage)}
    assert packages <= copied, f"not copied into the image: {sorted(packages - copied)}"
    assert {"pyproject.toml", PYPROJECT["project"]["readme"]} <= copied
    for source in copied:
        assert (ROOT / source).exists(), source
    final = stages[-1]
    entrypoint = exec_form(final.last("ENTRYPOINT") or "[]")
    assert entrypoint[-1] == "lm-collector" and "lm-collector" in SCRIPTS
    user = final.last("USER")
    assert user is not None and not user.startswith(("0:", "root"))
    text = (CONTAINER / "Dockerfile").read_text(encoding="utf-8")
    assert "STOPSIGNAL SIGTERM" in text
    assert "Docker is not available" in text  # why CI does not build it


def test_the_ignore_file_keeps_everything_the_image_copies() -> None:
    patterns = dockerignore_patterns(CONTAINER / "dockerignore")
    _, stages = read_dockerfile(CONTAINER / "Dockerfile")
    for source in {s for stage in stages for s in copy_sources(stage)}:
        path = ROOT / source
        samples = (
            [source]
            if path.is_file()
            else [
                str(p.relative_to(ROOT)) for p in path.rglob("*.py") if "__pycache__" not in p.parts
            ][:5]
        )
        for sample in samples:
            assert not docker_ignores(patterns, sample), sample
    for unwanted in (
        ".venv/bin/python",
        ".git/HEAD",
        "tests/conftest.py",
        "collector/__pycache__/app.cpython-311.pyc",
    ):
        assert docker_ignores(patterns, unwanted), unwanted


# --- observability names in the docs ------------------------------------------------------


def test_metric_names_in_deploy_docs_exist() -> None:
    registry = CollectorMetrics().registry
    names = {metric.name for metric in registry.collect()}
    samples = {sample.name for metric in registry.collect() for sample in metric.samples}
    declared = names | samples | {f"{n}_bucket" for n in names} | {f"{n}_total" for n in names}
    mentioned = set()
    for path in text_files():
        mentioned |= set(re.findall(r"\blm_collector_[a-z_]+", path.read_text(encoding="utf-8")))
    assert mentioned, "the deploy docs should name the collector metrics"
    assert mentioned <= declared, sorted(mentioned - declared)


def test_label_values_in_deploy_docs_are_ones_the_collector_uses() -> None:
    sources = "".join(
        path.read_text(encoding="utf-8") for path in sorted((ROOT / "collector").glob("*.py"))
    )
    for path in text_files():
        for label, value in re.findall(
            r'\b(outcome|fate|result)="([a-z_]+)"', path.read_text("utf-8")
        ):
            assert f'"{value}"' in sources, f"{path.name}: {label}={value!r}"


# --- Spark on Kubernetes ----------------------------------------------------------------------


def test_the_k8s_entrypoint_reads_only_variables_spark_sets() -> None:
    """deploy/spark/k8s-entrypoint.sh is the driver/executor pods' entrypoint (not run in
    CI): it must parse, and every SPARK_* variable it reads must be one the installed
    Spark names (org.apache.spark.deploy.k8s.Constants), or SPARK_HOME from the image."""
    import pyspark

    script = DEPLOY / "spark" / "k8s-entrypoint.sh"
    assert os.access(script, os.X_OK)  # the image's COPY keeps the mode
    subprocess.run(["bash", "-n", str(script)], check=True)
    used = set(re.findall(r"\$\{!?(SPARK_[A-Z_]+)", script.read_text(encoding="utf-8")))
    jar = next((Path(pyspark.__file__).parent / "jars").glob("spark-kubernetes_*.jar"))
    with zipfile.ZipFile(jar) as archive:
        constants = archive.read("org/apache/spark/deploy/k8s/Constants$.class")
    known = set(re.findall(rb"SPARK_[A-Z_]+", constants))
    unknown = {name for name in used if name.encode() not in known} - {"SPARK_HOME"}
    assert used and not unknown, unknown
