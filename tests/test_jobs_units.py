"""Notebook jobs without a hub or an engine: every bad input of a submission is refused naming
its field (the service answers it as HTTP 400), the notebook's trip to the container and the
result's trip back, names that cannot collide, the jobs database, the CLI's parsing."""

from __future__ import annotations

import copy
import json
import os
import re
import sys

import pytest

nbformat = pytest.importorskip("nbformat")

from gpuspawner.hub.identity import (  # noqa: E402
    is_job_server,
    job_object_name,
    job_server,
    object_name,
)
from gpuspawner.jobs import execute  # noqa: E402
from gpuspawner.jobs.client import (  # noqa: E402
    ClientError,
    default_name,
    parse_parameter,
    service_url,
)
from gpuspawner.jobs.model import (  # noqa: E402
    OUTPUT_BEGIN,
    OUTPUT_END,
    JobInputError,
    Limits,
    check_at,
    check_time_limit,
    notebook_env,
    output_dir,
    parse_output,
    parse_submission,
)


def notebook(*sources: str, params: str = "x = 1") -> dict:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell(params, metadata={"tags": ["parameters"]})]
    nb.cells += [nbformat.v4.new_code_cell(s) for s in sources]
    return json.loads(nbformat.writes(nb))


GOOD = {"notebook": notebook("print(x)"), "profile": "cpu", "parameters": {"x": 2},
        "time_limit": 60, "name": "train-1"}
LIMITS = Limits(max_notebook_bytes=64 * 1024, max_parameters_bytes=256, max_env_bytes=32 * 1024)


def with_(**changes) -> dict:
    body = copy.deepcopy(GOOD)
    for k, v in changes.items():
        if v is ...:
            body.pop(k)
        else:
            body[k] = v
    return body


def test_a_good_submission_is_a_snapshot_without_outputs():
    nb = notebook("print(x)")
    nb["cells"][1]["outputs"] = [{"output_type": "stream", "name": "stdout", "text": "old"}]
    nb["cells"][1]["execution_count"] = 7
    req = parse_submission(with_(notebook=nb), LIMITS)
    assert req.profile == "cpu" and req.time_limit == 60 and req.name == "train-1"
    assert req.parameters == {"x": 2}
    cell = req.notebook["cells"][1]
    assert cell["outputs"] == [] and cell["execution_count"] is None
    # no name, no profile, no time limit: the defaults are the hub's
    req = parse_submission({"notebook": nb}, LIMITS)
    assert (req.name, req.profile, req.time_limit, req.parameters) == ("notebook", None, None, {})


BIG = "x" * (70 * 1024)

BAD = [
    # (body, field named, words in the reason)
    ([1, 2], "body", "JSON object"),
    (with_(extra=1), "extra", "unknown field"),
    (with_(notebook=...), "notebook", "missing"),
    (with_(notebook="not a notebook"), "notebook", "JSON object"),
    (with_(notebook={"cells": "x", "nbformat": 4, "nbformat_minor": 5, "metadata": {}}),
     "notebook", "not a valid notebook"),
    (with_(notebook={"hello": 1}), "notebook", "not a valid notebook"),
    (with_(notebook=notebook(f"s = '{BIG}'")), "notebook", "more than the limit"),
    (with_(parameters=[1]), "parameters", "JSON object"),
    (with_(parameters={"a-b": 1}), "parameters.a-b", "identifier"),
    (with_(parameters={"class": 1}), "parameters.class", "identifier"),
    (with_(parameters={"x": {"a": 1}}), "parameters.x", "scalar"),
    (with_(parameters={"x": [1, {"a": 1}]}), "parameters.x[1]", "scalar"),
    (with_(parameters={"x": float("nan")}), "parameters.x", "finite"),
    (with_(parameters={"x": "y" * 300}), "parameters", "more than the limit"),
    (with_(profile=3), "profile", "slug"),
    (with_(profile=""), "profile", "slug"),
    (with_(time_limit="60"), "time_limit", "whole number"),
    (with_(time_limit=1.5), "time_limit", "whole number"),
    (with_(time_limit=True), "time_limit", "whole number"),
    (with_(time_limit=0), "time_limit", "at least 1"),
    (with_(time_limit=-5), "time_limit", "at least 1"),
    (with_(name="a/b"), "name", "no '/'"),
    (with_(name="../x"), "name", "no '/'"),
    (with_(name=".."), "name", "no '/'"),
    (with_(name=".hidden"), "name", "starting with a letter"),
    (with_(name=""), "name", "no '/'"),
    (with_(name="x" * 101), "name", "at most 100"),
    (with_(name=7), "name", "string"),
    (with_(at=1700000000), "at", "ISO 8601"),
    (with_(at="tomorrow 10:00"), "at", "not an ISO 8601 time"),
    (with_(at="2999-01-01T10:00:00"), "at", "no time zone"),
    (with_(at="2001-01-01T10:00:00+00:00"), "at", "in the past"),
    (with_(at="2999-01-01T10:00:00Z"), "at", "days ahead"),
]


