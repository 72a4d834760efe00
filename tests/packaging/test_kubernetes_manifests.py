"""contrib/kubernetes: the DaemonSet and what it needs, read as Kubernetes and the agent read them.

No cluster here: every YAML document is parsed, its kind and required fields checked, the
DaemonSet's volumes, mounts, capabilities, probes and commands held against the agent's
own configuration loader, CLI parser and systemd unit, so that a renamed option, a moved
socket or a capability added to the unit shows here."""

import re
import shlex
from pathlib import Path

import pytest
import yaml

from numa_agent.cli.numa_agent import build_parser
from numa_agent.core.names import DEFAULT_SOCKET
from numa_agent.daemon.config import ConfigError, config_from_bytes

REPO = Path(__file__).resolve().parents[2]
KUBE = REPO / "contrib" / "kubernetes"
UNIT = REPO / "systemd" / "numa-agent.service"
NAMESPACE = "numa-agent"
NRI_KEYS = {"enabled", "socket", "plugin_name", "plugin_index"}

# kind -> the fields every document of it must have, as dotted paths.
REQUIRED = {
    "Namespace": ["metadata.name"],
    "ServiceAccount": ["metadata.name", "metadata.namespace"],
    "ClusterRole": ["metadata.name", "rules"],
    "ClusterRoleBinding": ["metadata.name", "roleRef.kind", "roleRef.name", "subjects"],
    "ConfigMap": ["metadata.name", "metadata.namespace", "data"],
    "DaemonSet": ["metadata.name", "metadata.namespace", "spec.selector.matchLabels",
                  "spec.template.metadata.labels", "spec.template.spec.containers"],
}
API_VERSIONS = {"Namespace": "v1", "ServiceAccount": "v1", "ConfigMap": "v1", "DaemonSet": "apps/v1",
                "ClusterRole": "rbac.authorization.k8s.io/v1", "ClusterRoleBinding": "rbac.authorization.k8s.io/v1"}


