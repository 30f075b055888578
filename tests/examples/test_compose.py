"""docker-compose.yml, checked without a Docker engine: its structure (a subset of the
Compose specification, as a JSON schema) and the fleet it describes, which must be the
one examples/fleet.sh runs; ``docker compose config`` too where the client has it."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]

#: The part of the Compose specification this file uses.
SERVICE = {
    "type": "object",
    "properties": {
        "image": {"type": "string"},
        "build": {"type": ["string", "object"]},
        "command": {"type": ["string", "array"], "items": {"type": "string"}},
        "working_dir": {"type": "string"},
        "volumes": {"type": "array", "items": {"type": "string", "pattern": r"^[^:]+:[^:]+(:ro)?$"}},
        "environment": {"type": "object", "additionalProperties": {"type": ["string", "number", "null"]}},
        "ports": {"type": "array", "items": {"type": "string", "pattern": r"^127\.0\.0\.1:\d+:\d+$"}},
        "expose": {"type": "array", "items": {"type": "string", "pattern": r"^\d+$"}},
        "depends_on": {"type": ["array", "object"]},
        "healthcheck": {"type": "object", "required": ["test"]},
    },
    "anyOf": [{"required": ["image"]}, {"required": ["build"]}],
    "additionalProperties": False,
}
SCHEMA = {
    "type": "object",
    "required": ["services"],
    "properties": {"services": {"type": "object", "additionalProperties": SERVICE}},
    "patternProperties": {"^x-": {}},
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def test_the_file_follows_the_compose_schema(compose):
    jsonschema.validate(compose, SCHEMA)


def test_it_runs_the_fleet_of_fleet_sh(compose):
    services = compose["services"]
    assert {"redis", "postgres", "pool-a", "pool-b", "flower", "flask", "prometheus"} <= set(services)
    assert "--appendonly" in services["redis"]["command"] and "yes" in services["redis"]["command"]
    names = []
    for pool in ("pool-a", "pool-b"):
        command = " ".join(services[pool]["command"])
        assert "celery -A worker worker" in command
        names.append(command.split(" -n ")[1].split()[0])
        env = services[pool]["environment"]
        assert env["AAA_STORE_URL"].startswith("postgresql+psycopg://postgres@postgres:")
        assert env["AAA_REDIS_URL"].startswith("redis://redis:")
        assert env["AAA_METRICS_ADDR"] == "0.0.0.0"
    assert len(set(names)) == 2, names  # distinct node names
    assert "flower" in " ".join(services["flower"]["command"])
    assert "flask --app app run" in " ".join(services["flask"]["command"])
    for name, service in services.items():
        for dep in service.get("depends_on") or []:
            assert dep in services, f"{name} depends on unknown {dep}"
        for volume in service.get("volumes") or []:
            assert (ROOT / volume.split(":")[0]).exists(), volume


def test_prometheus_scrapes_every_pool_on_its_metrics_port(compose):
    services = compose["services"]
    mount = services["prometheus"]["volumes"][0].split(":")[0]
    config = yaml.safe_load((ROOT / mount).read_text())
    targets = {t for job in config["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]}
    expected = {f"{pool}:{services[pool]['environment']['AAA_METRICS_PORT']}" for pool in ("pool-a", "pool-b")}
    assert targets == expected
    for pool in ("pool-a", "pool-b"):
        assert services[pool]["environment"]["AAA_METRICS_PORT"] in services[pool]["expose"]


def test_docker_compose_config_accepts_it_where_the_client_has_compose():
    docker = shutil.which("docker")
    if docker is None or subprocess.run([docker, "compose", "version"], capture_output=True).returncode != 0:
        pytest.skip("no `docker compose` client here; the schema test above stands in for it")
    done = subprocess.run([docker, "compose", "-f", str(ROOT / "docker-compose.yml"), "config", "--quiet"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
