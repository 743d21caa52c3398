"""docker-compose.yml against the Compose Specification's schema, and the Dockerfile's shape.

No Docker engine runs on these machines, so the files are checked statically.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import yaml

REPO = Path(__file__).resolve().parents[1]
COMPOSE_SPEC = Path(__file__).resolve().parent / "data/compose-spec.json"


def load_compose() -> dict[str, Any]:
    data = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    assert isinstance(data, dict)
    return data


def test_compose_file_follows_the_compose_spec() -> None:
    schema = json.loads(COMPOSE_SPEC.read_text())
    # The spec names draft-07 by a URL jsonschema does not know ("...draft-07/schema" with
    # no "#"), so the validator class is picked explicitly rather than from "$schema".
    validator = jsonschema.Draft7Validator(schema, format_checker=jsonschema.FormatChecker())
    errors = [
        f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
        for e in validator.iter_errors(load_compose())
    ]
    assert not errors, errors


def test_compose_service_shape() -> None:
    compose = load_compose()
    service = compose["services"]["rlreplay"]
    assert service["build"]["dockerfile"] == "docker/Dockerfile"
    volume, _, target = service["volumes"][0].partition(":")
    assert volume in compose["volumes"] and target == "/data"
    assert service["environment"]["RLREPLAY_DATA_DIR"] == "/data"
    assert "/readyz" in " ".join(service["healthcheck"]["test"])
    assert all(k.startswith(("RLREPLAY_", "AWS_")) for k in service["environment"])
    assert compose["services"]["minio"]["profiles"] == ["backup"]


def test_dockerfile_shape() -> None:
    text = (REPO / "docker/Dockerfile").read_text()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    assert lines[0].startswith("FROM python:3.11-slim")
    assert re.search(r"^USER (?!root)\w+", text, re.M), "runs as a non-root user"
    assert "EXPOSE 8000" in lines
    assert re.search(r"^HEALTHCHECK .*\n?.*/healthz", text, re.M)
    assert re.search(r'^VOLUME \["/data"\]', text, re.M)
    assert 'CMD ["rlreplay", "serve", "--host", "0.0.0.0"]' in lines
    assert re.search(r"^RUN pip install \.", text, re.M)
