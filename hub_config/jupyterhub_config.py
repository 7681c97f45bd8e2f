"""JupyterHub configuration for gpuspawner: works as is on one machine (``make up``).

- the local Docker engine, the local inventory (sysfs + NVML; no GPU = zero GPUs),
- SQLite and the cookie secret under ``var/hub/``,
- a CPU profile and GPU profiles (hidden where there is no GPU: the form offers only
  what can start, c.GPUSpawner.show_unavailable_profiles shows the rest with the reason),
- a **demo** authenticator: any user name, the password ``gpuspawner``. Replace it before
  anyone else can reach the hub (see the LDAP example at the end).

Each user server runs in a network namespace of its own (a bridge network per server,
docs/security.md); the hub API listens on the hub network's gateway, where containers reach
it; the proxy, its API and the services listen on 127.0.0.1 only.

Environment overrides (used by the tests): GPUSPAWNER_HUB_PORT, GPUSPAWNER_STATE_DIR,
GPUSPAWNER_NODES_FILE (a YAML list of nodes), GPUSPAWNER_PROFILES_FILE,
GPUSPAWNER_INTERNAL_SSL=1 (mutual TLS between hub, proxy and servers).
"""

import os
from pathlib import Path

import yaml

c = get_config()  # noqa: F821  (provided by JupyterHub when it loads this file)

REPO = Path(__file__).resolve().parent.parent
STATE = Path(os.environ.get("GPUSPAWNER_STATE_DIR", REPO / "var" / "hub"))
# 0700; an existing looser one is tightened by the check at the end (GPUSpawner.state_dir)
STATE.mkdir(mode=0o700, parents=True, exist_ok=True)

# -- the hub and its proxy ------------------------------------------------------------------
# The hub network (198.18.0.0/28) is made on the local engine when missing; its gateway
# address belongs to this host, so every server network reaches the hub API there, while no
# container can bind it. Nothing else of the hub listens where containers can reach it.
from gpuspawner.backends.docker_network import ensure_hub_network  # noqa: E402

HUB_IP = ensure_hub_network(name="gpuspawner-hub", subnet="198.18.0.0/28")
INTERNAL_SSL = os.environ.get("GPUSPAWNER_INTERNAL_SSL", "0") == "1"
c.JupyterHub.bind_url = f"http://127.0.0.1:{os.environ.get('GPUSPAWNER_HUB_PORT', '8000')}"
c.JupyterHub.hub_ip = HUB_IP
c.JupyterHub.hub_connect_ip = HUB_IP
c.JupyterHub.hub_port = int(os.environ.get("GPUSPAWNER_HUB_API_PORT", "8081"))
c.ConfigurableHTTPProxy.api_url = (
    f"{'https' if INTERNAL_SSL else 'http'}://127.0.0.1:"
    f"{os.environ.get('GPUSPAWNER_PROXY_API_PORT', '8001')}")
if INTERNAL_SSL:
    # hub <-> proxy <-> servers over mutual TLS; each server's certificate names its IP
    c.JupyterHub.internal_ssl = True
    c.JupyterHub.internal_certs_location = str(STATE / "internal-ssl")
    c.JupyterHub.trusted_alt_names = [f"IP:{HUB_IP}"]
# configurable-http-proxy whose route to a server accepts only that server's own certificate
# (internal_ssl; docs/slurm-backend.md "How the hub learns the port")
c.JupyterHub.proxy_class = "gpuspawner"
chp = REPO / "node_modules" / ".bin" / "configurable-http-proxy"
if chp.exists():
    c.ConfigurableHTTPProxy.command = [str(chp)]
c.JupyterHub.db_url = f"sqlite:///{STATE / 'jupyterhub.sqlite'}"
# gpuspawner's state (queue, drains) stays here wherever db_url goes; 0700, files 0600
c.GPUSpawner.state_dir = str(STATE)
c.JupyterHub.cookie_secret_file = str(STATE / "jupyterhub_cookie_secret")
c.JupyterHub.pid_file = str(STATE / "jupyterhub.pid")
c.ConfigurableHTTPProxy.pid_file = str(STATE / "proxy.pid")
# servers keep running when the hub restarts; GPUSpawner rebuilds its ledger from them
c.JupyterHub.cleanup_servers = False
c.JupyterHub.allow_named_servers = True
c.JupyterHub.named_server_limit_per_user = 5

# -- the spawner ----------------------------------------------------------------------------
c.JupyterHub.spawner_class = "gpu"  # gpuspawner.GPUSpawner
c.GPUSpawner.image = "gpuspawner/singleuser:latest"
c.GPUSpawner.start_timeout = 120
c.GPUSpawner.http_timeout = 60
# the default policy, named so an admin sees it (docs/placement.md "The default policy");
# "fgd" is the FGD paper's rule
c.GPUSpawner.placement_policy = "fgd-mem-lookahead"
# one bridge network per server from this pool (docs/security.md); "host" only for one
# trusted user
c.DockerBackend.network_isolation = "per-server"
c.DockerBackend.server_network_pool = "198.18.0.0/16"
c.GPUSpawner.user_options_max_bytes = 4096

