"""compose.yaml, its GPU override, the LiveKit/SIP configs and the Dockerfile agree with each other (no Docker
engine runs here: this is what can be checked without one)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from urllib.parse import urlparse

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = yaml.safe_load((ROOT / "compose.yaml").read_text())
GPU = yaml.safe_load((ROOT / "compose.gpu.yaml").read_text())
LIVEKIT = yaml.safe_load((ROOT / "deploy" / "livekit.yaml").read_text())
SIP = yaml.safe_load((ROOT / "deploy" / "sip.yaml").read_text())
SERVICES = COMPOSE["services"]


def resolve(value) -> str:
    """A compose value with ``${VAR:-default}`` interpolated as if VAR were unset."""
    return re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", str(value))


def env(service: str) -> dict[str, str]:
    e = SERVICES[service].get("environment") or {}
    if isinstance(e, list):
        e = dict(x.split("=", 1) for x in e)
    return {k: resolve(v) for k, v in e.items()}


def published(service: str, proto: str = "tcp") -> set[str]:
    """Container ports (or ``lo-hi`` ranges) published for ``proto``."""
    out = set()
    for p in SERVICES[service].get("ports") or []:
        spec, _, kind = str(p).partition("/")
        if (kind or "tcp") == proto:
            out.add(spec.split(":")[-1])
    return out


def test_the_stack_has_its_services():
    assert set(SERVICES) == {"livekit", "redis", "sip", "omniduplex", "agent"}


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_every_service_has_an_image_or_build_and_a_health_check(name):
    svc = SERVICES[name]
    assert svc.get("image") or svc.get("build")
    test = (svc.get("healthcheck") or {}).get("test")
    assert test and test[0] in ("CMD", "CMD-SHELL") and len(test) > 1
    for dep, cond in (svc.get("depends_on") or {}).items():
        assert dep in SERVICES and cond["condition"] == "service_healthy"
        assert SERVICES[dep].get("healthcheck"), f"{name} waits for {dep}'s health but it has no check"


def test_livekit_ports_match_its_config():
    assert {str(LIVEKIT["port"]), str(LIVEKIT["rtc"]["tcp_port"])} <= published("livekit")
    rtc = LIVEKIT["rtc"]
    assert f"{rtc['port_range_start']}-{rtc['port_range_end']}" in published("livekit", "udp")
    assert "/etc/livekit.yaml" in " ".join(SERVICES["livekit"]["command"])
    assert any(v.startswith("./deploy/livekit.yaml:") for v in SERVICES["livekit"]["volumes"])
    assert LIVEKIT["redis"]["address"] == "redis:6379"


def test_sip_config_ports_and_keys():
    assert "5060" in published("sip", "udp") and str(SIP["rtp_port"]) in published("sip", "udp")
    assert env("sip")["SIP_CONFIG_FILE"] == "/sip/config.yaml"
    assert any(v.startswith("./deploy/sip.yaml:/sip/config.yaml") for v in SERVICES["sip"]["volumes"])
    assert LIVEKIT["keys"][SIP["api_key"]] == SIP["api_secret"]
    assert urlparse(SIP["ws_url"]).hostname == "livekit" and urlparse(SIP["ws_url"]).port == LIVEKIT["port"]
    assert SIP["redis"]["address"] == LIVEKIT["redis"]["address"]
    assert f"127.0.0.1/{SIP['health_port']}" in " ".join(SERVICES["sip"]["healthcheck"]["test"])


def test_agent_livekit_credentials_are_a_key_pair_of_the_server():
    e = env("agent")
    url = urlparse(e["LIVEKIT_URL"])
    assert url.scheme == "ws" and url.hostname == "livekit" and url.port == LIVEKIT["port"]
    assert LIVEKIT["keys"][e["LIVEKIT_API_KEY"]] == e["LIVEKIT_API_SECRET"]
    assert len(e["LIVEKIT_API_SECRET"]) >= 32  # livekit-server refuses shorter secrets


def test_agent_reaches_the_model_server_with_one_of_its_keys():
    e = env("agent")
    url = urlparse(e["OMNIDUPLEX_REALTIME_URL"])
    serve = [str(x) for x in SERVICES["omniduplex"]["command"]]
    assert serve[:2] == ["omniduplex", "serve"] and serve[serve.index("--host") + 1] == "0.0.0.0"
    assert url.hostname == "omniduplex" and url.path == "/v1/realtime"
    assert str(url.port) == serve[serve.index("--port") + 1]
    assert e["OMNIDUPLEX_API_KEY"] in env("omniduplex")["OMNIDUPLEX_API_KEYS"].split(",")
    assert SERVICES["agent"]["command"] == ["omniduplex", "agent", "start"]
    assert int(SERVICES["agent"]["deploy"]["replicas"]) >= 1


def test_sip_calls_are_dispatched_to_the_agent():
    rule = json.loads((ROOT / "deploy" / "sip-dispatch-rule.json").read_text())["dispatch_rule"]
    assert "dispatchRuleIndividual" in rule["rule"]
    assert [a["agentName"] for a in rule["roomConfig"]["agents"]] == [env("agent")["LIVEKIT_AGENT_NAME"]]
    trunk = json.loads((ROOT / "deploy" / "sip-inbound-trunk.json").read_text())["trunk"]
    assert trunk["auth_username"] and trunk["auth_password"]


def test_gpu_override_reserves_a_gpu_for_the_model_server_only():
    (svc,) = GPU["services"]
    assert svc == "omniduplex"
    o = GPU["services"]["omniduplex"]
    (dev,) = o["deploy"]["resources"]["reservations"]["devices"]
    assert dev["driver"] == "nvidia" and "gpu" in dev["capabilities"]
    assert "cu" in o["build"]["args"]["TORCH_INDEX"]
    graph = o["command"][o["command"].index("--graph") + 1]
    from omniduplex.pipeline.config import load_graph

    cfg = load_graph(ROOT / graph)
    assert cfg.stage("llm").device == "cuda" and cfg.stage("asr").device == "cpu"


def test_dockerfile_is_cpu_by_default_and_installs_with_the_script():
    text = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^ARG TORCH_INDEX=https://download\.pytorch\.org/whl/cpu$", text, re.M)
    assert "bash scripts/install.sh livekit" in text
    build = SERVICES["omniduplex"]["build"]
    assert build["context"] == "." and build["args"]["TORCH_INDEX"].endswith("/cpu")
