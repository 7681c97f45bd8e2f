"""The configuration schemas (gpuspawner/schemas/): valid draft 2020-12, in step with the code
that reads the same settings, and their error messages name the field by its JSON path."""

from __future__ import annotations

import string
from pathlib import Path

import jsonschema
import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from gpuspawner import schemas
from gpuspawner.placement import NUMA_POLICIES, parse_bytes
from gpuspawner.schemas import (
    SCHEMA_NAMES,
    ConfigSchemaError,
    check_schemas,
    format_field,
    load_schema,
    validate,
)
from idle_culler.policies import DEFAULTS, PolicyError, parse_duration

REPO = Path(__file__).resolve().parents[1]


def _walk(node, path=()):
    """(path, subschema) of every schema node that has ``properties``."""
    if isinstance(node, dict):
        if "properties" in node:
            yield path, node
        for k, v in node.items():
            yield from _walk(v, (*path, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _walk(v, (*path, i))


def test_every_schema_is_valid_2020_12_and_documented():
    check_schemas()
    assert sorted(p.stem for p in (REPO / "gpuspawner" / "schemas").glob("*.json")) == sorted(
        SCHEMA_NAMES)
    for name in SCHEMA_NAMES:
        schema = load_schema(name)
        assert schema["$schema"] == schemas.DIALECT
        assert schema["$id"].endswith(f"/{name}.json")
        assert schema.get("title") and schema.get("description"), name
        for path, node in _walk(schema):
            if node.get("type") == "object" or "object" in node.get("type", []):
                # objects are closed: a misspelt key is an error, not ignored
                assert node.get("additionalProperties") is False, (name, path)
            for prop, sub in node["properties"].items():
                assert sub.get("description"), f"{name}: {'/'.join(map(str, path))}/{prop}"


def test_load_schema_returns_a_copy_and_refuses_unknown_names():
    a = load_schema("profiles")
    a["title"] = "changed"
    assert load_schema("profiles")["title"] == "GPUSpawner.profiles"
    with pytest.raises(KeyError,
                       match="known: profiles, nodes, quotas, culler-policies, user-options"):
        load_schema("nope")
    with pytest.raises(KeyError, match="no definition 'nope'"):
        validate("profiles", [], where="x", definition="nope")


def test_the_schemas_keys_are_the_codes_keys():
    """What the schemas allow is what the readers understand (one list of keys each)."""
    from gpuspawner.hub.cluster import NODE_KEYS, QUOTA_KEYS
    from gpuspawner.hub.profiles import PROFILE_KEYS

    profile = load_schema("profiles")["$defs"]["profile"]
    assert set(profile["properties"]) == PROFILE_KEYS
    assert tuple(profile["properties"]["numa_policy"]["enum"]) == NUMA_POLICIES
    assert tuple(load_schema("nodes")["$defs"]["node"]["properties"]) == NODE_KEYS
    assert tuple(load_schema("quotas")["properties"]) == QUOTA_KEYS
    policy = load_schema("culler-policies")
    assert set(policy["$defs"]["entry"]["properties"]) == set(DEFAULTS)


SIZE_TEXT = st.text(alphabet=string.digits + ". KMGTPkmgtpiIbBx-", max_size=8)


@given(SIZE_TEXT)
def test_the_size_pattern_accepts_what_parse_bytes_reads(text):
    try:
        parse_bytes(text)
        readable = True
    except ValueError:
        readable = False
    value = [{"slug": "p", "memory": text}]
    try:
        validate("profiles", value, where="profiles")
        valid = True
    except ConfigSchemaError as e:
        assert e.field == "profiles[0].memory"
        valid = False
    assert valid == readable, text


@given(st.text(alphabet=string.digits + ". smhdyx-", max_size=7))
def test_the_duration_pattern_accepts_what_parse_duration_reads(text):
    try:
        parse_duration(text, "x")
        readable = True
    except PolicyError:
        readable = False
    try:
        validate("culler-policies", {"global": {"max_age": text}}, where="")
        valid = True
    except ConfigSchemaError as e:
        assert e.field == "global.max_age"
        valid = False
    assert valid == readable, text


@pytest.mark.parametrize("name, value, message", [
    ("profiles", [{"slug": "a"}, {"slug": "b"}, {"slug": "c", "gpus": -1}],
     "GPUSpawner.profiles[2].gpus: -1 is less than the minimum of 0"),
    ("profiles", [{"slug": "a", "gpu_milli": 1000}],
     "GPUSpawner.profiles[0].gpu_milli: 1000 is greater than the maximum of 999"),
    ("profiles", [{"slug": "a", "groups": ["x", 3]}],
     "GPUSpawner.profiles[0].groups[1]: 3 is not of type 'string'"),
    ("profiles", [{"slug": "a", "default": "yes"}],
     "GPUSpawner.profiles[0].default: 'yes' is not of type 'boolean'"),
    ("profiles", ({"slug": "a", "cpu": True},),  # a bool is not a number; tuples are lists
     "GPUSpawner.profiles[0].cpu: True is not of type 'integer'"),
    ("nodes", [{"name": "a"}, {"topology": ["x"]}],
     "GPUSpawner.nodes[1].topology: ['x'] is not of type 'string', 'null'"),
    ("quotas", {"users": {"ann": {"servers": -1}}},
     "GPUSpawner.quotas.users.ann.servers: -1 is less than the minimum of 0"),
    ("quotas", {"users": {"ann": {"gpu": 1}}},
     "GPUSpawner.quotas.users.ann.gpu: unknown field; known: gpus, gpu_milli, cores"),
    ("culler-policies", {"users": {"bob": {"exempt": 1}}},
     "policies.yaml: users.bob.exempt: 1 is not of type 'boolean'"),
    # a value of none of an anyOf's types: the alternatives are named, not "not valid under any"
    ("profiles", [{"slug": "a", "memory": True}],
     'GPUSpawner.profiles[0].memory: True is not a size such as "4G"'),
    ("profiles", [{"slug": "a", "gpu_models": 5}],
     "GPUSpawner.profiles[0].gpu_models: 5 is not a list of names, one name or null"),
    ("quotas", {"default_user": "x"},
     "GPUSpawner.quotas.default_user: 'x' is not valid here; expected a quota (an object) or "
     "null"),
    ("culler-policies", {"global": {"max_age": [60]}},
     "policies.yaml: global.max_age: [60] is not a duration such as 600"),
])
def test_messages_name_where_and_the_json_path(name, value, message):
    where = "policies.yaml:" if name == "culler-policies" else f"GPUSpawner.{name}"
    with pytest.raises(ConfigSchemaError) as e:
        validate(name, value, where=where)
    assert str(e.value).startswith(message), str(e.value)
    assert isinstance(e.value, ValueError)


def test_good_values_pass():
    validate("profiles", [{"slug": "a100-1", "display_name": "1 x A100", "cpu": 8,
                           "memory": "64G", "disk": 50 * 2**30, "gpus": 1,
                           "gpu_models": ["A100"], "numa_policy": "prefer",
                           "groups": None, "nodes": "node-1", "default": True},
                          {"slug": "share", "gpus": 0.25}, {"slug": "m", "gpu_milli": 500}],
             where="p")
    validate("nodes", [{"name": "n", "docker_url": "tcp://n:2376", "topology": "auto",
                        "host": "n", "network_pool": "198.18.0.0/16"}, {}], where="n")
    validate("quotas", {"users": {"ann": {"gpus": 1.5, "memory": "64G"}}, "groups": None,
                        "default_user": {"cores": 16, "disk_bytes": 10**9}}, where="q")
    validate("culler-policies", yaml.safe_load(
        (REPO / "hub_config" / "culler_policies.yaml").read_text()), where="")
    validate("culler-policies", {"global": None, "groups": {"g": None}}, where="")


def test_validators_are_cached():
    validate("nodes", [], where="n")
    before = schemas._validator.cache_info().hits
    validate("nodes", [{"name": "a"}], where="n")
    assert schemas._validator.cache_info().hits == before + 1


def test_the_schemas_validate_with_plain_jsonschema_too():
    """The shipped files stand alone (the docs and the REST service hand them out)."""
    schema = load_schema("quotas")
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"users": {"a": {"gpus": -1}}}, schema,
                            cls=jsonschema.Draft202012Validator)
    jsonschema.validate({"users": {"a": {"gpus": 1}}}, schema,
                        cls=jsonschema.Draft202012Validator)


@pytest.mark.parametrize("where, path, field", [
    ("GPUSpawner.profiles", [2, "gpus"], "GPUSpawner.profiles[2].gpus"),
    ("", ["global", "idle_timeout"], "global.idle_timeout"),
    ("p.yaml:", ["users", "bob"], "p.yaml: users.bob"),
    ("nodes", [], "nodes"),
    ("", [], "(value)"),
    ("", [0, "slug"], "[0].slug"),
])
def test_format_field(where, path, field):
    assert format_field(where, path) == field
