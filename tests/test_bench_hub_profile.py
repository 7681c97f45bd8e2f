"""benchmarks/hub_profile.py's table of a py-spy raw recording: only the hub's main thread
counts, each cause's share and milliseconds per spawn (10 ms a sample), a stack counted under
every cause it shows (gpuspawner's code and, within it, the pre-spawn hook)."""

from __future__ import annotations

from pathlib import Path

from benchmarks.hub_profile import analyse, main

MAIN = "thread (7): MainThread;run_forever (asyncio/base_events.py:607)"
RAW = "\n".join([
    f"{MAIN};User.spawn (jupyterhub/user.py:924);DefaultDialect.do_commit (x.py:1) 60",
    f"{MAIN};GPUSpawner.run_pre_spawn_hook (gpuspawner/hub/spawner.py:306);"
    "UsageStore.open (gpuspawner/usage/store.py:205) 10",
    f"{MAIN};User._new_spawner (jupyterhub/user.py:617);"
    "GPUSpawner.__init__ (gpuspawner/hub/spawner.py:81) 10",
    f"{MAIN};UserDict.count_active_users (jupyterhub/user.py:99) 20",
    "thread (8): asyncio_0;Cluster._share_pass (gpuspawner/hub/cluster.py:609) 500",
]) + "\n"


def test_the_table_counts_the_main_thread_by_cause(tmp_path: Path, capsys) -> None:
    path = tmp_path / "pyspy_0_10.txt"
    path.write_text(RAW)
    lines = analyse(path, 10)
    assert lines[0] == "  main-thread samples 100 (10.0 a spawn)"  # not the worker's 500
    table = {line[:60].strip(): line[60:].split() for line in lines[1:]}
    assert table["JupyterHub's SQLite commits (do_commit)"] == ["60.0", "%", "60.0", "ms",
                                                                "a", "spawn"]
    assert table["JupyterHub's count of active users"][0] == "20.0"
    assert table["gpuspawner, all its code"][0] == "20.0"
    assert table["of which GPUSpawner() (the spawner's construction)"][0] == "10.0"
    assert table["of which the pre-spawn hook (queue, placement, usage)"][0] == "10.0"
    assert table["of which the usage record (UsageStore.open)"][2] == "10.0"
    assert table["JupyterHub's poll of every server"][0] == "0.0"
    assert main(["--analyse", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{path}: spawns 1-10\n") and "60.0 %" in out
