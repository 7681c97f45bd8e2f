"""Idle culler, without a hub: policies and their precedence, ``explain``, the GPU sources
(dcgm-exporter text on loopback, NVML through the nvidia-ml-py test double), network rates,
the decision rules, and the hub client's retries."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pynvml
import pytest
import yaml
from tornado import web

from idle_culler.core import Culler, iso
from idle_culler.gpu import GPUHistory, NVMLSampler, PrometheusSource, parse_dcgm
from idle_culler.hub import HubAPIError, HubClient
from idle_culler.netstats import NetworkMeter
from idle_culler.policies import PolicyError, PolicySet, normalize_entry, parse_duration
from tests.culler_hub import free_port
from tests.nvml_double import FakeGPU, FakeNVML, NVMLError, _Handle, _Struct

REPO = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------ policies
def test_durations() -> None:
    assert parse_duration("10m") == 600
    assert parse_duration("2h") == 7200
    assert parse_duration(90) == 90
    assert parse_duration("1.5s") == 1.5
    for bad in ("ten", -1, True, "5y", None):
        with pytest.raises(PolicyError):
            parse_duration(bad, "x")


def test_bad_entries_name_the_field() -> None:
    """The culler-policies schema (gpuspawner/schemas/) refuses them, named by field."""
    with pytest.raises(PolicyError, match=r"^users.bob.idle_timeut: unknown field; known: "):
        PolicySet({"users": {"bob": {"idle_timeut": 5}}})
    with pytest.raises(PolicyError, match=r"^global.gpu_idle_threshold: 150 is greater than the "
                                          r"maximum of 100"):
        PolicySet({"global": {"gpu_idle_threshold": 150}})
    with pytest.raises(PolicyError, match=r"^groups.g.exempt: 'yes' is not of type 'boolean'"):
        PolicySet({"groups": {"g": {"exempt": "yes"}}})
    with pytest.raises(PolicyError, match=r"^user: unknown field; known: global, groups, users"):
        PolicySet({"user": {}})
    with pytest.raises(PolicyError, match=r"^policy document: \['global'\] is not of type "):
        PolicySet().replace(["global"])  # type: ignore[arg-type]
    with pytest.raises(PolicyError, match=r"^users.ann.max_age: '2 days' is not a duration"):
        normalize_entry({"max_age": "2 days"}, "users.ann")
    with pytest.raises(PolicyError, match=r"^global.network_floor: -1 is less than the minimum"):
        normalize_entry({"network_floor": -1}, "global")
    assert normalize_entry({"max_age": "2h", "network_floor": 5, "exempt": True}, "g") == {
        "max_age": 7200.0, "network_floor": 5.0, "exempt": True}
    assert normalize_entry(None, "g") == {}


POLICY = {
    "global": {"idle_timeout": "1h", "gpu_idle_threshold": 5, "gpu_window": "10m",
               "warning": "5m", "max_age": "24h"},
    "groups": {
        "long-jobs": {"idle_timeout": "8h", "max_age": 0, "network_floor": 100},
        "students": {"idle_timeout": "30m", "max_age": "12h", "gpu_idle_threshold": 10,
                     "network_floor": 5000},
        "vip": {"exempt": True},
    },
    "users": {"alice": {"idle_timeout": "20m"}},
}


def test_precedence_user_then_most_lenient_group_then_global() -> None:
    ps = PolicySet(POLICY, base={"idle_timeout": 60, "max_age": 99})
    # no entries: global, then cli, then default
    p = ps.resolve("zoe", ["nobody-group"])
    assert (p.idle_timeout, p.sources["idle_timeout"]) == (3600, "global")
    assert p.sources["grace_period"] == "default"
    # most lenient of the groups, field by field
    p = ps.resolve("bob", ["students", "long-jobs"])
    assert (p.idle_timeout, p.sources["idle_timeout"]) == (8 * 3600, "group:long-jobs")
    assert (p.max_age, p.sources["max_age"]) == (0, "group:long-jobs")  # 0 = off = lenient
    assert (p.gpu_idle_threshold, p.sources["gpu_idle_threshold"]) == (10, "group:students")
    assert (p.network_floor, p.sources["network_floor"]) == (100, "group:long-jobs")
    assert (p.warning, p.sources["warning"]) == (300, "global")
    # the user's entry beats the groups even when stricter
    p = ps.resolve("alice", ["long-jobs"])
    assert (p.idle_timeout, p.sources["idle_timeout"]) == (1200, "user:alice")
    assert p.sources["max_age"] == "group:long-jobs"
    # exemption from any group
    assert ps.resolve("eve", ["students", "vip"]).exempt is True
    # the command line sits between global and the defaults
    p = PolicySet({}, base={"idle_timeout": 60}).resolve("x")
    assert (p.idle_timeout, p.sources["idle_timeout"]) == (60, "cli")


SHIPPED = "# shipped policies: comments must survive\n" + yaml.safe_dump(POLICY)


def test_changes_go_to_the_overrides_file_never_the_shipped_one(tmp_path: Path) -> None:
    """Admins' changes are kept in the overrides file (mode 0600, only what differs),
    merged over the shipped file at start and after each change; the shipped file's bytes
    never change."""
    shipped = tmp_path / "shipped.yaml"
    shipped.write_text(SHIPPED)
    before = shipped.read_bytes()
    ov = tmp_path / "state" / "culler_policy_overrides.yaml"
    ps = PolicySet.load(shipped, overrides=ov)
    assert ps.overrides() == {} and not ov.exists()  # nothing written until a change
    ps.put_entry("users", "bob", {"exempt": True})
    ps.delete_entry("users", "alice")  # a shipped entry: recorded as removed
    ps.put_entry("groups", "students", {"idle_timeout": "2h"})
    ps.put_entry("global", None, {"idle_timeout": "30m"})
    assert shipped.read_bytes() == before
    assert ov.stat().st_mode & 0o777 == 0o600
    assert yaml.safe_load(ov.read_text()) == {
        "global": {"idle_timeout": 1800.0},
        "groups": {"students": {"idle_timeout": 7200.0}},
        "users": {"bob": {"exempt": True}},
        "removed": {"users": ["alice"]}}
    # a fresh load (a restarted culler) applies them
    again = PolicySet.load(shipped, overrides=ov)
    assert again.to_dict() == ps.to_dict()
    assert again.resolve("bob").exempt and again.resolve("alice").sources["idle_timeout"] == \
        "global"
    assert again.resolve("x", ["students"]).idle_timeout == 7200
    assert again.resolve("x", ["long-jobs"]).idle_timeout == 8 * 3600  # shipped, untouched
    # rejected changes change nothing, in memory or on disk
    on_disk = ov.read_bytes()
    with pytest.raises(PolicyError, match=r"^users.bob.idle_timeout: 'soon' is not a dur"):
        ps.put_entry("users", "bob", {"idle_timeout": "soon"})
    with pytest.raises(PolicyError):
        ps.put_document({"global": {"warning": "soon"}})
    with pytest.raises(KeyError):
        ps.delete_entry("users", "nobody")
    assert ov.read_bytes() == on_disk and ps.to_dict() == again.to_dict()
    # a whole document: the overrides hold what differs from the shipped file
    ps.put_document({**POLICY, "users": {"carol": {"max_age": 60}}})
    assert yaml.safe_load(ov.read_text()) == {"users": {"carol": {"max_age": 60.0}},
                                             "removed": {"users": ["alice"]}}
    assert PolicySet.load(shipped, overrides=ov).to_dict() == ps.to_dict()
    # an edit of the shipped file is merged too (entries no admin changed), after a change
    edited = {**POLICY, "groups": {**POLICY["groups"], "vip": {"exempt": False}}}
    shipped.write_text(yaml.safe_dump(edited))
    ps.put_entry("users", "dan", {"exempt": True})
    assert ps.resolve("x", ["vip"]).exempt is False and ps.resolve("carol").max_age == 60
    assert PolicySet.load(shipped, overrides=ov).to_dict() == ps.to_dict()
    # an in-memory set without files keeps its document across changes
    mem = PolicySet({"global": {"exempt": True}})
    mem.put_entry("users", "u", {"idle_timeout": 5})
    mem.save()  # no overrides path: nothing to write
    assert mem.to_dict()["global"] == {"exempt": True}


def test_bad_overrides_file_names_itself(tmp_path: Path) -> None:
    shipped = tmp_path / "p.yaml"
    shipped.write_text(SHIPPED)
    ov = tmp_path / "o.yaml"
    ov.write_text(yaml.safe_dump({"users": {"bob": {"idle_timeut": 5}}}))
    with pytest.raises(PolicyError, match=r"o.yaml: users.bob.idle_timeut: unknown field"):
        PolicySet.load(shipped, overrides=ov)
    ov.write_text(yaml.safe_dump({"removed": {"users": "bob"}}))
    with pytest.raises(PolicyError, match=r"o.yaml.removed: expected"):
        PolicySet.load(shipped, overrides=ov)


async def test_app_overrides_file_default_and_restart(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """``--overrides`` (default: culler_policy_overrides.yaml beside ``--cull-log``, else in the
    working directory); a culler built again from the same configuration applies them."""
    from idle_culler.app import IdleCuller

    monkeypatch.chdir(tmp_path)
    shipped = tmp_path / "p.yaml"
    shipped.write_text(SHIPPED)
    app = IdleCuller()
    app.initialize(["--policies", str(shipped)])
    assert app.overrides_path() == str(tmp_path / "culler_policy_overrides.yaml")
    beside_log = IdleCuller()  # the service's state folder: where its cull log goes
    beside_log.initialize(["--policies", str(shipped), "--cull-log", "var/hub/culls.jsonl"])
    assert beside_log.overrides_path() == str(tmp_path / "var/hub/culler_policy_overrides.yaml")
    ov = tmp_path / "state" / "ov.yaml"
    first = IdleCuller()
    first.initialize(["--policies", str(shipped), "--overrides", str(ov)])
    first.build().policies.put_entry("users", "bob", {"idle_timeout": 42})
    restarted = IdleCuller()
    restarted.initialize(["--policies", str(shipped), "--overrides", str(ov)])
    p = restarted.build().policies.resolve("bob")
    assert (p.idle_timeout, p.sources["idle_timeout"]) == (42, "user:bob")
    assert shipped.read_text() == SHIPPED


def test_explain_cli(tmp_path: Path) -> None:
    f = tmp_path / "p.yaml"
    f.write_text(yaml.safe_dump(POLICY))
    out = subprocess.run(
        [sys.executable, "-m", "idle_culler", "explain", "--policies", str(f), "--user",
         "alice", "--groups", "students,long-jobs"], capture_output=True, text=True,
        cwd=REPO, timeout=60, check=True).stdout
    doc = json.loads(out)
    assert doc["policy"]["idle_timeout"] == {"value": 1200.0, "source": "user:alice"}
    assert doc["policy"]["max_age"] == {"value": 0.0, "source": "group:long-jobs"}
    assert doc["policy"]["gpu_window"] == {"value": 600.0, "source": "global"}
    bad = tmp_path / "bad.yaml"
    bad.write_text("global: {idle_timeout: soon}\n")
    r = subprocess.run([sys.executable, "-m", "idle_culler", "explain", "--policies",
                        str(bad), "--user", "a"], capture_output=True, text=True, cwd=REPO,
                       timeout=60)
    assert r.returncode == 2 and "global.idle_timeout" in r.stderr


def test_shipped_policies_file_is_valid() -> None:
    ps = PolicySet.load(REPO / "hub_config" / "culler_policies.yaml")
    assert ps.resolve("someone").idle_timeout > 0


# ------------------------------------------------------------------ GPU sources
DCGM_TEXT = """\
# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).
# TYPE DCGM_FI_DEV_GPU_UTIL gauge
DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-aaaa",device="nvidia0",modelName="NVIDIA A100"} 37
DCGM_FI_DEV_GPU_UTIL{gpu="1",UUID="GPU-bbbb",device="nvidia1",Hostname="n1"} 0
DCGM_FI_DEV_GPU_UTIL_OTHER{gpu="2",UUID="GPU-cccc"} 99
DCGM_FI_DEV_MEM_COPY_UTIL{gpu="0",UUID="GPU-aaaa"} 12
DCGM_FI_DEV_GPU_UTIL{gpu="3"} 50
DCGM_FI_DEV_GPU_UTIL{gpu="4",UUID="GPU-dddd",GPU_I_ID="1"} 20
DCGM_FI_DEV_GPU_UTIL{gpu="4",UUID="GPU-dddd",GPU_I_ID="2"} 40
"""


def test_parse_dcgm() -> None:
    assert parse_dcgm(DCGM_TEXT) == {"GPU-aaaa": 37.0, "GPU-bbbb": 0.0, "GPU-dddd": 30.0}
    # NaN samples are skipped; a line that does not parse ends the reading, not the culler
    nan = DCGM_TEXT + 'DCGM_FI_DEV_GPU_UTIL{gpu="5",UUID="GPU-eeee"} NaN\n'
    assert "GPU-eeee" not in parse_dcgm(nan)
    broken = 'DCGM_FI_DEV_GPU_UTIL{UUID="GPU-aaaa"} 5\nDCGM_FI_DEV_GPU_UTIL{UUID= 7\n'
    assert parse_dcgm(broken) == {"GPU-aaaa": 5.0}


def test_history_window_mean_and_coverage() -> None:
    h = GPUHistory()
    now = 1000.0
    for t in range(0, 60, 5):
        h.add("GPU-a", 80.0 if t < 30 else 0.0, now - 60 + t)
    w = h.mean(["GPU-a"], 25, now)
    assert w.mean == 0.0 and w.covered and w.samples == 5
    w = h.mean(["GPU-a"], 60, now)
    assert w.mean == pytest.approx(40.0) and w.covered
    assert not h.mean(["GPU-a"], 120, now).covered  # observed for 60 s only
    assert not h.mean(["GPU-a", "GPU-unknown"], 25, now).covered
    assert h.mean([], 25, now).mean is None



def _plain_window(samples: dict[str, list[tuple[float, float]]], uuids: list[str],
                  window: float, now: float, threshold: float | None,
                  since: float | None) -> tuple[float | None, int, float | None]:
    """The window's mean, count and latest busy time counted plainly from the rules: a sample
    is the server's when ``since`` is None or ``t >= since``; it is in the window when
    ``now - window <= t <= now``; busy when ``t <= now`` and ``percent >= threshold``. The
    sum is correctly rounded (``math.fsum``), so the mean does not depend on the order the
    samples arrived in."""
    import math

    values: list[float] = []
    n, busy = 0, None
    for u in uuids:
        for t, v in samples.get(u, []):
            if since is not None and t < since:
                continue
            if now - window <= t and t <= now:
                values.append(v)
                n += 1
            if threshold is not None and v >= threshold and t <= now:
                if busy is None or t > busy:
                    busy = t
    return (math.fsum(values) / n if n else None), n, busy


def test_history_mean_equals_a_plain_count_on_random_histories() -> None:
    """GPUHistory.mean (samples sorted once per change, binary searches per call) gives exactly
    what the plain rules give on random histories, also when samples are added between
    calls: samples out of time order, equal times, percents on the
    threshold, samples after ``now``, ``since`` inside and outside the window, no threshold,
    GPUs without samples."""
    import random

    rnd = random.Random(20261128)
    for case in range(600):
        h = GPUHistory(max_age=1e9)
        kept: dict[str, list[tuple[float, float]]] = {}
        gpus = [f"GPU-{i}" for i in range(rnd.randint(1, 4))]
        t0 = 1_790_000_000.0
        times: list[float] = []
        for u in gpus:
            for _ in range(rnd.choice((0, 1, 5, 60, 300))):
                # whole seconds mostly: equal times, and bounds that fall on a sample
                t = t0 + rnd.choice((rnd.uniform(0, 3600), float(rnd.randint(0, 3600))))
                v = rnd.choice((0.0, 5.0, 100.0, rnd.uniform(0, 100)))
                h.add(u, v, t)
                kept.setdefault(u, []).append((t, v))
                times.append(t)
        at = rnd.choice(times) if times else t0
        now = rnd.choice((t0 + rnd.uniform(0, 4000), at, t0 + 3600))
        window = rnd.choice((60.0, 600.0, now - rnd.choice(times) if times else 1.0,
                             rnd.uniform(1, 5000)))
        threshold = rnd.choice((None, 5.0, 100.0, rnd.uniform(0, 100)))
        since = rnd.choice((None, t0 - 10, now - window, now - window / 2, rnd.choice(times)
                            if times else None, t0 + rnd.uniform(0, 3600)))
        asked = gpus + (["GPU-none"] if case % 7 == 0 else [])
        w = h.mean(asked, window, now, threshold, since)
        mean, n, busy = _plain_window(kept, asked, window, now, threshold, since)
        assert (w.mean, w.samples, w.busy_at) == (mean, n, busy), case
        # a sample added after a call (the sampler thread between two servers of a pass) is
        # in the next call: nothing is answered from samples sorted before it came
        t = rnd.choice((now, now - window / 2, t0))
        v = rnd.choice((0.0, 100.0, rnd.uniform(0, 100)))
        h.add(gpus[0], v, t)
        kept.setdefault(gpus[0], []).append((t, v))
        w = h.mean(asked, window, now, threshold, since)
        assert (w.mean, w.samples, w.busy_at) == _plain_window(
            kept, asked, window, now, threshold, since), ("after an add", case)


def test_history_mean_follows_the_ring_as_samples_arrive_and_leave() -> None:
    """The sorted index that GPUHistory keeps beside each GPU's ring follows the ring through
    a sampler's life: samples in time order appended between calls, old ones leaving by age
    (``max_age``) and by count (``max_samples``), now and then one out of order (the index is
    made again). After every add, a call gives what the plain rules give over the samples the
    ring holds."""
    import random

    rnd = random.Random(20261129)
    for case in range(40):
        h = GPUHistory(max_age=rnd.choice((30.0, 300.0, 1e9)),
                       max_samples=rnd.choice((7, 50, 20000)))
        gpus = ["GPU-a", "GPU-b"]
        t = 1_790_000_000.0
        for step in range(400):
            u = rnd.choice(gpus)
            t += rnd.choice((0.0, 1.0, 5.0, rnd.uniform(0, 20)))
            late = rnd.random() < 0.03  # a scrape that answers late
            h.add(u, rnd.choice((0.0, 5.0, 100.0, rnd.uniform(0, 100))),
                  t - rnd.uniform(1, 100) if late else t)
            if step % 3:
                continue
            window = rnd.choice((10.0, 60.0, 600.0))
            threshold = rnd.choice((None, 5.0, 50.0))
            since = rnd.choice((None, t - 200, t - 20))
            now = t + rnd.choice((0.0, -3.0, 1.0))
            asked = rnd.choice((gpus, gpus[:1], ["GPU-b", "GPU-none"]))
            w = h.mean(asked, window, now, threshold, since)
            ring = {g: list(h._samples.get(g, ())) for g in gpus}
            assert (w.mean, w.samples, w.busy_at) == _plain_window(
                ring, asked, window, now, threshold, since), (case, step)


class _Exporter(web.RequestHandler):
    text = ""

    def get(self) -> None:
        self.set_header("Content-Type", "text/plain; version=0.0.4")
        self.finish(type(self).text)


async def test_prometheus_source_on_loopback() -> None:
    class H(_Exporter):
        text = DCGM_TEXT

    port = free_port()
    server = web.Application([("/metrics", H)]).listen(port, "127.0.0.1")
    try:
        h = GPUHistory()
        src = PrometheusSource(h, [f"http://127.0.0.1:{port}/metrics",
                                   f"http://127.0.0.1:{free_port()}/metrics"], timeout=2)
        assert await src.scrape_once() == 3
        assert src.errors == 1  # the dead endpoint is counted, the live one still read
        assert h.mean(["GPU-aaaa"], 10).mean == 37.0
        H.text = DCGM_TEXT.replace("} 37", "} 5")
        await src.scrape_once()
        assert h.mean(["GPU-aaaa"], 10).mean == 21.0
    finally:
        server.stop()


class UtilNVML(FakeNVML):
    """The nvidia-ml-py double plus the two functions the sampler uses, with the real
    binding's names and shapes: ``nvmlDeviceGetHandleByUUID(uuid)`` and
    ``nvmlDeviceGetUtilizationRates(handle) -> .gpu, .memory`` (percent)."""

    FUNCTIONS = (*FakeNVML.FUNCTIONS, "nvmlDeviceGetHandleByUUID",
                 "nvmlDeviceGetUtilizationRates")

    def __init__(self, gpus: list[FakeGPU], **kw: Any) -> None:
        super().__init__(gpus, **kw)
        self.util = {g.uuid: 0 for g in gpus}

    def nvmlDeviceGetHandleByUUID(self, uuid: str | bytes) -> _Handle:
        u = uuid.decode() if isinstance(uuid, bytes) else uuid
        if not self.initialized:
            raise NVMLError(self.NVML_ERROR_UNINITIALIZED)
        for i, g in enumerate(self.gpus):
            if g.uuid == u:
                return _Handle(i)
        raise NVMLError(self.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetUtilizationRates(self, handle: _Handle) -> _Struct:
        g = self._device("nvmlDeviceGetUtilizationRates", handle)
        return _Struct(gpu=self.util[g.uuid], memory=0)


def test_double_functions_exist_in_real_pynvml() -> None:
    for name in UtilNVML.FUNCTIONS:
        assert callable(getattr(pynvml, name)), name


def test_nvml_sampler_with_double() -> None:
    gpus = [FakeGPU("GPU-n0"), FakeGPU("GPU-n1", pci_bus_id="00000000:08:00.0"),
            FakeGPU("GPU-mig", fail={"nvmlDeviceGetUtilizationRates":
                                     FakeNVML.NVML_ERROR_NOT_SUPPORTED})]
    nv = UtilNVML(gpus)
    nv.util.update({"GPU-n0": 90, "GPU-n1": 3})
    h = GPUHistory()
    s = NVMLSampler(h, interval=0.02, nvml=nv, uuids=lambda: ["GPU-n0", "GPU-n1", "GPU-mig",
                                                               "GPU-elsewhere"])
    assert s.start()
    try:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and h.mean(["GPU-n1"], 60).samples < 5:
            time.sleep(0.02)
        assert h.mean(["GPU-n0"], 60).mean == 90 and h.mean(["GPU-n1"], 60).mean == 3
        assert h.mean(["GPU-mig"], 60).mean is None  # NotSupported (MIG) is skipped
        assert any(c[0] == "nvmlDeviceGetUtilizationRates" for c in nv.calls)
    finally:
        s.stop()
    assert nv.shutdown_calls == 1
    # no UUIDs known yet: every device by index
    nv2 = UtilNVML([FakeGPU("GPU-x")])
    s2 = NVMLSampler(GPUHistory(), nvml=nv2)
    nv2.nvmlInit()
    assert s2.sample_once() == 1


def test_nvml_sampler_without_library() -> None:
    nv = FakeNVML([], init_error=FakeNVML.NVML_ERROR_LIBRARY_NOT_FOUND)
    s = NVMLSampler(GPUHistory(), nvml=nv)
    assert s.start() is False and "nvmlInit failed" in (s.error or "")


def test_network_meter_rates() -> None:
    counters = {"a/": 1000}
    m = NetworkMeter(lambda key, state: counters.get(key))
    assert m.observe("a/", {}, 100.0) is None  # first reading
    counters["a/"] = 6000
    assert m.observe("a/", {}, 110.0) == 500.0  # bytes/s
    counters["a/"] = 10  # new container: counter restarted
    assert m.observe("a/", {}, 120.0) is None
    assert m.observe("b/", {}, 120.0) is None  # no networks (host network): no signal


# ------------------------------------------------------------------ decisions
def server(started: float, last: float, gpus: list[str] = (), **kw: Any) -> dict[str, Any]:
    return {"ready": True, "pending": None, "started": iso(started),
            "last_activity": iso(last),
            "state": {"allocation": {"gpus": [{"uuid": g, "milli": 1000} for g in gpus]}},
            **kw}


def culler(policy: dict[str, Any], **kw: Any) -> Culler:
    return Culler(HubClient("http://127.0.0.1:1/hub/api", "x"), PolicySet(policy), **kw)


def test_pending_and_not_ready_are_never_culled() -> None:
    c = culler({"global": {"idle_timeout": 1, "max_age": 1}})
    u = {"name": "u", "groups": []}
    for s in (server(0, 0, pending="spawn", ready=False), server(0, 0, ready=False),
              server(0, 0, pending="stop")):
        assert c.evaluate(u, "", s, 10_000).action == "skip"


def test_warning_then_cull_then_withdrawn() -> None:
    c = culler({"global": {"idle_timeout": 100, "warning": 30}})
    u = {"name": "u", "groups": []}
    s = server(0, 0)
    assert c.evaluate(u, "", s, 60).action == "keep"
    d = c.evaluate(u, "", s, 75)  # due at 100, warning from 70
    assert d.action == "warn" and d.cull_at == 105  # the full warning lead after the mark
    assert d.message.startswith("will be culled at ") and "no activity for" in d.message
    assert c.evaluate(u, "", s, 100).action == "warn"
    assert c.evaluate(u, "", s, 106).action == "cull"
    # activity resumes during the warning: the mark is withdrawn
    c.evaluate(u, "", s, 80)
    assert "u/" in c.warnings
    assert c.evaluate(u, "", server(0, 80), 81).action == "keep" and "u/" not in c.warnings


def test_gpu_rules() -> None:
    h = GPUHistory()
    c = culler({"global": {"idle_timeout": 50, "gpu_idle_threshold": 5, "gpu_window": 20}},
               history=h)
    u = {"name": "u", "groups": []}
    for t in range(0, 100, 2):
        h.add("GPU-busy", 60, t)
        h.add("GPU-idle", 1 if t >= 70 else 60, t)
    s_busy = server(0, 0, ["GPU-busy"])
    d = c.evaluate(u, "busy", s_busy, 99)
    assert d.action == "keep" and d.figures["gpu_mean_percent"] == 60  # busy GPU = activity
    d = c.evaluate(u, "idle", server(0, 0, ["GPU-idle"]), 99)
    assert (d.action, d.reason) == ("cull", "gpu_idle") and d.figures["gpu_mean_percent"] == 1
    # unknown GPU (no samples): never "gpu_idle", the idle timeout applies
    d = c.evaluate(u, "unknown", server(0, 98, ["GPU-none"]), 99)
    assert d.action == "keep"
    # a CPU-only server is never judged on GPU use
    assert c.evaluate(u, "cpu", server(0, 98), 99).action == "keep"


def test_grace_and_max_age() -> None:
    c = culler({"global": {"idle_timeout": 10, "grace_period": 60, "max_age": 100}})
    u = {"name": "u", "groups": []}
    assert c.evaluate(u, "", server(0, 0), 30).action == "keep"  # idle, but in grace
    assert c.evaluate(u, "", server(0, 0), 61).reason == "idle"
    d = c.evaluate(u, "", server(0, 100), 100)  # active, but too old
    assert (d.action, d.reason) == ("cull", "max_age")


# ------------------------------------------------------------------ hub client
async def test_hub_client_retries_with_backoff() -> None:
    calls: list[float] = []

    class Flaky(web.RequestHandler):
        def get(self) -> None:
            calls.append(time.monotonic())
            if len(calls) <= 2:
                self.set_status(503)
                self.finish("busy")
            else:
                self.finish({"ok": True})

    class Bad(web.RequestHandler):
        def get(self) -> None:
            self.set_status(403)
            self.finish("no")

    port = free_port()
    srv = web.Application([("/hub/api/flaky", Flaky), ("/hub/api/bad", Bad)]).listen(
        port, "127.0.0.1")
    try:
        hub = HubClient(f"http://127.0.0.1:{port}/hub/api", "t", retries=3, backoff=0.1)
        status, body = await hub.request("GET", "/flaky")
        assert (status, body) == (200, {"ok": True}) and hub.retried == 2
        assert calls[2] - calls[1] >= 0.1  # backoff doubles (0.1 then 0.2, +-25 %)
        with pytest.raises(HubAPIError) as e:
            await hub.request("GET", "/bad")  # not retried
        assert e.value.status == 403 and hub.retried == 2
        dead = HubClient(f"http://127.0.0.1:{free_port()}/hub/api", "t", retries=1,
                         backoff=0.01)
        with pytest.raises(HubAPIError) as e:
            await dead.request("GET", "/x")
        assert e.value.status == 599
    finally:
        srv.stop()
        await asyncio.sleep(0)


def test_a_gpus_samples_from_before_the_server_are_not_its_own() -> None:
    """A GPU sampled before a server got it (idle at 0 %, or another tenant's) counted in the
    server's GPU window: a server started on a GPU that had been idle was warned at once and
    culled as "gpu_idle" at the end of its grace period while it used the GPU at 12 %. The
    window now starts at the server's start, and is covered only once the server has run a
    whole window."""
    h = GPUHistory()
    c = culler({"global": {"idle_timeout": 3600, "gpu_idle_threshold": 5, "gpu_window": 1800,
                           "grace_period": 600, "warning": 600}}, history=h)
    u = {"name": "u", "groups": []}
    for t in range(0, 2400, 10):  # 40 minutes idle before the server, then 12 %
        h.add("GPU-a", 0, t)
    for t in range(2400, 2400 + 1300, 10):
        h.add("GPU-a", 12, t)
    s = server(2400, 2400, ["GPU-a"])
    for now in (2410, 2400 + 600, 2400 + 1290):
        d = c.evaluate(u, "", s, now)
        assert d.action == "keep", (now, d)
        assert d.figures["gpu_mean_percent"] == 12 and not d.figures["gpu_window_covered"]
    # the same GPU idle since the server started: after a whole window it is culled
    h2 = GPUHistory()
    c2 = culler({"global": {"idle_timeout": 3600, "gpu_idle_threshold": 5,
                            "gpu_window": 1800}}, history=h2)
    for t in range(0, 2400 + 1810, 10):
        h2.add("GPU-a", 0, t)
    assert c2.evaluate(u, "", s, 2400 + 1300).action != "cull"
    d = c2.evaluate(u, "", s, 2400 + 1805)
    assert (d.action, d.reason) == ("cull", "gpu_idle")