nodes_file = os.environ.get("GPUSPAWNER_NODES_FILE")
if nodes_file:
    c.GPUSpawner.nodes = yaml.safe_load(Path(nodes_file).read_text())
else:
    # one node: this machine, read with sysfs and NVML
    c.GPUSpawner.nodes = [{"name": "local", "docker_url": "", "topology": "auto"}]

profiles_file = os.environ.get("GPUSPAWNER_PROFILES_FILE")
if profiles_file:
    c.GPUSpawner.profiles = profiles_file
else:
    c.GPUSpawner.profiles = [
        {"slug": "cpu", "display_name": "CPU, small", "cpu": 1, "memory": "1G",
         "description": "For editing and small computations.", "default": True},
        {"slug": "cpu-2", "display_name": "CPU, medium", "cpu": 2, "memory": "2G"},
        # the GPU profiles run the PyTorch image (images/pytorch; `make up` builds it)
        {"slug": "gpu-share", "display_name": "Shared GPU", "cpu": 1,
         "memory": "4G", "gpus": 0.25, "image": "gpuspawner/pytorch:latest"},
        {"slug": "a100-1", "display_name": "One A100",
         "cpu": 8, "memory": "64G", "gpus": 1, "gpu_models": ["A100"], "disk": "50G",
         "image": "gpuspawner/pytorch:latest"},
        {"slug": "a100-2", "display_name": "Two A100 with NVLink",
         "cpu": 16, "memory": "128G", "gpus": 2, "gpu_models": ["A100"],
         "groups": ["gpu-users"], "image": "gpuspawner/pytorch:latest"},
    ]

# the shared home: a host folder per user, mounted as the container's HOME. Its parent must
# exist on every node that runs servers (the shared file system): a spawn on a node without
# it fails, naming the node and the folder. On this one machine the hub makes it.
(STATE.parent / "home").mkdir(mode=0o755, parents=True, exist_ok=True)
c.GPUSpawner.home_path_template = str(STATE.parent / "home" / "{username}")
c.GPUSpawner.home_mount_point = "/home/{username}"
c.GPUSpawner.default_uid = 1000
c.GPUSpawner.default_gid = 100
c.DockerBackend.disk_limit_mode = "account"
c.GPUSpawner.quotas = {"default_user": {"gpus": 2, "servers": 3}}

# -- a Slurm cluster instead of this machine's Docker engine (docs/slurm-backend.md) --------
# Each node's topology file is `gpuspawner inventory` run on that node; gres.conf comes from
# `gpuspawner slurm-gres`. Jobs share their node's network, so internal_ssl is required.
# c.GPUSpawner.backend = "slurm"
# c.GPUSpawner.nodes = [{"name": "gpu01", "topology": "/etc/gpuspawner/gpu01.yaml",
#                        "host": "gpu01.cluster.example.org"}]
# c.SlurmBackend.slurm_conf = "/etc/slurm/slurm.conf"
# c.SlurmBackend.listen_address = "0.0.0.0"
# c.JupyterHub.internal_ssl = True

# -- DEMO AUTHENTICATOR: any name, password "gpuspawner". NOT FOR PRODUCTION. --------------
c.JupyterHub.authenticator_class = "dummy"
c.DummyAuthenticator.password = os.environ.get("GPUSPAWNER_DEMO_PASSWORD", "gpuspawner")
c.Authenticator.allow_all = True
# The demo admin "admin" (a hub admin, exempt from culling) exists only while the hub runs
# this demo authenticator, decided at start on the final configuration: after
# hub_config/ldap.py or a site's own authenticator, the admins are those its own settings
# name (c.Authenticator.admin_users; none otherwise). The hub's log says who is admin.
from gpuspawner.hub.demo import demo_defaults  # noqa: E402

demo_defaults(c)

# -- scripts and tests: an API token with admin rights over users, groups and servers ------
api_token = os.environ.get("GPUSPAWNER_API_TOKEN")
if api_token:
    c.JupyterHub.services = [{"name": "gpuspawner-admin", "api_token": api_token}]
    c.JupyterHub.load_roles = [{
        "name": "gpuspawner-admin",
        "scopes": ["admin:users", "admin:groups", "admin:servers", "list:users",
                   "read:users", "access:servers"],
        "services": ["gpuspawner-admin"],
    }]