@pytest.mark.parametrize("body,field,words", BAD, ids=[f"{b[1]}-{i}" for i, b in
                                                        enumerate(BAD)])
def test_every_bad_input_names_its_field(body, field, words):
    with pytest.raises(JobInputError) as e:
        parse_submission(body, LIMITS)
    assert e.value.field == field
    assert str(e.value).startswith(f"{field}: ") and words in str(e.value)


def test_a_notebook_too_large_even_compressed_is_refused():
    random = os.urandom(20 * 1024).hex()  # does not compress below the travel limit
    with pytest.raises(JobInputError, match="even compressed") as e:
        parse_submission(with_(notebook=notebook(f"s = '{random}'")),
                         Limits(max_notebook_bytes=2**20, max_env_bytes=16 * 1024))
    assert e.value.field == "notebook"


def test_time_limit_against_the_profile_maximum():
    assert check_time_limit(None, 3600, 600) == 600  # the default never exceeds the max
    assert check_time_limit(None, 60, 600) == 60
    assert check_time_limit(600.0, 60, 600) == 600
    with pytest.raises(JobInputError, match="time_limit: at most 600 seconds for profile"):
        check_time_limit(601, 60, 600, "profile 'cpu'")


def test_the_notebook_travels_in_chunks_and_comes_back():
    nb = notebook(*[f"print({i})" for i in range(2000)])
    env, text = notebook_env(nb)
    n = int(env["GPUSPAWNER_JOB_NOTEBOOK_CHUNKS"])
    assert all(len(env[f"GPUSPAWNER_JOB_NOTEBOOK_{i}"]) <= 96 * 1024 for i in range(n))
    assert json.loads(execute.read_notebook(env)) == nb


def test_the_result_frame_round_trips(capsys):
    assert (execute.BEGIN, execute.END) == (OUTPUT_BEGIN, OUTPUT_END)
    result = {"notebook": notebook("1"), "error": {"ename": "E", "evalue": "v", "cell": 2}}
    print("some log line before")
    execute.emit(result)
    out = capsys.readouterr().out.encode()
    assert max(len(line) for line in out.splitlines()) <= 76 or b"log line" in out
    assert parse_output(b"noise\n" + out + b"more noise\n") == result
    assert parse_output(b"no frame here") is None
    assert parse_output(f"{OUTPUT_BEGIN}\n!!!\n{OUTPUT_END}\n".encode()) is None


def test_output_dir_is_inside_jobs_of_the_name():
    assert output_dir("train", 0, "ab12") == "jobs/train/19700101T000000Z-ab12"
    with pytest.raises(JobInputError):
        output_dir("../etc", 0, "ab12")


def test_job_names_are_injective_and_never_a_servers():
    users = ["alice", "al-ice", "al--ice", "jb-x", "jupyter", "a" * 80, "ü"]
    ids = ["0" * 32, "f" * 32, "x--y"]
    names = {job_object_name(u, i) for u in users for i in ids}
    assert len(names) == len(users) * len(ids)
    servers = {object_name(u, s) for u in users for s in ["", "job", "0" * 32]}
    assert not names & servers
    assert all(n.startswith("job-") for n in names)
    assert job_server("ab") == "job/ab" and is_job_server("job/ab")
    assert not is_job_server("") and not is_job_server("jobs")


def test_cli_parameters_and_names():
    assert parse_parameter("lr=0.1") == ("lr", 0.1)
    assert parse_parameter("n=3") == ("n", 3)
    assert parse_parameter("flag=true") == ("flag", True)
    assert parse_parameter("xs=[1, 2]") == ("xs", [1, 2])
    assert parse_parameter('s="7"') == ("s", "7")
    assert parse_parameter("s=hello world") == ("s", "hello world")
    assert parse_parameter('d={"a": 1}') == ("d", '{"a": 1}')
    with pytest.raises(ValueError, match="NAME=VALUE"):
        parse_parameter("novalue")
    assert default_name("/x/My Notebook (2).ipynb") == "My-Notebook--2-"
    assert default_name("..ipynb") == "notebook"


def test_service_url_from_the_environment():
    assert service_url({"JUPYTERHUB_API_URL": "https://h.example.org/base/hub/api/"}) == \
        "https://h.example.org/base/services/gpuspawner/"
    assert service_url({"GPUSPAWNER_SERVICE_URL": "http://127.0.0.1:9/services/gpuspawner",
                        "JUPYTERHUB_API_URL": "x"}) == "http://127.0.0.1:9/services/gpuspawner/"
    with pytest.raises(ClientError, match="JUPYTERHUB_API_URL"):
        service_url({})
    with pytest.raises(ClientError, match="does not end in /hub/api"):
        service_url({"JUPYTERHUB_API_URL": "http://h:8081/api"})


