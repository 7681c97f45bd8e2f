"""The hub side: the spawner, profiles and the spawn form, the cluster (nodes, engines, the
ledger), the user_options guard, the start-up configuration check, LDAP login, Prometheus
metrics and the ``gpuspawner`` hub service (``service/``). Runs in the JupyterHub process."""