# -- production examples (uncomment and adapt) ----------------------------------------------
# Several nodes, each with its own engine and a topology file written by
# `gpuspawner inventory > node-2.yaml` on that node; engines of other nodes over mutual TLS
# (dockerd --tlsverify; docs/howto/add-gpu-node.md):
# c.GPUSpawner.nodes = [
#     {"name": "node-1", "docker_url": "unix:///var/run/docker.sock", "topology": "auto"},
#     {"name": "node-2", "docker_url": "tcp://node-2:2376",
#      "topology": "/etc/gpuspawner/node-2.yaml", "host": "node-2"},
# ]
# c.DockerBackend.tls_cert_path = "/etc/gpuspawner/docker-tls"   # ca.pem, cert.pem, key.pem
# Mutual TLS between hub, proxy and servers (a server never trusts a hub it has not
# verified): GPUSPAWNER_INTERNAL_SSL=1 above, or
# c.JupyterHub.internal_ssl = True
#
# Quotas per group and per user:
# c.GPUSpawner.quotas = {
#     "groups": {"students": {"gpus": 4, "servers": 20}},
#     "users": {"alice": {"gpus": 4}},
#     "default_user": {"gpus": 1, "cores": 16, "memory": "128G"},
# }
#
# GPU health (docs/gpu-health.md): this host's GPUs are read through NVML every 60 s and an
# unhealthy one is drained; drains (also `gpuspawner drain-gpu`) are kept in a JSON file,
# by default gpuspawner-drains.json in the state folder (c.GPUSpawner.state_dir):
# c.GPUSpawner.gpu_health_interval = 60
# c.GPUSpawner.gpu_drains_file = "/var/lib/jupyterhub/gpuspawner-drains.json"
# c.GPUSpawner.gpu_health_xids = [48, 63, 64, 74, 79, 92, 94, 95]
#
# LDAP: one recipe, hub_config/ldap.py (GPULDAPAuthenticator, entry point "gpu-ldap": LDAP
# groups become hub groups, uidNumber/gidNumber in auth_state own the home; docs/howto/ldap.md).
# Load it after this file, from the site's own configuration:
# load_subconfig("/path/to/gpuspawner/hub_config/ldap.py")   # needs JUPYTERHUB_CRYPT_KEY
# c.GPUSpawner.home_path_template = "/shared/home/{username}"

# -- gpuspawner service, idle culler, notebook jobs: one call (gpuspawner/hub/wiring.py) ------
# The gpuspawner service /services/gpuspawner/: REST API (api/nodes, api/allocations,
# api/users/{name}/usage, api/jobs, api/openapi.json), the admin GPU map (admin) and Prometheus
# metrics (metrics), inside this hub process on a loopback port, reading the spawners' own
# ledger (docs/service.md). The idle culler /services/idle-culler/: culls idle servers by
# activity, GPU utilisation, network and age under the policies in
# hub_config/culler_policies.yaml (idle_culler/README.md). Notebook jobs from JupyterLab: the
# servers send them to the service with their own token, on the hub network's gateway (plain
# HTTP: off with internal_ssl; docs/jobs.md). The scopes, roles and servers' environment that
# let each reach the other come with it.
# Several nodes: listen_ip stays an address of this machine that servers reach, and
# connect_ip is what they are told: the hub machine's address on the nodes' network (the hub
# network's gateway exists only here). On GPU nodes: nvml=True when this machine is the GPU
# node, or dcgm_urls=["http://node-1:9400/metrics", ...] (dcgm-exporter on each node).
from gpuspawner.hub.wiring import wire_hub  # noqa: E402

WIRING = wire_hub(
    c, listen_ip=HUB_IP, state_dir=STATE, internal_ssl=INTERNAL_SSL,
    service_port=int(os.environ.get("GPUSPAWNER_SERVICE_PORT", "0")),
    servers_service_port=int(os.environ.get("GPUSPAWNER_SERVICE_SERVERS_PORT", "0")),
    culler=os.environ.get("GPUSPAWNER_CULLER", "on") != "off",  # off: no culler
    culler_policies=os.environ.get("GPUSPAWNER_CULLER_POLICIES",
                                   str(REPO / "hub_config" / "culler_policies.yaml")),
    culler_port=int(os.environ.get("GPUSPAWNER_CULLER_PORT", "0")),
    culler_every=int(os.environ.get("GPUSPAWNER_CULLER_EVERY", "60")),
)

# -- checked now, not at the first spawn -----------------------------------------------------
# Every GPUSpawner setting (profiles, nodes with their inventories, quotas, policy, network
# pool) and the culler's policy file: a wrong one stops the hub here with the trait, the entry
# and the reason. Keep this the last line of a configuration that changes those settings.
from gpuspawner.hub.config_check import check_hub_config  # noqa: E402

check_hub_config(c)