def test_store_keeps_jobs_and_refuses_a_newer_schema(tmp_path):
    pytest.importorskip("sqlalchemy")
    from gpuspawner.hub.jobs.store import JobRow, JobStore, StoreError, pack

    path = tmp_path / "state" / "jobs.sqlite"
    store = JobStore(f"sqlite:///{path}")
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    nb = notebook("1")
    row = JobRow(id="a" * 32, user="jb-u", name="n", profile="cpu", state="queued",
                 time_limit=60, notebook=pack(nb), created=1.0)
    row.set_json("history", [["queued", 1.0]])
    store.add(row)
    row.set_state("running", "on local", when=2.0)
    store.save()
    store.close()
    store = JobStore(f"sqlite:///{path}")
    got = store.get("a" * 32)
    assert got.state == "running" and got.get_json("history") == [["queued", 1.0],
                                                                    ["running", 2.0]]
    assert [r.id for r in store.active("jb-u")] == ["a" * 32] and store.active("other") == []
    assert got.notebook_dict == nb
    store.session.execute(__import__("sqlalchemy").text(
        "UPDATE gpuspawner_jobs_schema SET version = 99"))
    store.session.commit()
    store.close()
    with pytest.raises(StoreError, match="schema version 99"):
        JobStore(f"sqlite:///{path}")


def test_settings_time_limits_per_profile():
    pytest.importorskip("traitlets")
    from traitlets import TraitError

    from gpuspawner.hub.jobs.settings import GPUJobs

    s = GPUJobs(time_limit_default=100, time_limit_max=1000,
                profile_time_limits={"gpu": {"max": 50}, "cpu": {"default": 10}})
    assert s.time_limits("gpu") == (50, 50)
    assert s.time_limits("cpu") == (10, 1000)
    assert s.time_limits("other") == (100, 1000)
    with pytest.raises(TraitError, match="profile_time_limits.gpu.max"):
        GPUJobs(profile_time_limits={"gpu": {"max": 0}})
    with pytest.raises(TraitError, match="poll_interval"):
        GPUJobs(poll_interval=0)


def test_a_one_off_start_time():
    now = 1_800_000_000.0
    assert check_at("2027-01-15T08:00:00Z", now) == 1_800_000_000.0
    assert check_at("2027-01-15T09:00:00+01:00", now) == 1_800_000_000.0
    assert check_at("2027-01-15T09:00:00+01:00", now + 0.5) == now  # a second's grace
    with pytest.raises(JobInputError, match="at: .* is in the past"):
        check_at("2027-01-15T08:00:00Z", now + 60)


def test_a_version_1_database_is_brought_up(tmp_path):
    sqlalchemy = pytest.importorskip("sqlalchemy")
    from alembic import command
    from alembic.config import Config

    from gpuspawner.hub.jobs.store import MIGRATIONS, SCHEMA_VERSION, JobStore

    url = f"sqlite:///{tmp_path / 'jobs.sqlite'}"
    engine = sqlalchemy.create_engine(url)
    with engine.begin() as c:  # what the first version made (revision 0001 is that schema)
        cfg = Config()
        cfg.set_main_option("script_location", MIGRATIONS)
        cfg.attributes["connection"] = c
        command.upgrade(cfg, "0001")
        c.execute(sqlalchemy.text("DROP TABLE gpuspawner_jobs_alembic_version"))
    engine.dispose()
    store = JobStore(url)
    cols = {c["name"] for c in sqlalchemy.inspect(store.engine).get_columns("gpuspawner_jobs")}
    assert "not_before" in cols
    assert store.session.execute(sqlalchemy.text(
        "SELECT version FROM gpuspawner_jobs_schema")).scalar() == SCHEMA_VERSION  # 1 -> 3
    assert store.list() == []


async def test_the_restore_leaves_a_jobs_allocation_to_the_job_runner():
    """A restored allocation whose owner is no hub server is released and its container
    removed, unless it is a job's (owner server job/<id>: the job runner adopts it)."""
    from gpuspawner.backends.base import Backend, Managed, NodeRuntime
    from gpuspawner.hub.cluster import Cluster
    from gpuspawner.placement import Bundle, Ledger, Owner
    from tests.factories import make_node

    node = make_node("n1")
    scratch = Ledger([node], policy="first-fit")
    job = scratch.reserve(Bundle(cores=1), Owner("jb-u", job_server("a" * 32)))
    server = scratch.reserve(Bundle(cores=1), Owner("jb-u", "gone"))

    class Found(Backend):
        removed: list[str] = []

        async def list_managed(self) -> list[Managed]:
            return [Managed("n1", job.to_json(), "c-job"), Managed("n1", server.to_json(),
                                                                    "c-server")]

        async def remove_managed(self, found: Managed) -> None:
            self.removed.append(found.handle)

    backend = Found()
    backend.bind({"n1": NodeRuntime("n1", "127.0.0.1", "test", node)})
    c = Cluster({"n1": backend.nodes["n1"]}, Ledger([node], policy="first-fit"), backend)
    await c.ensure_restored(lambda user, srv: False)  # no hub server exists
    assert backend.removed == ["c-server"]
    assert [a.id for a in c.ledger.allocations()] == [job.id]


