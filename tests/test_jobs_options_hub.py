"""A job's own choices in a real hub (JupyterHub + configurable-http-proxy + GPUSpawner on the
real Docker engine; marked ``docker``): the image its submitter chose (a choice of the
profile's ``profile_options.image``, or an image of their own where ``unlisted_choice``
allows it, refused by the spawn form's rules otherwise), the output formats (the notebook
always, the HTML export only when asked for) and the input folder (copied into the job's
folder; only what is inside the home, no link followed). The hub's helpers are
tests/test_jobs_hub.py's."""

from __future__ import annotations

import io
import json
import os

import pytest

docker = pytest.importorskip("docker")
pytest.importorskip("nbformat")

import tests.test_jobs_hub as jobs_hub  # noqa: E402
from tests.hubrunner import Hub  # noqa: E402
from tests.test_hub_e2e import _engine  # noqa: E402
from tests.test_jobs_hub import EXTRA, User, home_of, released, remove_jobs  # noqa: E402
from tests.test_jobs_units import notebook  # noqa: E402
from tests.waiting import wait_until  # noqa: E402

pytestmark = [pytest.mark.docker, pytest.mark.hub]
IMAGE = os.environ.get("SINGLEUSER_IMAGE", "gpuspawner/singleuser:latest")
#: two images made from it, each saying its name in /etc/gpuspawner-test-image
ALT = "gpuspawner/singleuser:jobs-test-alt"
OWN = "gpuspawner/singleuser:jobs-test-own"
PROFILES = [
    {"slug": "cpu", "display_name": "CPU", "cpu": 1, "memory": "512M", "nodes": ["local"],
     "default": True, "profile_options": {"image": {
         "display_name": "Image",
         "choices": {"std": {"display_name": "Standard", "image": IMAGE, "default": True},
                     "alt": {"display_name": "Alternative", "image": ALT}},
         "unlisted_choice": {"enabled": True, "display_name": "Your own",
                             "validation_regex": r"gpuspawner/singleuser:[a-z0-9.-]+",
                             "validation_message": "a tag of gpuspawner/singleuser"}}}},
]
OPTIONS_EXTRA = f"""
c.GPUSpawner.image = {IMAGE!r}
c.GPUSpawner.image_deny_patterns = [r".*:denied"]
"""
FINAL = ("completed", "failed", "timed_out", "cancelled", "lost")
#: prints which image the job runs in
SAY_IMAGE = ("import os\n"
             "p = '/etc/gpuspawner-test-image'\n"
             "print('IMAGE', open(p).read().strip() if os.path.exists(p) else 'std',\n"
             "      os.environ.get('JUPYTER_IMAGE_SPEC'))")


def _build(engine, tag: str, words: str) -> None:
    dockerfile = f"FROM {IMAGE}\nUSER root\nRUN echo {words} > /etc/gpuspawner-test-image\n"
    for _ in engine.build(fileobj=io.BytesIO(dockerfile.encode()), tag=tag, rm=True,
                          decode=True):
        pass
    engine.inspect_image(tag)


@pytest.fixture(scope="module")
def engine():
    return _engine()


@pytest.fixture(scope="module")
def hub(engine, tmp_path_factory):
    _build(engine, ALT, "alt")
    _build(engine, OWN, "own")
    tmp = tmp_path_factory.mktemp("jobsoptions")
    h = Hub(tmp, [{"name": "local", "topology": "auto"}], PROFILES,
            extra_config=EXTRA + OPTIONS_EXTRA)
    h.env["GPUSPAWNER_CULLER"] = "off"
    h.start()
    jobs_hub.HUB_ID[:] = [(tmp / "hub" / "gpuspawner-hub-id").read_text().strip()]
    try:
        yield h
    finally:
        h.stop()
        remove_jobs(engine)
        for tag in (ALT, OWN):
            try:
                engine.remove_image(tag, force=True)
            except docker.errors.APIError:
                pass


def log_of(u: User, job_id: str) -> str:
    r = u.call("GET", f"api/jobs/{job_id}/log")
    assert r.status_code == 200, r.text
    return r.text


