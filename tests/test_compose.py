"""docker-compose.yml checked without a Docker engine and without the network.

The file is validated against the compose-spec JSON schema that check-jsonschema ships
(``--builtin-schema vendor.compose-spec``, offline), and a deliberately broken copy must be
rejected so that a passing validation means something. Then the deployment promises the file
makes: UI on localhost by default, a postgres healthcheck, one GPU per worker, no passwords, no
example secrets. Last, the stack itself: every service's own command line and environment, as
compose interpolates them, run outside Docker against a real Prefect server and PostgreSQL, mapping
only what Docker provides (service names, ports, volumes, the image's PATH and ENV), through a
sharded nightly run to its report.
"""

from __future__ import annotations

import copy
import os
import re
import secrets
import shlex
import signal
import subprocess
import sys
import time
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


# -- the stack, outside Docker ------------------------------------------------------------------

POSTGRES_URL = os.environ.get("REPLAYBENCH_TEST_POSTGRES_URL")


def as_args(command) -> list[str]:
    """A compose `command` (a list, or a string split as compose splits it) as a program's arguments."""
    return list(command) if isinstance(command, list) else shlex.split(command)


def healthcheck_args(check: dict) -> list[str]:
    test = check["test"]
    if isinstance(test, str):
        return ["sh", "-c", test]
    return ["sh", "-c", test[1]] if test[0] == "CMD-SHELL" else test[1:]


class Stack:
    """What Docker would provide, outside Docker: each service's name and port mapped to this host,
    its volumes and the image's working directory to directories here, its image's ENV and PATH
    (`replaybench`, `prefect` and `python` of this interpreter), a home of its own; nothing else
    from this process's environment."""

    def __init__(self, tmp_path: Path, env_file: dict[str, str], replace: dict[str, str], prefect_port: int):
        self.tmp = tmp_path
        self.compose = yaml.safe_load(interpolate(COMPOSE.read_text(), env_file))
        self.replace = replace
        self.port = prefect_port
        self.image_env, self.workdir, _ = dockerfile()
        self.bin = tmp_path / "bin"
        self.bin.mkdir()
        for name, module in (("replaybench", "replaybench.cli"), ("prefect", "prefect"), ("python", None)):
            program = self.bin / name
            program.write_text(f'#!/bin/sh\nexec {sys.executable} {"-m " + module if module else ""} "$@"\n')
            program.chmod(0o755)
        self.logs: dict[str, Path] = {}

    def map(self, value: str) -> str:
        for docker, here in self.replace.items():
            value = value.replace(docker, here)
        return value

    def service(self, name: str) -> dict:
        return self.compose["services"][name]

    def env(self, name: str) -> dict[str, str]:
        service = self.service(name)
        home = self.tmp / "home" / name
        home.mkdir(parents=True, exist_ok=True)
        built = "build" in service  # our image: its ENV, the package installed from /app
        env = {
            "PATH": f"{self.bin}:/usr/local/bin:/usr/bin:/bin",
            "HOME": str(home),
            **({**self.image_env, "PYTHONPATH": str(ROOT)} if built else {}),
            **{k: str(v) for k, v in service.get("environment", {}).items()},
        }
        if name == "prefect-server":  # published on a free port here: the server listens there
            env["PREFECT_SERVER_API_PORT"] = str(self.port)
        return {k: self.map(v) for k, v in env.items()}

    def args(self, name: str) -> list[str]:
        return [self.map(a) for a in as_args(self.service(name)["command"])]

    def cwd(self, name: str) -> str:
        return self.map(self.workdir) if "build" in self.service(name) else str(self.tmp)

    def log(self, name: str) -> Path:
        self.logs[name] = self.tmp / f"{name}.log"
        return self.logs[name]

    def run(self, name: str, timeout: float) -> subprocess.CompletedProcess:
        with open(self.log(name), "w") as log:
            return subprocess.run(self.args(name), env=self.env(name), cwd=self.cwd(name), stdout=log,
                                  stderr=subprocess.STDOUT, timeout=timeout)

    def start(self, name: str) -> subprocess.Popen:
        log = open(self.log(name), "w")
        process = subprocess.Popen(self.args(name), env=self.env(name), cwd=self.cwd(name), stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True)
        process.log_file = log
        return process


