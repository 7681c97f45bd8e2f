"""What a node has: this host read through sysfs and NVML (``local``), topology YAML files
(``topology``). Produces :class:`gpuspawner.placement.Node`; does I/O, unlike ``placement``."""
