"""docker-compose.yml checked without a Docker engine and without the network.

The file is validated against the compose-spec JSON schema that check-jsonschema ships
(``--builtin-schema vendor.compose-spec``, offline), and a deliberately broken copy must be
rejected so that a passing validation means something. The rest are the deployment promises the
file makes: UI on localhost by default, a postgres healthcheck, one GPU per worker, no passwords.
"""

from __future__ import annotations

import copy
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "docker-compose.yml"
ENV_EXAMPLE = ROOT / ".env.example"

# ${VAR}, ${VAR:-default}, ${VAR-default}, ${VAR:?error}, ${VAR?error} (compose interpolation)
REFERENCE = re.compile(r"\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}")


def validate(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.compose-spec", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def interpolate(text: str, env: dict[str, str]) -> str:
    """Resolve compose variable references the way ``docker compose`` does with ``env``."""

    def resolve(match: re.Match) -> str:
        name, op, arg = match["name"], match["op"], match["arg"]
        value = env.get(name)
        if op == ":-":
            return value if value else arg
        if op == "-":
            return arg if value is None else value
        if op in (":?", "?") and (value is None or (op == ":?" and not value)):
            raise KeyError(f"{name}: {arg}")
        return value or ""

    return REFERENCE.sub(resolve, text)


def strings(node, path=()):
    """Every (key path, string) in the parsed file."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield from strings(value, (*path, str(key)))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from strings(value, (*path, str(i)))
    elif isinstance(node, str):
        yield path, node


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def test_compose_file_matches_compose_spec():
    result = validate(COMPOSE)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "validation done" in result.stdout


@pytest.mark.parametrize("breakage", ["ports-not-a-list", "unknown-top-level-key"])
def test_validator_rejects_a_broken_copy(compose, tmp_path, breakage):
    broken = copy.deepcopy(compose)
    if breakage == "ports-not-a-list":
        broken["services"]["prefect-server"]["ports"] = 5
        expected = "5 is not of type 'array'"
    else:
        broken["replaybench-settings"] = {"pool": "gpu"}  # only x-* keys are allowed at the top
        expected = "'replaybench-settings' does not match any of the regexes"
    path = tmp_path / "docker-compose.yml"
    path.write_text(yaml.safe_dump(broken, sort_keys=False))
    result = validate(path)
    assert result.returncode == 1, result.stdout + result.stderr  # 1: schema errors, not a crash
    assert expected in result.stdout + result.stderr


def test_prefect_ui_is_bound_to_localhost_by_default(compose):
    ports = compose["services"]["prefect-server"]["ports"]
    published = []
    for port in ports:
        if isinstance(port, dict):  # long syntax
            if str(port.get("target")) == "4200":
                published.append(interpolate(str(port.get("host_ip", "")), {}))
        else:  # [HOST_IP:]HOST_PORT:CONTAINER_PORT[/PROTOCOL]
            parts = interpolate(str(port), {}).split("/")[0].split(":")
            if parts[-1] == "4200":
                published.append(":".join(parts[:-2]))  # empty: published on every address
    assert published, "prefect-server publishes no port 4200"
    assert published == ["127.0.0.1"] * len(published), published
    # ... and it can be opened up on purpose, through PREFECT_UI_BIND
    assert any("PREFECT_UI_BIND" in str(p) for p in ports)


def test_postgres_has_a_healthcheck_the_others_wait_for(compose):
    services = compose["services"]
    check = services["postgres"]["healthcheck"]
    assert not check.get("disable", False)
    assert "pg_isready" in " ".join(check["test"] if isinstance(check["test"], list) else [check["test"]])
    for name in ("prefect-server", "gpu-worker"):
        assert services[name]["depends_on"]["postgres"]["condition"] == "service_healthy", name
    assert services["gpu-worker"]["depends_on"]["prefect-server"]["condition"] == "service_healthy"
    assert "healthcheck" in services["prefect-server"]


def test_worker_reserves_exactly_one_gpu(compose):
    devices = compose["services"]["gpu-worker"]["deploy"]["resources"]["reservations"]["devices"]
    gpus = [d for d in devices if d.get("driver") == "nvidia" and "gpu" in d.get("capabilities", [])]
    assert len(gpus) == 1, devices
    (gpu,) = gpus
    if "device_ids" in gpu:
        assert len(gpu["device_ids"]) == 1
        assert "count" not in gpu  # Docker refuses count together with device_ids
        assert interpolate(gpu["device_ids"][0], {}) == "0"
    else:
        assert gpu.get("count") == 1


def test_no_password_literal_in_compose_file(compose):
    text = COMPOSE.read_text()
    env_example = dict(
        line.split("=", 1) for line in ENV_EXAMPLE.read_text().splitlines() if line.strip() and not line.startswith("#")
    )
    assert env_example["POSTGRES_PASSWORD"] not in text  # the placeholder is not copied into the file
    whole_reference = re.compile(rf"^{REFERENCE.pattern}$")
    checked = 0
    for path, value in strings(compose):
        if "PASSWORD" in path[-1].upper():
            assert whole_reference.match(value), f"{'.'.join(path)} is not a ${{...}} reference"
            checked += 1
        # scheme://user:PASSWORD@host, where PASSWORD may be a reference with spaces in its message
        for userinfo in re.findall(r"://[^/:@\s]+:((?:\$\{[^}]*\}|[^@\s])*)@", value):
            assert whole_reference.match(userinfo), f"{'.'.join(path)} has a password literal in a URL"
            checked += 1
    assert checked >= 3  # postgres itself, the Prefect database URL, the replaybench database URL


def test_variables_used_are_in_env_example(compose):
    example = {line.split("=", 1)[0] for line in ENV_EXAMPLE.read_text().splitlines() if "=" in line and not line.startswith("#")}
    references = [m for _, value in strings(compose) for m in REFERENCE.finditer(value)]  # comments don't count
    used = {m["name"] for m in references}
    required = {m["name"] for m in references if m["op"] in (None, "?", ":?")}
    assert "POSTGRES_PASSWORD" in required
    assert required <= example, required - example
    assert used <= example, used - example