def stop(process: subprocess.Popen) -> None:
    """As `docker stop` does: SIGTERM (a worker stops its Prefect worker), then SIGKILL to what is left."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()
    process.log_file.close()


def wait_for(what: str, check, timeout: float, logs=lambda: "") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(1)
    raise AssertionError(f"{what}: not within {timeout:.0f} s\n{logs()}")


@pytest.fixture
def databases():
    """Two new databases on the test server, for what docker/postgres-init and POSTGRES_DB create:
    Prefect's and the results store's; dropped afterwards."""
    from sqlalchemy import create_engine, text

    engine = create_engine(POSTGRES_URL, isolation_level="AUTOCOMMIT")
    suffix = secrets.token_hex(6)
    names = {"prefect": f"rb_prefect_{suffix}", "replaybench": f"rb_store_{suffix}"}
    with engine.connect() as con:
        for name in names.values():
            con.execute(text(f'CREATE DATABASE "{name}"'))
    yield names
    for name in names.values():
        for attempt in range(40):
            with engine.connect() as con:
                con.execute(text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :name "
                                 "AND usename = current_user AND pid <> pg_backend_pid()"), {"name": name})
                try:
                    con.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))
                    break
                except Exception:
                    if attempt == 39:
                        raise
            time.sleep(0.25)
    engine.dispose()


@pytest.mark.slow
@pytest.mark.skipif(not POSTGRES_URL, reason="set REPLAYBENCH_TEST_POSTGRES_URL (.ci/postgres.sh starts a server)")
def test_the_stack_runs_a_sharded_nightly_to_its_report(tmp_path, databases):
    import httpx
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName, LogFilter, LogFilterFlowRunId
    from prefect.deployments import run_deployment
    from prefect.settings import PREFECT_API_AUTH_STRING, PREFECT_API_URL, temporary_settings
    from sqlalchemy.engine import make_url

    from replaybench.storage import Store
    from replaybench.worker import measuring_cores

    from .prefect_server import free_port

    postgres = make_url(POSTGRES_URL)
    port = free_port()
    auth = f"admin:{secrets.token_urlsafe(18)}"
    env_file = {**example_env(), "POSTGRES_PASSWORD": postgres.password, "PREFECT_API_AUTH_STRING": auth,
                "PREFECT_UI_API_URL": f"http://127.0.0.1:{port}/api"}
    reports = tmp_path / "reports"
    reports.mkdir()
    at = f"{postgres.host}:{postgres.port or 5432}"
    stack = Stack(tmp_path, env_file, {
        "//replaybench:": f"//{postgres.username}:",  # POSTGRES_USER's role: the test server's
        "@postgres:5432/prefect": f"@{at}/{databases['prefect']}",
        "@postgres:5432/replaybench": f"@{at}/{databases['replaybench']}",
        "prefect-server:4200": f"127.0.0.1:{port}",
        "localhost:4200": f"127.0.0.1:{port}",
        "/reports": str(reports),  # the `reports` volume
        "/app": str(ROOT),  # the image's working directory, where the Dockerfile copies the code
    }, port)
    api = f"http://127.0.0.1:{port}/api"
    started: list[subprocess.Popen] = []
    logs = lambda: "\n".join(f"--- {n}\n{p.read_text()[-3000:]}" for n, p in stack.logs.items())
    try:
        # prefect-server, on PostgreSQL through asyncpg, until its own healthcheck passes
        server = stack.start("prefect-server")
        started.append(server)
        check = healthcheck_args(stack.service("prefect-server")["healthcheck"])
        healthy = lambda: subprocess.run([stack.map(a) for a in check], env=stack.env("prefect-server"),
                                         capture_output=True, timeout=30).returncode == 0
        wait_for("prefect-server healthy", lambda: server.poll() is None and healthy(), 180, logs)
        # basic authentication: the API refuses a call without the auth string, the UI asks for it
        assert httpx.post(f"{api}/flows/filter", json={}, timeout=10).status_code == 401
        assert httpx.post(f"{api}/flows/filter", json={}, auth=tuple(auth.split(":", 1)), timeout=10).status_code == 200
        ui = httpx.get(f"http://127.0.0.1:{port}/ui-settings", timeout=10).json()
        assert (ui["api_url"], ui["auth"]) == (env_file["PREFECT_UI_API_URL"], "BASIC")

        # deployments: the work pool and prefect.yaml's deployments, then it exits 0
        deployed = stack.run("deployments", timeout=300)
        assert deployed.returncode == 0, logs()

        # the workers, one per GPU
        names = sorted(workers(stack.compose))
        assert names == ["gpu-worker-0", "gpu-worker-1"]
        for name in names:
            started.append(stack.start(name))
        with temporary_settings({PREFECT_API_URL: api, PREFECT_API_AUTH_STRING: auth}):
            with get_client(sync_client=True) as client:
                queues = lambda: {q.name for q in client.read_work_queues(work_pool_name="gpu")}
                wait_for("a queue per GPU", lambda: {"gpu-compose-0", "gpu-compose-1"} <= queues(), 180, logs)
                deployments = {d.name for d in client.read_deployments()}
                assert {"nightly", "adhoc", "shard", "ack", "ab"} <= deployments
                for gpu in ("0", "1"):  # a GPU's limit: one measurement at a time, whatever the container
                    limit = client.read_global_concurrency_limit_by_name(f"replaybench-gpu-compose-{gpu}")
                    assert limit.limit == 1

            # the nightly deployment as registered (shards: 2 from prefect.yaml), a small suite
            parent = run_deployment(
                "replaybench/nightly",
                parameters={"parameters": {"workloads": ["seed_mlp", "deep_mlp"], "sizes": {"depth": [2]},
                                           "time_budget_s": 0.3, "processes": 1}},
                timeout=300,
                poll_interval=2,
            )
            assert parent.state.is_completed(), f"{parent.state}\n{logs()}"
            assert parent.parameters["shards"] == 2
            with get_client(sync_client=True) as client:
                shards = client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(like_="shard-")))
                flow_logs = client.read_logs(log_filter=LogFilter(
                    flow_run_id=LogFilterFlowRunId(any_=[parent.id, *(s.id for s in shards)])))
    finally:
        for process in reversed(started):
            stop(process)

    # both shards completed, one on each GPU's queue: stable names, REPLAYBENCH_HOST's, not a hostname's
    assert len(shards) == 2 and all(s.state.is_completed() for s in shards), [s.state for s in shards]
    assert {s.work_queue_name for s in shards} == {"gpu-compose-0", "gpu-compose-1"}
    # the results, in the PostgreSQL store
    store = Store(make_url(POSTGRES_URL).set(database=databases["replaybench"]).render_as_string(hide_password=False))
    run = store.run()
    store.engine.dispose()
    assert run.trigger == "nightly" and run.status == "completed", (run.status, run.error)
    assert {r.workload for r in run.results} == {"seed_mlp", "deep_mlp"}
    # each container's measuring process on cores of its own GPU's slot, not every one on slot 0's
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) >= 2:
        used = sorted(tuple(r.health["cpu_cores"]) for r in {r.workload: r for r in run.results}.values())
        assert used == sorted(tuple(measuring_cores(cores, 1, slot)) for slot in (0, 1)), used
    # the report, in the reports volume
    report = (reports / f"{run.id}.md").read_text()
    assert "## seed_mlp" in report and "## deep_mlp" in report
    # no secret in any output of any service, in the flow runs' logs, or in the report
    outputs = {name: path.read_text() for name, path in stack.logs.items()}
    outputs["flow run logs"] = "\n".join(log.message for log in flow_logs)
    outputs["report"] = report
    assert len(flow_logs) > 0 and all(outputs.values())
    password = postgres.password
    # The test server's role may have a password that is also a plain word of every log (CI's is
    # the role's own name, `replaybench`): then only its forms as a password are looked for.
    plain_word = any(password in word for word in (postgres.username, "replaybench", str(ROOT), str(tmp_path)))
    for name, text in outputs.items():
        assert auth not in text and auth.split(":", 1)[1] not in text, f"the auth string in {name}"
        assert f":{password}@" not in text and f"password={password}" not in text, f"the database password in {name}"
        if not plain_word:
            assert password not in text, f"the database password in {name}"
