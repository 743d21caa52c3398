"""docker-compose.yml against the Compose Specification's schema, and the files it uses.

The files are checked statically here; the service's command line runs as a local process
in tests/deploy/test_image.py, and `make stack-test` (tests/deploy/stack_docker.py) starts
the stack with Docker.

Health checks: every long-running service has one. A one-shot job (``restart: "no"``, such
as ``minio-init``) is exempt: services wait for it with ``service_completed_successfully``.
Any other service without one states why in ``x-no-healthcheck-reason``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from tests.deploy.files import (
    CPU_OVERRIDE,
    REPO,
    SETTING_VARIABLES,
    SIDECAR_DOCKERFILE,
    interpolate,
    load_compose,
    merge_compose,
    parse_dockerfile,
    service_environment,
)

COMPOSE_SPEC = Path(__file__).resolve().parent / "data/compose-spec.json"
#: Where the replay service serves its Unix socket, on the volume it shares.
SOCKET = "/run/rlreplay/rlreplay.sock"
GRAFANA = REPO / "deploy/grafana"


def _validate(compose: dict[str, Any]) -> None:
    schema = json.loads(COMPOSE_SPEC.read_text())
    # The spec names draft-07 by a URL jsonschema does not know ("...draft-07/schema" with
    # no "#"), so the validator class is picked explicitly rather than from "$schema".
    validator = jsonschema.Draft7Validator(schema, format_checker=jsonschema.FormatChecker())
    errors = [
        f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
        for e in validator.iter_errors(compose)
    ]
    assert not errors, errors


def test_compose_file_follows_the_compose_spec() -> None:
    _validate(load_compose())


def test_replay_service_keeps_data_on_a_volume_and_backs_up_to_minio() -> None:
    compose = load_compose()
    service = compose["services"]["replay"]
    volume, _, target = service["volumes"][0].partition(":")
    assert volume in compose["volumes"] and target == "/data"
    env = service_environment(service, {})
    assert env["RLREPLAY_DATA_DIR"] == "/data"
    assert env["RLREPLAY_BACKUP_URL"] == "s3://rlreplay-backups/replay"
    assert env["RLREPLAY_RESTORE"] == "latest"
    assert env["AWS_ENDPOINT_URL"] == "http://minio:9000"
    assert "/readyz" in " ".join(service["healthcheck"]["test"])
    assert service["depends_on"] == {
        "minio": {"condition": "service_healthy"},
        "minio-init": {"condition": "service_completed_successfully"},
    }
    # The bucket the job creates is the one the backup URL names.
    init = " ".join(compose["services"]["minio-init"]["entrypoint"])
    assert "mc mb --ignore-existing local/rlreplay-backups" in init


def test_minio_credentials_agree_and_come_from_the_environment() -> None:
    services = load_compose()["services"]
    given = {"MINIO_ROOT_USER": "user-x", "MINIO_ROOT_PASSWORD": "secret-y"}
    replay = service_environment(services["replay"], given)
    minio = service_environment(services["minio"], given)
    assert replay["AWS_ACCESS_KEY_ID"] == minio["MINIO_ROOT_USER"] == "user-x"
    assert replay["AWS_SECRET_ACCESS_KEY"] == minio["MINIO_ROOT_PASSWORD"] == "secret-y"


def test_every_service_has_a_healthcheck_or_is_a_one_shot_job() -> None:
    for name, service in load_compose()["services"].items():
        if service.get("restart") == "no" or "x-no-healthcheck-reason" in service:
            continue
        check = service.get("healthcheck")
        assert check and check.get("test") and not check.get("disable"), name


def test_services_wait_for_what_they_depend_on() -> None:
    services = load_compose()["services"]
    for name, service in services.items():
        for other, condition in (service.get("depends_on") or {}).items():
            one_shot = services[other].get("restart") == "no"
            expected = "service_completed_successfully" if one_shot else "service_healthy"
            assert condition == {"condition": expected}, (name, other)


def test_every_build_has_its_dockerfile() -> None:
    for name, service in load_compose()["services"].items():
        build = service.get("build")
        if build is None:
            continue
        context = REPO / (build if isinstance(build, str) else build.get("context", "."))
        dockerfile = (
            build.get("dockerfile", "Dockerfile") if isinstance(build, dict) else "Dockerfile"
        )
        assert (context / dockerfile).is_file(), name


def test_published_ports_bind_to_localhost() -> None:
    for name, service in load_compose()["services"].items():
        for port in service.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), (name, port)


def test_every_rlreplay_variable_is_a_setting() -> None:
    """The server's variables are its settings; the sidecar's are its flags
    (``RLREPLAY_SIDECAR_<FLAG>``, read by ``rlreplay sidecar``)."""
    from rlreplay.gpu.cli import build_sidecar_parser

    sidecar_variables = {
        f"RLREPLAY_SIDECAR_{action.dest.upper()}"
        for action in build_sidecar_parser()._actions
        if action.option_strings
    }
    for name, service in load_compose()["services"].items():
        for key in service_environment(service, {}):
            if key.startswith("RLREPLAY_SIDECAR_"):
                assert key in sidecar_variables, (name, key)
            elif key.startswith("RLREPLAY_"):
                assert key in SETTING_VARIABLES, (name, key)


def test_mounted_files_exist() -> None:
    for name, service in load_compose()["services"].items():
        for volume in service.get("volumes", []):
            source = str(volume).split(":")[0]
            if source.startswith((".", "/")):
                assert (REPO / source).exists(), (name, source)


def test_sidecar_reserves_a_gpu_and_follows_the_replay_service() -> None:
    services = load_compose()["services"]
    sidecar = services["sidecar"]
    command = sidecar["command"]
    assert command[:2] == ["rlreplay", "sidecar"]
    flags = dict(zip(command[2::2], command[3::2], strict=True))
    assert flags["--server"] == f"unix://{SOCKET}"  # the replay service's Unix socket
    assert flags["--device"] == "cuda"
    assert flags["--port"] == "8100" and flags["--host"] == "0.0.0.0"
    assert interpolate(flags["--table"], {}) == "default"
    assert interpolate(flags["--table"], {"SIDECAR_TABLE": "rollouts"}) == "rollouts"
    devices = sidecar["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}]
    assert sidecar["depends_on"] == {"replay": {"condition": "service_healthy"}}
    assert "8100/healthz" in " ".join(sidecar["healthcheck"]["test"])
    # the image's own command is the compose one with the defaults filled in
    image_cmd = parse_dockerfile(SIDECAR_DOCKERFILE.read_text()).cmd
    assert image_cmd == [interpolate(str(part), {}) for part in command]


def test_cpu_override_runs_the_sidecar_on_the_cpu_without_a_gpu() -> None:
    merged = merge_compose(load_compose(), load_compose(CPU_OVERRIDE))
    _validate(merged)
    sidecar = merged["services"]["sidecar"]
    assert "deploy" not in sidecar
    command = sidecar["command"]
    assert command[command.index("--device") + 1] == "cpu"
    base = load_compose()["services"]["sidecar"]["command"]
    assert [p for p in command if p != "cpu"] == [p for p in base if p != "cuda"]
    assert sidecar["healthcheck"] == load_compose()["services"]["sidecar"]["healthcheck"]


def test_prometheus_scrapes_the_replay_service() -> None:
    config = yaml.safe_load((REPO / "deploy/prometheus/prometheus.yml").read_text())
    targets = [
        target
        for job in config["scrape_configs"]
        for static in job["static_configs"]
        for target in static["targets"]
    ]
    assert {"replay:8000", "sidecar:8100"} <= set(targets)
    assert load_compose()["services"]["prometheus"]["profiles"] == ["monitoring"]


def _exposed_metric_names() -> set[str]:
    """Names a scrape of the service can have (its source spells each one out)."""
    text = "\n".join(p.read_text() for p in (REPO / "app").rglob("*.py"))
    names = set(re.findall(r"rlreplay_[a-z_]+", text))
    # prometheus_client's counters add _total; the snapshot series are f"rlreplay_{stat}".
    names |= {f"{n}_total" for n in names}
    names |= {n.replace("rlreplay_table_", "rlreplay_all_tables_") for n in names}
    snapshots = re.findall(r'"(snapshot[a-z_]*)": \(', (REPO / "app/metrics.py").read_text())
    # the sidecar's series are f"rlreplay_sidecar_{name}", named in gauge(...) and counter(...)
    sidecar = (REPO / "gpu/service.py").read_text()
    names |= {f"rlreplay_sidecar_{n}" for n in re.findall(r'(?:gauge|counter)\("(\w+)"', sidecar)}
    return names | {f"rlreplay_{s}" for s in snapshots}


#: The sidecar's lag gauges, which the dashboard must plot.
SIDECAR_LAG = frozenset({"rlreplay_sidecar_lag_events", "rlreplay_sidecar_lag_seconds"})


def test_grafana_dashboard_plots_metrics_the_service_exports() -> None:
    datasource = yaml.safe_load((GRAFANA / "provisioning/datasources/prometheus.yml").read_text())[
        "datasources"
    ][0]
    assert datasource["url"] == "http://prometheus:9090"
    dashboard: dict[str, Any] = json.loads((GRAFANA / "dashboards/rlreplay.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = {n for e in exprs for n in re.findall(r"rlreplay_[a-z_]+", e)}
    assert used <= _exposed_metric_names(), used - _exposed_metric_names()
    for wanted in (
        "rlreplay_items_total",
        "rlreplay_ops_total",
        "rlreplay_writer_lag_seconds",
        "rlreplay_write_queue_depth",
        "rlreplay_snapshot_newest_age_seconds",
        "rlreplay_snapshot_failures_total",
        *SIDECAR_LAG,
    ):
        assert wanted in used, wanted


def test_no_credentials_are_written_into_the_compose_file() -> None:
    # Every credential has the form ${VAR:-local default}, so a real one comes from the
    # environment or an .env file.
    for name, service in load_compose()["services"].items():
        raw = service.get("environment") or {}
        for key, value in raw.items():
            if re.search(r"PASSWORD|SECRET|ACCESS_KEY|API_KEY", key):
                assert str(value).startswith("${"), (name, key)


def test_replay_and_sidecar_restart_when_their_liveness_probe_keeps_failing() -> None:
    """Docker restarts containers that exit, not unhealthy ones: the check (the images'
    rlreplay-healthcheck) ends the process after 3 failed /healthz probes, Docker's init in
    front of it exits, and the restart policy starts the container again. The replay
    service is healthy (what dependants wait for) only once /readyz answers too."""
    services = load_compose()["services"]
    for name, port in (("replay", 8000), ("sidecar", 8100)):
        service = services[name]
        assert service["init"] is True, name
        assert service["restart"] == "unless-stopped", name
        test = service["healthcheck"]["test"]
        assert test[:2] == ["CMD", "rlreplay-healthcheck"], name
        assert test[2:4] == [f"http://127.0.0.1:{port}/healthz", f"http://127.0.0.1:{port}/readyz"]
        assert test[test.index("--kill-after") + 1] == "3", name
        # The check's own probes (2 s each) fit Docker's timeout for it.
        assert service["healthcheck"]["timeout"] == "5s", name


def test_replay_and_sidecar_run_on_a_read_only_root_as_a_user() -> None:
    services = load_compose()["services"]
    for name in ("replay", "sidecar"):
        assert services[name]["read_only"] is True, name
        assert services[name]["tmpfs"] == ["/tmp"], name
    # /data is the replay service's volume, /run/rlreplay its socket's: the only places it
    # writes but /tmp.
    assert services["replay"]["volumes"] == ["replay-data:/data", "replay-socket:/run/rlreplay"]
    for dockerfile in (REPO / "docker/Dockerfile", SIDECAR_DOCKERFILE):
        text = dockerfile.read_text()
        assert re.search(r"^USER 10001:10001$", text, re.M), dockerfile
        assert "COPY docker/healthcheck.py /usr/local/bin/rlreplay-healthcheck" in text


def test_published_host_ports_can_be_moved_and_default_to_the_usual_ones() -> None:
    services = load_compose()["services"]
    expected = {
        "replay": ["127.0.0.1:8000:8000"],
        "sidecar": ["127.0.0.1:8100:8100"],
        "minio": ["127.0.0.1:9000:9000", "127.0.0.1:9001:9001"],
        "prometheus": ["127.0.0.1:9090:9090"],
        "grafana": ["127.0.0.1:3000:3000"],
    }
    for name, ports in expected.items():
        assert [interpolate(p, {}) for p in services[name]["ports"]] == ports, name
    moved = interpolate(services["replay"]["ports"][0], {"REPLAY_PORT": "18000"})
    assert moved == "127.0.0.1:18000:8000"


def test_the_stack_tests_override_swaps_minio_for_moto_and_nothing_else() -> None:
    """tests/deploy/compose.stack.yml: moto on MinIO's name and port, the bucket the backup
    URL names, Debian's Prometheus in prom/prometheus's place; the replay service and the
    sidecar keep their own settings but the interval of their checks."""
    base = load_compose()
    override = load_compose(REPO / "tests/deploy/compose.stack.yml")["services"]
    assert set(override) == {"minio", "minio-init", "replay", "sidecar", "prometheus"}
    assert override["prometheus"] == {"image": "rlreplay-prometheus:test"}
    assert override["replay"] == override["sidecar"] == {"healthcheck": {"interval": "2s"}}
    assert override["minio"]["image"] == override["minio-init"]["image"] == "rlreplay-moto:test"
    assert "--port" in override["minio"]["command"] and "9000" in override["minio"]["command"]
    env = service_environment(base["services"]["replay"], {})
    bucket = env["RLREPLAY_BACKUP_URL"].removeprefix("s3://").split("/")[0]
    init = " ".join(override["minio-init"]["entrypoint"])
    assert f"create_bucket(Bucket='{bucket}')" in init
    assert env["AWS_ENDPOINT_URL"] in init  # http://minio:9000
    _validate(
        merge_compose(merge_compose(base, load_compose(CPU_OVERRIDE)), {"services": override})
    )


def test_the_replay_service_shares_its_unix_socket_on_a_volume() -> None:
    """The server serves TCP and a Unix socket on the volume replay-socket; the sidecar mounts
    the volume at the same place; both images make /run/rlreplay for uid 10001, which a new
    volume takes, so that the non-root server can create the socket in it."""
    compose = load_compose()
    services = compose["services"]
    assert "replay-socket" in compose["volumes"]
    replay = services["replay"]
    env = service_environment(replay, {})
    assert env["RLREPLAY_UDS"] == SOCKET and env.get("RLREPLAY_TCP", "true") == "true"
    assert "RLREPLAY_UDS" in SETTING_VARIABLES
    folder = str(Path(SOCKET).parent)
    for name in ("replay", "sidecar"):
        assert f"replay-socket:{folder}" in services[name]["volumes"], name
    merged = merge_compose(load_compose(), load_compose(CPU_OVERRIDE))["services"]["sidecar"]
    assert merged["command"][merged["command"].index("--server") + 1] == f"unix://{SOCKET}"
    assert merged["volumes"] == services["sidecar"]["volumes"]
    for dockerfile in (REPO / "docker/Dockerfile", SIDECAR_DOCKERFILE):
        runs = " ".join(
            line
            for line in dockerfile.read_text().replace("\\\n", " ").splitlines()
            if line.startswith("RUN ")
        )
        assert re.search(rf"mkdir -p [^&]*{folder}\b", runs), dockerfile
        assert re.search(rf"chown rlreplay:rlreplay [^&]*{folder}\b", runs), dockerfile
        assert re.search(r"useradd [^&]*--uid 10001 ", runs), dockerfile
