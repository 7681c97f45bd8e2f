"""How servers run on nodes: engine-specific code (today the Docker engine: per-server
networks in ``docker_network``). The spawner reaches an engine only through this package."""
