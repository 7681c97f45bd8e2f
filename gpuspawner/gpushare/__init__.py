"""GPU shares held on the device: the enforcement mechanism of each node
(:mod:`.mechanism`: kernel dmem cgroups, MPS, or the watchdog alone), the per-process watchdog
(:mod:`.watchdog`) and ``make gpu-check`` (:mod:`.check`). See docs/gpu-sharing.md."""
