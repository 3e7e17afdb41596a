"""Issue 31 item 6: the deployment artefacts under ``deploy/``, each exercised as far as it can run here.

- ``Dockerfile``: docker's daemon does not run here, so the image is not built; its build stage runs
  ``deploy/install.sh``, and this test runs that same script into a fresh virtual environment, then starts the
  installed ``mcp-lossless`` with the image's own ``CMD`` (host and paths moved to loopback and a temporary
  volume) and waits for ``/readyz``.
- ``mcp-lossless.service``: ``systemd-analyze verify`` finds nothing to say, and ``systemd-analyze security``
  rates its exposure low.
- ``kubernetes/mcp-lossless.yaml``: every resource validates strictly (``kubernetes-validate``, from PyPI, with
  its bundled schemas: offline) and holds what the docs promise of it.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.debian import installed_binary
from tests.support.processes import free_port

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
INSTALL_SECONDS = 900
"""A fresh virtual environment downloads and installs every dependency: minutes on a slow link."""
READY_SECONDS = 60


def dockerfile_instructions() -> list[tuple[str, str]]:
    text = (DEPLOY / "Dockerfile").read_text().replace("\\\n", " ")
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return [(line.split(None, 1)[0], line.split(None, 1)[1]) for line in lines]


def test_the_image_is_multi_stage_non_root_with_its_store_on_a_volume() -> None:
    steps = dockerfile_instructions()
    stages = [args for op, args in steps if op == "FROM"]
    assert len(stages) == 2 and stages[0].endswith("AS build"), stages
    runtime = steps[[op for op, _ in steps].index("FROM", 1) :]
    assert ("COPY", "--from=build /opt/mcp-lossless /opt/mcp-lossless") in runtime
    users = [args for op, args in runtime if op == "USER"]
    assert users and users[-1].split(":")[0] not in ("0", "root"), "the runtime stage runs as a user of its own"
    assert ("VOLUME", '["/data"]') in runtime
    command = json.loads(dict(runtime)["CMD"])
    assert "sqlite:/data/mcp-lossless.db" in command and "/data/dev-keys.json" in command


def test_the_images_install_steps_in_a_fresh_venv_give_a_server_that_gets_ready(tmp_path: Path) -> None:
    steps = dockerfile_instructions()
    assert ("RUN", "install-mcp-lossless /opt/mcp-lossless /src") in steps, "the image installs with install.sh"
    assert ("COPY", "deploy/install.sh /usr/local/bin/install-mcp-lossless") in steps
    venv = tmp_path / "venv"
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    installed = subprocess.run(
        ["sh", str(DEPLOY / "install.sh"), str(venv), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=INSTALL_SECONDS,
        env=env,
        check=False,
    )
    assert installed.returncode == 0, installed.stderr[-3000:]
    assert re.search(r"^mcp-lossless \d+\.\d+", installed.stdout, re.M), installed.stdout[-500:]

    data, port = tmp_path / "data", free_port()
    data.mkdir()
    command = json.loads(dict(steps[[op for op, _ in steps].index("FROM", 1) :])["CMD"])
    command = [part.replace("/data/", f"{data}/") for part in command]
    command[command.index("--host") + 1] = "127.0.0.1"  # the image listens on 0.0.0.0: here, loopback
    command[command.index("--port") + 1] = str(port)
    proc = subprocess.Popen([str(venv / "bin" / "mcp-lossless"), *command], cwd=data, env=env, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + READY_SECONDS
        ready: httpx.Response | None = None
        while time.monotonic() < deadline and proc.poll() is None:  # a poll of another process, bounded
            try:
                ready = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5)
                break
            except httpx.TransportError:
                time.sleep(0.2)
        assert ready is not None and ready.status_code == 200, proc.poll()
        assert (data / "mcp-lossless.db").exists() and (data / "dev-keys.json").exists(), "state on the volume"
    finally:
        proc.terminate()
        proc.wait(60)


def test_the_systemd_unit_verifies_and_is_hardened(tmp_path: Path) -> None:
    unit = (DEPLOY / "mcp-lossless.service").read_text()
    assert "ExecStart=/opt/mcp-lossless/bin/mcp-lossless serve" in unit
    # verify checks that ExecStart's binary exists: the one this test runs stands in for /opt/mcp-lossless's.
    binary = shutil.which("mcp-lossless") or str(ROOT / ".venv" / "bin" / "mcp-lossless")
    (tmp_path / "mcp-lossless.service").write_text(unit.replace("/opt/mcp-lossless/bin/mcp-lossless", binary))
    analyze = installed_binary("systemd-analyze", "systemd")  # Debian's package, installed if missing
    verified = subprocess.run(
        [analyze, "verify", "mcp-lossless.service"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (verified.returncode, verified.stdout + verified.stderr) == (0, ""), "no unknown key, no bad value"
    security = subprocess.run(
        [analyze, "security", "--offline=yes", "mcp-lossless.service"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    found = re.search(r"Overall exposure level for mcp-lossless\.service: (\d+\.\d+)", security.stdout)
    assert found is not None, security.stdout[-2000:] + security.stderr
    assert float(found.group(1)) <= 2.0, f"exposure {found.group(1)} (0 is best, 10 an unhardened service)"


def test_the_kubernetes_example_validates_and_runs_replicas_on_redis_with_probes_and_the_keys_secret() -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    yaml = pytest.importorskip("yaml")
    documents: list[dict[str, Any]] = list(
        yaml.safe_load_all((DEPLOY / "kubernetes" / "mcp-lossless.yaml").read_text())
    )
    for document in documents:
        kubernetes_validate.validate(document, "1.37.0", strict=True)
    broken = copy.deepcopy(next(d for d in documents if d["kind"] == "Deployment"))
    broken["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["pathh"] = "/readyz"
    with pytest.raises(kubernetes_validate.ValidationError):  # the validator does reject a mistake
        kubernetes_validate.validate(broken, "1.37.0", strict=True)

    kinds = {(d["kind"], d["metadata"]["name"]): d for d in documents}
    assert {("Service", "mcp-lossless"), ("Service", "redis"), ("Deployment", "redis")} <= set(kinds)
    server = kinds["Deployment", "mcp-lossless"]["spec"]
    assert server["replicas"] >= 2
    pod = server["template"]["spec"]
    container = pod["containers"][0]
    args = container["args"]
    flags = dict(arg.removeprefix("--").split("=", 1) for arg in args if arg.startswith("--"))
    assert flags["store"].startswith("redis://redis:6379"), "every replica on the one Redis"
    assert flags["public-url"].startswith("https://")
    assert flags["dev-client"] == "$(DEV_CLIENT)"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert pod["terminationGracePeriodSeconds"] > float(flags["drain-seconds"]), "the drain ends before SIGKILL"
    keys_dir = Path(flags["dev-keys"]).parent
    mount = next(m for m in container["volumeMounts"] if Path(m["mountPath"]) == keys_dir)
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    assert volume["secret"]["secretName"] == "mcp-lossless-dev-keys", "--dev-keys from a Secret every replica shares"
    assert pod["securityContext"]["runAsNonRoot"] is True