def _py310_datetime_module():
    """A ``datetime`` module whose ``datetime.fromisoformat`` refuses what Python 3.10's does:
    a ``Z`` suffix and fractions of other than 3 or 6 digits (3.11 reads both)."""
    import datetime as real
    import types

    class Py310DateTime(real.datetime):
        @classmethod
        def fromisoformat(cls, text):
            frac = re.search(r"\.(\d+)", text)
            if text.endswith(("Z", "z")) or (frac and len(frac.group(1)) not in (3, 6)):
                raise ValueError(f"Invalid isoformat string: {text!r}")
            return real.datetime.fromisoformat(text)

    fake = types.ModuleType("datetime")
    fake.__dict__.update(real.__dict__)
    fake.datetime = Py310DateTime
    return fake


def test_at_with_z_is_read_as_python_3_10_would_refuse_it(monkeypatch):
    """``at`` ending in Z (what the Lab, JavaScript's toISOString and `date -u` write) is UTC
    on every supported Python: 3.10's ``datetime.fromisoformat`` refuses the Z (emulated by a
    datetime module that behaves as 3.10's), so the parser may not depend on it."""
    monkeypatch.setitem(sys.modules, "datetime", _py310_datetime_module())
    now = 1_800_000_000.0
    assert check_at("2027-01-15T08:00:00Z", now) == now
    assert check_at("2027-01-15t08:00:00z", now) == now
    assert check_at("2027-01-15T08:00:00.5Z", now) == now + 0.5
    assert check_at("2027-01-15T08:00Z", now) == now
    assert check_at("2027-01-15 09:00:00+0100", now) == now
    assert check_at("2027-01-15T09:00:00.123456+01:00", now) == now + 0.123456
    for bad in ("2027-01-15", "2027-01-15T08:00:00", "2027-13-15T08:00:00Z",
                "2027-01-15T08:00:00+25:00", "tomorrow", "2027-01-15T08:00:00ZZ"):
        with pytest.raises(JobInputError, match="^at: "):
            check_at(bad, now)


def test_the_input_folder_is_copied_from_inside_the_home_only(tmp_path):
    """execute.copy_input_folder: regular files and folders of the home's folder, no link
    followed (named), the home's jobs folder left out, a folder reached through a link out of
    the home refused, and the size bounds."""
    home, outside = tmp_path / "home", tmp_path / "outside"
    (home / "proj" / "sub").mkdir(parents=True)
    (home / "jobs" / "old").mkdir(parents=True)
    outside.mkdir()
    (outside / "secret.txt").write_text("secret")
    (home / "proj" / "a.txt").write_text("a")
    (home / "proj" / "sub" / "b.txt").write_text("bb")
    (home / "jobs" / "old" / "x.ipynb").write_text("{}")
    os.symlink(outside / "secret.txt", home / "proj" / "link-file")
    os.symlink(outside, home / "proj" / "link-dir")
    os.symlink(outside, home / "escape")
    dest = home / "jobs" / "new" / "run1"
    dest.mkdir(parents=True)
    files, size, links = execute.copy_input_folder(str(home), "proj", str(dest))
    assert (files, size, sorted(links)) == (2, 3, ["link-dir", "link-file"])
    assert (dest / "a.txt").read_text() == "a" and (dest / "sub" / "b.txt").read_text() == "bb"
    assert not (dest / "link-file").exists() and not (dest / "link-dir").exists()
    # the home itself: not its jobs folder (this job's folder is in it)
    dest2 = home / "jobs" / "new" / "run2"
    dest2.mkdir()
    execute.copy_input_folder(str(home), "", str(dest2))
    assert (dest2 / "proj" / "a.txt").is_file() and not (dest2 / "jobs").exists()
    for bad, words in [("escape", "outside your home"), ("../outside", "outside your home"),
                       ("nope", "not a folder")]:
        with pytest.raises(execute.InputFolderError, match=words):
            execute.copy_input_folder(str(home), bad, str(dest))
    with pytest.raises(execute.InputFolderError, match="more than 1 files"):
        execute.copy_input_folder(str(home), "proj", str(dest), max_files=1)