def documents() -> list[dict]:
    docs = []
    for path in sorted(KUBE.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    return docs


def one(kind: str) -> dict:
    found = [d for d in documents() if d["kind"] == kind]
    assert len(found) == 1, f"{len(found)} {kind} documents"
    return found[0]


def dig(doc: dict, dotted: str):
    for key in dotted.split("."):
        doc = doc[key]
    return doc


def pod() -> dict:
    return one("DaemonSet")["spec"]["template"]["spec"]


def container(name: str) -> dict:
    return next(c for c in pod()["containers"] if c["name"] == name)


def host_mounts(c: dict) -> dict[str, dict]:
    """Host path -> the container's mount of it."""
    volumes = {v["name"]: v for v in pod()["volumes"]}
    return {volumes[m["name"]]["hostPath"]["path"]: m for m in c["volumeMounts"] if "hostPath" in volumes[m["name"]]}


def config_text() -> str:
    return one("ConfigMap")["data"]["config.toml"]


def agent_config():
    """The ConfigMap's file through the agent's own loader; without its [nri] section while the
    loader does not know that section yet (the NRI wiring adds it)."""
    import tomllib

    raw = config_text()
    try:
        return config_from_bytes(raw.encode(), Path("config.toml")), True
    except ConfigError as exc:
        if "nri" not in str(exc):
            raise
    doc = tomllib.loads(raw)
    doc.pop("nri")
    from numa_agent.daemon.config import config_from_mapping

    return config_from_mapping(doc), False


def unit_capabilities() -> set[str]:
    caps = set()
    for line in UNIT.read_text().splitlines():
        if line.startswith("CapabilityBoundingSet="):
            caps |= {c.removeprefix("CAP_") for c in line.partition("=")[2].split()}
    return caps


def numa_agent_argv(c: dict) -> list[str]:
    """The numa-agent command line a container runs: its command, or the one in its shell script."""
    command = c["command"]
    if command[0] == "numa-agent":
        return command[1:]
    assert command[:2] == ["/bin/sh", "-c"], command
    words = shlex.split(re.search(r"numa-agent [^)|;\n]*", command[2]).group(0))
    return words[1:]


def test_the_kustomization_lists_every_manifest_and_only_those():
    kustomization = yaml.safe_load((KUBE / "kustomization.yaml").read_text())
    assert kustomization["kind"] == "Kustomization"
    listed = kustomization["resources"]
    assert sorted(listed) == sorted(p.name for p in KUBE.glob("*.yaml") if p.name != "kustomization.yaml")


def test_every_document_has_a_known_kind_and_its_required_fields():
    docs = documents()
    assert sorted(d["kind"] for d in docs) == sorted(REQUIRED)
    for doc in docs:
        assert doc["apiVersion"] == API_VERSIONS[doc["kind"]], doc["kind"]
        for field in REQUIRED[doc["kind"]]:
            assert dig(doc, field), f"{doc['kind']}: {field}"
        if "namespace" in doc["metadata"]:
            assert doc["metadata"]["namespace"] == NAMESPACE, doc["kind"]
    assert one("Namespace")["metadata"]["name"] == NAMESPACE


def test_the_daemonset_selects_its_own_pods_and_runs_as_a_node_agent():
    ds = one("DaemonSet")
    labels = ds["spec"]["template"]["metadata"]["labels"]
    assert ds["spec"]["selector"]["matchLabels"].items() <= labels.items()
    spec = pod()
    assert spec["hostPID"] is True
    assert spec["priorityClassName"] == "system-node-critical"
    assert {"operator": "Exists"} in spec["tolerations"]  # every taint: every node
    assert spec["serviceAccountName"] == one("ServiceAccount")["metadata"]["name"]
    assert not spec.get("hostNetwork")
    for c in spec["containers"]:
        assert c["resources"]["requests"]["cpu"] and c["resources"]["requests"]["memory"], c["name"]


def test_every_mount_names_a_volume_and_every_volume_is_mounted():
    spec = pod()
    volumes = [v["name"] for v in spec["volumes"]]
    assert len(volumes) == len(set(volumes))
    mounted = set()
    for c in spec["containers"]:
        for m in c["volumeMounts"]:
            assert m["name"] in volumes, f"{c['name']} mounts {m['name']}, which is no volume"
            mounted.add(m["name"])
        paths = [m["mountPath"] for m in c["volumeMounts"]]
        assert len(paths) == len(set(paths)), c["name"]
    assert set(volumes) == mounted


def test_the_agent_gets_the_host_paths_it_needs_writable_only_where_it_writes():
    mounts = host_mounts(container("agent"))
    cfg, _ = agent_config()
    writable = {"/sys/fs/cgroup", cfg.state_dir, str(Path(cfg.socket).parent)}
    assert set(mounts) == writable | {"/sys", "/var/run/nri"}
    for path, m in mounts.items():
        assert m["mountPath"] == path, "host paths appear at the host's path"
        assert bool(m.get("readOnly")) == (path not in writable), path


def test_the_agent_holds_the_units_capabilities_and_is_not_privileged():
    security = container("agent")["securityContext"]
    assert security.get("privileged") is not True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    assert set(security["capabilities"]["add"]) == unit_capabilities() == {"CHOWN", "SYS_NICE"}


def test_the_configmap_is_what_the_agent_reads_at_the_path_it_is_told():
    cfg_mount = next(m for m in container("agent")["volumeMounts"] if m["name"] == "config")
    volume = next(v for v in pod()["volumes"] if v["name"] == "config")
    assert volume["configMap"]["name"] == one("ConfigMap")["metadata"]["name"]
    argv = numa_agent_argv(container("agent"))
    config_path = Path(argv[argv.index("--config") + 1])
    assert config_path == Path(cfg_mount["mountPath"]) / "config.toml"
    assert "config.toml" in one("ConfigMap")["data"]


def test_the_configmap_loads_with_the_agents_own_loader():
    cfg, _ = agent_config()
    assert cfg.socket == DEFAULT_SOCKET  # where numa-agent's commands look on the node
    assert cfg.metrics_address.endswith(":9464")


def test_the_configmap_turns_nri_on_at_the_mounted_socket():
    import tomllib

    nri = tomllib.loads(config_text())["nri"]
    assert set(nri) == NRI_KEYS
    assert nri["enabled"] is True
    assert re.fullmatch(r"\d\d", nri["plugin_index"])
    assert str(Path(nri["socket"]).parent) in host_mounts(container("agent"))


def test_the_agents_loader_takes_the_nri_section():
    cfg, with_nri = agent_config()
    if not with_nri:
        pytest.skip("the config loader does not know [nri] yet (added by the NRI wiring); "
                    "the rest of the ConfigMap's file loads")
    assert vars(cfg)["nri_enabled"] is True
    assert str(Path(vars(cfg)["nri_socket"]).parent) in host_mounts(container("agent"))


def test_each_container_runs_an_existing_subcommand():
    parser = build_parser()
    agent = parser.parse_args(numa_agent_argv(container("agent")))
    assert agent.command == "serve"
    publisher = container("nrt-publisher")
    args = parser.parse_args(numa_agent_argv(publisher))
    assert (args.command, args.kind, args.node_name) == ("export", "nrt", "$NODE_NAME")
    # From the running agent, on the socket the agent serves (not built from a machine alone).
    assert args.sysfs_root is None and args.config is None
    assert (args.socket or DEFAULT_SOCKET) == agent_config()[0].socket
    env = {e["name"]: e for e in publisher["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert "kubectl apply" in publisher["command"][2]


def test_the_publisher_reaches_the_agents_socket_and_alone_holds_the_token():
    cfg, _ = agent_config()
    socket_dir = str(Path(cfg.socket).parent)
    assert socket_dir in host_mounts(container("nrt-publisher"))
    assert pod()["automountServiceAccountToken"] is False
    token = "/var/run/secrets/kubernetes.io/serviceaccount"
    holders = [c["name"] for c in pod()["containers"] if any(m["mountPath"] == token for m in c["volumeMounts"])]
    assert holders == ["nrt-publisher"]


def test_the_publisher_may_write_noderesourcetopologies_and_nothing_else():
    role = one("ClusterRole")
    assert role["rules"] == [{"apiGroups": ["topology.node.k8s.io"], "resources": ["noderesourcetopologies"],
                              "verbs": ["get", "create", "patch", "update"]}]
    binding = one("ClusterRoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": one("ServiceAccount")["metadata"]["name"],
                                    "namespace": NAMESPACE}]


def test_probes_and_scrape_annotations_use_the_metrics_port_the_agent_listens_on():
    cfg, _ = agent_config()
    port = int(cfg.metrics_address.rpartition(":")[2])
    agent = container("agent")
    ports = {p["name"]: p["containerPort"] for p in agent["ports"]}
    assert ports == {"metrics": port}
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert agent[probe]["httpGet"] == {"path": "/metrics", "port": "metrics"}, probe
    annotations = one("DaemonSet")["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == str(port)


def test_both_containers_run_the_image_the_containerfile_builds():
    images = {c["image"] for c in pod()["containers"]}
    assert len(images) == 1
    containerfile = (KUBE / "Containerfile").read_text()
    assert re.search(r"^FROM \S*debian:\$\{DEBIAN\}-slim$", containerfile, re.M)
    assert "numa_agent-*-py3-none-any.whl" in containerfile
    assert re.search(r"^CMD \[\"numa-agent\", \"serve\"", containerfile, re.M)
