"""docker-compose.yml checked without a Docker engine and without the network.

The file is validated against the compose-spec JSON schema that check-jsonschema ships
(``--builtin-schema vendor.compose-spec``, offline), and a deliberately broken copy must be
rejected so that a passing validation means something. Then the deployment promises the file
makes: UI on localhost by default, a postgres healthcheck, one GPU per worker, no passwords, no
example secrets.
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


def workers(compose) -> dict[str, dict]:
    return {name: service for name, service in compose["services"].items() if name.startswith("gpu-worker")}


def example_env() -> dict[str, str]:
    return dict(line.split("=", 1) for line in ENV_EXAMPLE.read_text().splitlines()
                if line.strip() and not line.startswith("#"))


def test_postgres_has_a_healthcheck_the_others_wait_for(compose):
    services = compose["services"]
    check = services["postgres"]["healthcheck"]
    assert not check.get("disable", False)
    assert "pg_isready" in " ".join(check["test"] if isinstance(check["test"], list) else [check["test"]])
    assert workers(compose)
    for name in ("prefect-server", *workers(compose)):
        assert services[name]["depends_on"]["postgres"]["condition"] == "service_healthy", name
    for name in ("deployments", *workers(compose)):
        assert services[name]["depends_on"]["prefect-server"]["condition"] == "service_healthy", name
    assert "healthcheck" in services["prefect-server"]


def test_each_worker_reserves_exactly_one_gpu_its_own(compose):
    indices = []
    for name, service in workers(compose).items():
        devices = service["deploy"]["resources"]["reservations"]["devices"]
        gpus = [d for d in devices if d.get("driver") == "nvidia" and "gpu" in d.get("capabilities", [])]
        assert len(gpus) == 1, (name, devices)
        (gpu,) = gpus
        assert len(gpu["device_ids"]) == 1, name
        assert "count" not in gpu  # Docker refuses count together with device_ids, and count: 1 is GPU 0
        indices.append(interpolate(gpu["device_ids"][0], {}))
    assert indices[0] == "0" and len(set(indices)) == len(indices), indices


def test_workers_run_replaybench_worker_on_their_host_gpu(compose):
    """`replaybench worker`, not a bare Prefect worker: the GPU's concurrency limit and queue and two
    slots come with it. `--gpu` is the GPU's index on the host (the reserved device), so that limit,
    queue and cores differ per GPU, whereas in the container that GPU is device 0; the names use
    REPLAYBENCH_HOST, not the container's random hostname. Workers start once the deployments are."""
    env = {**example_env(), "POSTGRES_PASSWORD": "p", "PREFECT_API_AUTH_STRING": "u:p", "REPLAYBENCH_GPU1": "5"}
    resolved = yaml.safe_load(interpolate(COMPOSE.read_text(), env))
    seen = set()
    for name, service in workers(resolved).items():
        command = service["command"]
        assert command[:2] == ["replaybench", "worker"], (name, command)
        option = lambda flag: command[command.index(flag) + 1]
        assert option("--gpu") == service["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"][0]
        assert option("--device") == "0"
        assert option("--pool") == "gpu"  # the pool prefect.yaml's deployments go to
        seen.add(option("--gpu"))
        environment = service["environment"]
        assert environment["REPLAYBENCH_HOST"] == "compose"
        assert "CUDA_VISIBLE_DEVICES" not in environment  # `--device` sets it
        assert service["depends_on"]["deployments"]["condition"] == "service_completed_successfully"
    assert seen == {"0", "5"}
    assert {d["work_pool"]["name"] for d in yaml.safe_load((ROOT / "prefect.yaml").read_text())["deployments"]} == {"gpu"}


def dockerfile() -> tuple[dict[str, str], str, list[str]]:
    """The image's ENV, WORKDIR and what it COPYs."""
    lines = (ROOT / "Dockerfile").read_text().replace("\\\n", " ").splitlines()
    env, workdir, copied = {}, "/", []
    for line in lines:
        word, _, rest = line.strip().partition(" ")
        if word == "ENV":
            env.update(pair.split("=", 1) for pair in rest.split())
        elif word == "WORKDIR":
            workdir = rest.strip()
        elif word == "COPY":
            copied.append(rest.split()[0])
    return env, workdir, copied


def test_no_unset_paths_in_the_image(compose):
    """prefect.yaml's steps read environment variables on the worker: each is set there, and the
    prefect.yaml that `prefect deploy` reads is in the image's working directory."""
    image_env, workdir, copied = dockerfile()
    assert "prefect.yaml" in copied
    text = (ROOT / "prefect.yaml").read_text()
    used = set(re.findall(r"\{\{\s*\$([A-Za-z_][A-Za-z0-9_]*)\s*\}\}", text))
    assert "REPLAYBENCH_HOME" in used
    for name, service in workers(compose).items():
        environment = {**image_env, **service["environment"]}
        assert used <= set(environment), (name, used - set(environment))
    assert image_env["REPLAYBENCH_HOME"] == workdir == "/app"


def test_the_example_secrets_are_refused():
    """.env.example as copied: the stack does not start until both secrets are set."""
    env = example_env()
    assert env["POSTGRES_PASSWORD"] == "" and env["PREFECT_API_AUTH_STRING"] == ""
    text = COMPOSE.read_text()
    with pytest.raises(KeyError):
        interpolate(text, env)
    with pytest.raises(KeyError, match="POSTGRES_PASSWORD"):
        interpolate(text, {**env, "PREFECT_API_AUTH_STRING": "u:a-real-one"})
    with pytest.raises(KeyError, match="PREFECT_API_AUTH_STRING"):
        interpolate(text, {**env, "POSTGRES_PASSWORD": "a-real-one"})
    resolved = yaml.safe_load(interpolate(text, {**env, "POSTGRES_PASSWORD": "pw1", "PREFECT_API_AUTH_STRING": "u:pw2"}))
    server, deploy = resolved["services"]["prefect-server"]["environment"], resolved["services"]["deployments"]["environment"]
    assert server["PREFECT_SERVER_API_AUTH_STRING"] == "u:pw2"
    for service in (deploy, *(s["environment"] for s in workers(resolved).values())):
        assert service["PREFECT_API_AUTH_STRING"] == "u:pw2"


def test_no_password_literal_in_compose_file(compose):
    text = COMPOSE.read_text()
    assert "change-me" not in text
    whole_reference = re.compile(rf"^{REFERENCE.pattern}$")
    checked = 0
    for path, value in strings(compose):
        if "PASSWORD" in path[-1].upper() or "AUTH_STRING" in path[-1].upper():
            assert whole_reference.match(value), f"{'.'.join(path)} is not a ${{...}} reference"
            checked += 1
        # scheme://user:PASSWORD@host, where PASSWORD may be a reference with spaces in its message
        for userinfo in re.findall(r"://[^/:@\s]+:((?:\$\{[^}]*\}|[^@\s])*)@", value):
            assert whole_reference.match(userinfo), f"{'.'.join(path)} has a password literal in a URL"
            checked += 1
    assert checked >= 6  # postgres, the Prefect and replaybench database URLs, the auth string 3 times


def test_variables_used_are_in_env_example(compose):
    example = {line.split("=", 1)[0] for line in ENV_EXAMPLE.read_text().splitlines() if "=" in line and not line.startswith("#")}
    references = [m for _, value in strings(compose) for m in REFERENCE.finditer(value)]  # comments don't count
    used = {m["name"] for m in references}
    required = {m["name"] for m in references if m["op"] in (None, "?", ":?")}
    assert "POSTGRES_PASSWORD" in required
    assert required <= example, required - example
    assert used <= example, used - example