def test_a_job_runs_in_the_image_its_submitter_chose(hub, engine):
    u = User(hub, "jb-image")
    nb = notebook(SAY_IMAGE)
    plain = u.submit(nb, name="plain")
    alt = u.submit(nb, name="alt", image="alt")
    own = u.submit(nb, name="own", **{"image--unlisted-choice": OWN})
    assert (alt["image"], own["image--unlisted-choice"], plain["image"]) == ("alt", OWN, None)
    for job, words, spec in [(plain, "std", IMAGE), (alt, "alt", ALT), (own, "own", OWN)]:
        done = u.wait_state(job["id"], FINAL, 240)
        assert done["state"] == "completed", (done, log_of(u, job["id"]))
        assert f"IMAGE {words} {spec}" in log_of(u, job["id"]), log_of(u, job["id"])
    # refused at submission by the spawn form's rules: 400 naming the key, nothing stored
    for fields, words in [
            ({"image": "nope"}, "image: unknown image 'nope' for profile 'cpu'"),
            ({"image--unlisted-choice": "docker.io/evil/miner:1"},
             "image--unlisted-choice: 'docker.io/evil/miner:1' is not allowed on profile"),
            ({"image--unlisted-choice": "gpuspawner/singleuser:denied"},
             "image--unlisted-choice: 'gpuspawner/singleuser:denied' is not allowed on this "
             "hub (image_deny_patterns"),
            ({"image--unlisted-choice": "Not A Reference"}, "image--unlisted-choice: ")]:
        r = u.call("POST", "api/jobs", {"notebook": nb, **fields})
        assert r.status_code == 400 and r.json()["message"].startswith(words), (fields, r.text)
    r = u.call("POST", "api/job_definitions", {"notebook": nb, "schedule": "0 3 * * *",
                                               "image": "nope", "paused": True})
    assert r.status_code == 400 and r.json()["message"].startswith("image: "), r.text
    assert len(u.call("GET", "api/jobs").json()["jobs"]) == 3
    # a definition keeps its image choice for its runs ("Run job")
    d = u.call("POST", "api/job_definitions", {"notebook": nb, "schedule": "0 3 * * *",
                                               "image": "alt", "paused": True}).json()
    assert d["image"] == "alt"
    r = u.call("POST", f"api/job_definitions/{d['id']}/jobs", {})
    assert r.status_code == 201, r.text
    done = u.wait_state(r.json()["id"], FINAL, 240)
    assert done["state"] == "completed" and f"IMAGE alt {ALT}" in log_of(u, done["id"])
    wait_until(lambda: released(hub, engine, "jb-image"), 30, 0.3)


def test_output_formats_and_the_input_folder(hub, engine):
    u = User(hub, "jb-folder")
    first = u.submit(notebook("print('first')"), name="first")  # every format by default
    done = u.wait_state(first["id"], FINAL, 240)
    assert done["state"] == "completed" and done["has_html"], done
    home = home_of(hub, "jb-folder")
    out = home / done["output_dir"][2:]
    assert (out / "first.html").is_file() and (out / "first.ipynb").is_file()
    assert done["output_formats"] == ["ipynb", "html"]
    # a project folder with a file, a subfolder, and links out of the home
    owner = home.stat()
    proj = home / "proj"
    (proj / "sub").mkdir(parents=True)
    (proj / "data.txt").write_text("forty-two")
    (proj / "sub" / "more.txt").write_text("more")
    os.symlink("/etc/hostname", proj / "host-file")
    os.symlink("/etc", proj / "etc-dir")
    os.symlink("/etc", home / "escape")
    for path in [proj, proj / "sub", proj / "data.txt", proj / "sub" / "more.txt"]:
        os.chown(path, owner.st_uid, owner.st_gid)
    for path in [proj / "host-file", proj / "etc-dir", home / "escape"]:
        os.lchown(path, owner.st_uid, owner.st_gid)
    reader = notebook("import os\nprint('DATA', open('data.txt').read(), "
                      "open('sub/more.txt').read(), os.path.lexists('host-file'), "
                      "os.path.lexists('etc-dir'))")
    job = u.submit(reader, name="reader", input_folder="proj", output_formats=["ipynb"])
    assert (job["input_folder"], job["output_formats"]) == ("proj", ["ipynb"])
    done = u.wait_state(job["id"], FINAL, 240)
    log = log_of(u, job["id"])
    assert done["state"] == "completed", (done, log)
    assert "DATA forty-two more False False" in log, log  # copied, links not followed
    assert "links not followed: " in log and "host-file" in log
    out = home / done["output_dir"][2:]
    assert (out / "data.txt").read_text() == "forty-two"
    assert (out / "reader.ipynb").is_file() and not (out / "reader.html").exists()
    assert not done["has_html"]
    assert (proj / "data.txt").read_text() == "forty-two"  # the original is untouched
    # a folder that leads out of the home through a link: the job refuses it
    job = u.submit(reader, name="escape", input_folder="escape")
    done = u.wait_state(job["id"], FINAL, 240)
    assert done["state"] == "failed", done
    assert "input folder: 'escape' is outside your home" in json.dumps(done["error"]), done
    for bad in ("../jb-image", "/etc", "proj/../../x"):
        r = u.call("POST", "api/jobs", {"notebook": reader, "input_folder": bad})
        assert r.status_code == 400 and r.json()["message"].startswith("input_folder: "), \
            (bad, r.text)
    r = u.call("POST", "api/jobs", {"notebook": reader, "output_formats": ["pdf"]})
    assert r.status_code == 400 and r.json()["message"].startswith("output_formats: ")
    wait_until(lambda: released(hub, engine, "jb-folder"), 30, 0.3)
