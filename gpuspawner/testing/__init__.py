"""What the tests (``tests/``) and the benchmarks (``benchmarks/``) share: a real JupyterHub on
loopback ports (:mod:`.hubrunner`, :mod:`.culler_hub`, :mod:`.slurm_hub`), the in-process hub
(:mod:`.inprocess`) and a fake engine (:mod:`.fake_backend`), test doubles of NVML
(:mod:`.nvml_double`, :mod:`.nvml_metrics`) and of a hub user (:mod:`.fakes`), and
:func:`.waiting.wait_until` (a condition with a deadline, never a bare sleep).

For a source checkout: the hub runners read ``hub_config/`` and ``node_modules/`` of the
repository, and need the ``test`` extra (requests, jupyterhub). Nothing in gpuspawner or
idle_culler imports this package (contract "nothing in the project imports its test harness").
The modules of the same names under ``tests/`` are these modules under their old names.
"""
