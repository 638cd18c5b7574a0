"""The fleet loader: YAML in, frozen configuration out, every problem reported with its line."""

from __future__ import annotations

import copy
import dataclasses
import textwrap
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from router.config import (
    BrokerConfig,
    ReplicaConfig,
    RouterConfig,
    load_fleet,
    parse_fleet,
    unprofiled_kinds,
)
from router.errors import ConfigError, Problem
from router.perf import load_catalog

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "fleets"
FILE = "fleet.yaml"

# Line numbers below count from 1 at "model: m". Tests append lines after line 10.
MINIMAL = """\
model: m
nodes:
  - name: n0
    gpus:
      - {index: 0, model: A100-80GB, memory_gib: 80}
      - {index: 1, model: A100-80GB, memory_gib: 80}
    replicas:
      - id: r0
        endpoint: "http://127.0.0.1:18001"
        gpus: [0]
"""


def fleet_text(*extra: str) -> str:
    """MINIMAL with ``extra`` lines appended from line 11 on."""
    return MINIMAL + "".join(f"{line}\n" for line in extra)


def problems_in(text: str) -> list[Problem]:
    with pytest.raises(ConfigError) as info:
        parse_fleet(textwrap.dedent(text), FILE)
    return list(info.value.problems)


def only_problem(text: str) -> Problem:
    found = problems_in(text)
    assert len(found) == 1, found
    return found[0]


def assert_problem(text: str, line: int, key: str, *words: str) -> None:
    """The text has exactly one problem, at ``line`` and ``key``, whose message has ``words``."""
    problem = only_problem(text)
    assert (problem.file, problem.line, problem.key) == (FILE, line, key), problem
    for word in words:
        assert word in problem.message, problem


# --- the example fleets ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "nodes", "gpus", "replicas", "gpu_models"),
    [
        ("mixed-a100-v100.yaml", 2, 8, 8, {"A100-80GB", "V100-32GB"}),
        ("h100-a100-l4.yaml", 3, 8, 8, {"H100-SXM", "A100-80GB", "L4"}),
        ("tensor-parallel-70b.yaml", 3, 12, 6, {"H100-SXM", "A100-80GB"}),
    ],
)
def test_example_fleets_load_with_their_counts(
    name: str, nodes: int, gpus: int, replicas: int, gpu_models: set[str]
) -> None:
    fleet = load_fleet(EXAMPLES / name)
    assert (len(fleet.nodes), fleet.gpu_count, len(fleet.replicas)) == (nodes, gpus, replicas)
    assert {r.gpu_model for r in fleet.replicas} == gpu_models
    assert fleet.source == EXAMPLES / name


def test_mixed_example_weighs_a100_above_v100() -> None:
    """A100 replicas carry more weight, more KV cache and the strong tier; batch sizes are
    the engine's own limit on both, as most deployments leave them."""
    fleet = load_fleet(EXAMPLES / "mixed-a100-v100.yaml")
    by_gpu = {r.gpu_model: r for r in fleet.replicas}
    a100, v100 = by_gpu["A100-80GB"], by_gpu["V100-32GB"]
    assert a100.weight / v100.weight == pytest.approx(2.2)
    assert (a100.batch_size, v100.batch_size) == (256, 256)
    assert a100.kv_capacity_tokens is not None
    assert v100.kv_capacity_tokens is not None
    assert a100.kv_capacity_tokens > 4 * v100.kv_capacity_tokens
    assert (a100.tier, v100.tier) == ("strong", "standard")
    assert [r.endpoint[-5:] for r in fleet.replicas] == [str(p) for p in range(18001, 18009)]
    assert fleet.router.strategy.name == "weighted-least-connections"


def test_tensor_parallel_example_spans_two_gpus_of_one_model() -> None:
    fleet = load_fleet(EXAMPLES / "tensor-parallel-70b.yaml")
    assert all(len(r.gpus) == 2 for r in fleet.replicas)
    assert {r.model for r in fleet.replicas} == {"meta-llama/Llama-3.1-70B-Instruct"}


# --- defaults and derived fields ------------------------------------------------------------


def test_minimal_fleet_takes_the_documented_defaults() -> None:
    fleet = parse_fleet(MINIMAL, FILE)
    (replica,) = fleet.replicas
    assert replica == ReplicaConfig(
        id="r0",
        node="n0",
        endpoint="http://127.0.0.1:18001",
        model="m",
        gpus=(0,),
        gpu_model="A100-80GB",
        weight=1.0,
        batch_size=32,
        tier="standard",
        tags=(),
        max_context_tokens=None,
        kv_capacity_tokens=None,
    )
    assert fleet.router == RouterConfig()
    assert fleet.broker == BrokerConfig()
    assert (fleet.cluster, fleet.profiles, fleet.source) == ("default", (), None)


def test_replica_model_overrides_the_fleet_model() -> None:
    fleet = parse_fleet(fleet_text("        model: other"), FILE)
    assert fleet.replicas[0].model == "other"


def test_ints_are_accepted_where_floats_are_expected() -> None:
    fleet = parse_fleet(fleet_text("        weight: 2", "router: {timeouts: {connect_s: 1}}"), FILE)
    assert type(fleet.replicas[0].weight) is float
    assert type(fleet.router.timeouts.connect_s) is float


def test_tags_and_bounds_become_tuples() -> None:
    text = fleet_text("        tags: [a100, fast]", "router: {adaptive: {batch_bounds: [2, 64]}}")
    fleet = parse_fleet(text, FILE)
    assert fleet.replicas[0].tags == ("a100", "fast")
    assert fleet.router.adaptive.batch_bounds == (2, 64)


def test_strategy_params_are_a_frozen_mapping() -> None:
    text = fleet_text("router: {strategy: {name: tiered, params: {heavy_tokens: 4096}}}")
    params = parse_fleet(text, FILE).router.strategy.params
    assert isinstance(params, MappingProxyType)
    assert params == {"heavy_tokens": 4096}
    with pytest.raises(TypeError):
        params["heavy_tokens"] = 2  # type: ignore[index]  # the point: a read-only mapping


def test_top_level_x_keys_hold_anchors_that_replicas_merge() -> None:
    """`x-` keys are ignored, and a replica may override a merged-in value."""
    text = fleet_text(
        "        <<: *common",
        "        weight: 3",
        "x-common: &common {weight: 2, batch_size: 8}",
    )
    # The anchor must come before its alias, so move the x- key to the top.
    lines = text.splitlines()
    text = "\n".join([lines[-1], *lines[:-1]])
    replica = parse_fleet(text, FILE).replicas[0]
    assert (replica.weight, replica.batch_size) == (3.0, 8)


# --- immutability ---------------------------------------------------------------------------


def test_configuration_objects_are_immutable() -> None:
    fleet = parse_fleet(MINIMAL, FILE)
    with pytest.raises(dataclasses.FrozenInstanceError):
        fleet.replicas[0].weight = 5.0  # type: ignore[misc]  # the point: frozen
    with pytest.raises(dataclasses.FrozenInstanceError):
        fleet.router.queue.size = 1  # type: ignore[misc]  # the point: frozen
    assert isinstance(fleet.nodes, tuple)
    assert isinstance(fleet.nodes[0].replicas, tuple)


# --- each kind of problem, with its line and key ---------------------------------------------


def test_unknown_key_suggests_the_close_one() -> None:
    assert_problem(
        fleet_text("        wieght: 2"),
        11,
        "nodes[0].replicas[0].wieght",
        "unknown key 'wieght'",
        "did you mean 'weight'?",
    )


def test_unknown_key_with_no_close_match_lists_the_known_ones() -> None:
    assert_problem(fleet_text("owner: me"), 11, "owner", "expected one of: broker, cluster")


def test_wrong_type_names_what_was_expected_and_found() -> None:
    assert_problem(
        fleet_text("        batch_size: many"),
        11,
        "nodes[0].replicas[0].batch_size",
        "expected an integer, got string 'many'",
    )


@pytest.mark.parametrize(("key", "value"), [("weight", "true"), ("batch_size", "false")])
def test_booleans_are_not_numbers(key: str, value: str) -> None:
    assert_problem(
        fleet_text(f"        {key}: {value}"), 11, f"nodes[0].replicas[0].{key}", "got boolean"
    )


def test_yaml_booleans_where_text_is_expected_suggest_quoting() -> None:
    assert_problem(fleet_text("        tier: no"), 11, "nodes[0].replicas[0].tier", "quote it")


def test_missing_required_key_points_at_the_enclosing_mapping() -> None:
    text = fleet_text("      - {id: r1, gpus: [1]}")
    assert_problem(text, 11, "nodes[0].replicas[1].endpoint", "missing required key 'endpoint'")


def test_a_fleet_without_nodes_is_a_problem() -> None:
    assert_problem("model: m\ncluster: c\n", 1, "nodes", "missing required key 'nodes'")


def test_a_replica_needs_a_model_from_itself_or_the_fleet() -> None:
    assert_problem(
        MINIMAL.replace("model: m\n", "cluster: c\n"),
        8,
        "nodes[0].replicas[0].model",
        "top-level 'model'",
    )


def test_derived_keys_cannot_be_set_in_the_file() -> None:
    assert_problem(
        fleet_text("        node: n0"), 11, "nodes[0].replicas[0].node", "enclosing node"
    )
    assert_problem(
        fleet_text("        gpu_model: A100-80GB"), 11, "nodes[0].replicas[0].gpu_model", "derived"
    )


def test_duplicate_replica_ids_name_both_lines() -> None:
    text = fleet_text("      - {id: r0, endpoint: 'http://127.0.0.1:18002', gpus: [1]}")
    assert_problem(text, 11, "nodes[0].replicas[1].id", "duplicate replica id 'r0'", "line 8")


def test_replica_ids_are_unique_across_nodes() -> None:
    text = fleet_text(
        "  - name: n1",
        "    gpus: [{index: 0, model: L4, memory_gib: 24}]",
        "    replicas: [{id: r0, endpoint: 'http://127.0.0.1:18002', gpus: [0]}]",
    )
    assert_problem(text, 13, "nodes[1].replicas[0].id", "duplicate replica id", "line 8")


def test_duplicate_node_names_name_both_lines() -> None:
    text = fleet_text("  - {name: n0, gpus: [], replicas: []}")
    assert_problem(text, 11, "nodes[1].name", "duplicate node name 'n0'", "line 3")


def test_duplicate_gpu_indexes_on_a_node() -> None:
    text = MINIMAL.replace("{index: 1,", "{index: 0,")
    assert_problem(text, 6, "nodes[0].gpus[1].index", "duplicate GPU index 0", "line 5")


def test_replica_gpus_must_exist_on_its_node() -> None:
    text = MINIMAL.replace("gpus: [0]", "gpus: [0, 5]")
    assert_problem(text, 10, "nodes[0].replicas[0].gpus[1]", "GPU 5", "(0, 1)")


def test_replica_needs_at_least_one_gpu() -> None:
    text = MINIMAL.replace("gpus: [0]", "gpus: []")
    assert_problem(text, 10, "nodes[0].replicas[0].gpus", "must not be empty")


def test_a_gpu_serves_one_replica() -> None:
    text = fleet_text("      - {id: r1, endpoint: 'http://127.0.0.1:18002', gpus: [1, 0]}")
    assert_problem(
        text, 11, "nodes[0].replicas[1].gpus[1]", "GPU 0 is already used by replica 'r0'", "line 8"
    )


def test_a_replica_lists_a_gpu_once() -> None:
    text = MINIMAL.replace("gpus: [0]", "gpus: [0, 0]")
    assert_problem(text, 10, "nodes[0].replicas[0].gpus[1]", "listed twice")


def test_tensor_parallel_replica_needs_one_gpu_model() -> None:
    text = MINIMAL.replace(
        "{index: 1, model: A100-80GB, memory_gib: 80}",
        "{index: 1, model: V100-32GB, memory_gib: 32}",
    ).replace("gpus: [0]", "gpus: [0, 1]")
    assert_problem(text, 10, "nodes[0].replicas[0].gpus", "A100-80GB, V100-32GB")


@pytest.mark.parametrize("weight", ["0", "-1", "-0.5"])
def test_weight_must_be_positive(weight: str) -> None:
    text = fleet_text(f"        weight: {weight}")
    assert_problem(text, 11, "nodes[0].replicas[0].weight", "> 0")


@pytest.mark.parametrize(
    ("key", "value", "words"),
    [
        ("weight", "1.0e+308", ("from 1e-06 to 1e+06", "got 1e+308")),
        ("weight", "0.000000001", ("from 1e-06 to 1e+06", "got 1e-09")),
        ("weight", ".nan", ("expected a number",)),
        ("weight", ".inf", ("expected a number",)),
        ("batch_size", "1000000000", ("from 1 to 65536", "got 1000000000")),
    ],
)
def test_absurd_weights_and_batch_sizes_are_refused_with_their_range(
    key: str, value: str, words: tuple[str, ...]
) -> None:
    text = fleet_text(f"        {key}: {value}")
    assert_problem(text, 11, f"nodes[0].replicas[0].{key}", *words)


def test_the_batch_tuners_largest_size_is_bounded() -> None:
    text = fleet_text("router:", "  adaptive:", "    batch_bounds: [1, 1000000]")
    assert_problem(text, 13, "router.adaptive.batch_bounds", "largest must be <= 65536")


def test_the_widest_weights_and_batch_sizes_load() -> None:
    fleet = parse_fleet(fleet_text("        weight: 1000000", "        batch_size: 65536"), FILE)
    assert (fleet.replicas[0].weight, fleet.replicas[0].batch_size) == (1e6, 65536)


def test_batch_size_must_be_at_least_one() -> None:
    assert_problem(
        fleet_text("        batch_size: 0"), 11, "nodes[0].replicas[0].batch_size", ">= 1"
    )


def test_queue_size_must_be_at_least_one() -> None:
    assert_problem(fleet_text("router:", "  queue: {size: 0}"), 12, "router.queue.size", ">= 1")


def test_retry_attempts_must_be_at_least_one() -> None:
    text = fleet_text("router:", "  retries:", "    attempts: 0")
    assert_problem(text, 13, "router.retries.attempts", ">= 1")


@pytest.mark.parametrize("key", ["connect_s", "first_byte_s", "total_s"])
def test_timeouts_must_be_positive(key: str) -> None:
    text = fleet_text("router:", "  timeouts:", f"    {key}: -1")
    assert_problem(text, 13, f"router.timeouts.{key}", "> 0")


def test_queue_deadline_must_be_positive() -> None:
    text = fleet_text("router:", "  queue: {default_deadline_s: -5}")
    assert_problem(text, 12, "router.queue.default_deadline_s", "> 0")


@pytest.mark.parametrize("damping", ["0", "-0.1", "1.5"])
def test_adaptive_damping_lies_in_zero_to_one(damping: str) -> None:
    text = fleet_text("router:", f"  adaptive: {{weight_damping: {damping}}}")
    assert_problem(text, 12, "router.adaptive.weight_damping", "(0, 1]")


def test_adaptive_damping_of_one_is_allowed() -> None:
    text = fleet_text("router:", "  adaptive: {weight_damping: 1}")
    assert parse_fleet(text, FILE).router.adaptive.weight_damping == 1.0


@pytest.mark.parametrize(
    ("key", "value"), [("weight_bounds", "[4.0, 0.25]"), ("batch_bounds", "[64, 2]")]
)
def test_inverted_bounds_are_a_problem(key: str, value: str) -> None:
    text = fleet_text("router:", "  adaptive:", f"    {key}: {value}")
    assert_problem(text, 13, f"router.adaptive.{key}", "low <= high")


def test_bounds_are_a_pair() -> None:
    text = fleet_text("router:", "  adaptive:", "    batch_bounds: [1, 2, 3]")
    assert_problem(text, 13, "router.adaptive.batch_bounds", "list of 2 items, got 3")


def test_the_batch_tuner_needs_two_intervals_and_a_real_decrease() -> None:
    """Never on a single reading; a decrease of 1 or more would never cut."""
    text = fleet_text("router:", "  adaptive:", "    hysteresis: 1")
    assert_problem(text, 13, "router.adaptive.hysteresis", "must be >= 2")
    text = fleet_text("router:", "  adaptive:", "    decrease: 1.0")
    assert_problem(text, 13, "router.adaptive.decrease", "must be in (0, 1)")


def test_the_nvml_thresholds_of_the_old_batch_tuner_are_unknown_keys() -> None:
    text = fleet_text("router:", "  adaptive:", "    grow_below: 0.6")
    assert_problem(text, 13, "router.adaptive.grow_below", "unknown")


@pytest.mark.parametrize(
    "url",
    ["ftp://h:1", "http://", "127.0.0.1:8000", "http://h:99999", "http://h:port", "http://h?q=1"],
)
def test_bad_endpoint_urls_are_problems(url: str) -> None:
    text = MINIMAL.replace("http://127.0.0.1:18001", url)
    assert_problem(text, 9, "nodes[0].replicas[0].endpoint", "http://", repr(url))


@pytest.mark.parametrize("url", ["https://gpu-3.lab", "http://[::1]:8000", "http://h:8000/v1"])
def test_good_endpoint_urls_load(url: str) -> None:
    assert parse_fleet(MINIMAL.replace("http://127.0.0.1:18001", url), FILE).replicas[0].endpoint


def test_unknown_strategy_suggests_the_close_one() -> None:
    text = fleet_text("router:", "  strategy:", "    name: weighted-least-connection")
    assert_problem(text, 13, "router.strategy.name", "did you mean 'weighted-least-connections'?")


@pytest.mark.parametrize("url", ["tcp://h:1883", "mqtt://", "localhost", "embeded"])
def test_broker_url_is_embedded_or_mqtt(url: str) -> None:
    assert_problem(fleet_text(f"broker: {{url: '{url}'}}"), 11, "broker.url", "mqtt://")


@pytest.mark.parametrize("url", ["embedded", "mqtt://10.0.0.2:1883", "mqtts://broker.lab"])
def test_good_broker_urls_load(url: str) -> None:
    assert parse_fleet(fleet_text(f"broker: {{url: '{url}'}}"), FILE).broker.url == url


def test_cluster_under_broker_is_an_unknown_key_that_points_to_the_top() -> None:
    """The cluster is set once, at the top; the broker has no cluster of its own."""
    text = fleet_text("cluster: lab", "broker:", "  cluster: lab")
    assert_problem(
        text, 13, "broker.cluster", "unknown key 'cluster'", "cluster is set at the top of the file"
    )
    assert not hasattr(BrokerConfig(), "cluster")


def test_unknown_strategy_params_are_a_problem_at_the_params_line() -> None:
    text = fleet_text("router:", "  strategy:", "    name: round-robin", "    params: {foo: 1}")
    assert_problem(text, 14, "router.strategy.params", "round-robin takes no parameter 'foo'")


def test_a_bad_strategy_param_value_is_a_problem_in_the_strategys_words() -> None:
    text = fleet_text("router:", "  strategy: {name: tiered, params: {heavy_tokens: 0}}")
    assert_problem(text, 12, "router.strategy.params", "heavy_tokens must be at least 1, not 0")


def test_strategy_params_are_not_checked_against_an_unknown_strategy() -> None:
    """An unknown name is the one problem; its params are not judged by a guessed strategy."""
    text = fleet_text("router: {strategy: {name: fastest, params: {foo: 1}}}")
    assert_problem(text, 11, "router.strategy.name", "unknown strategy 'fastest'")


def test_names_used_in_mqtt_topics_are_checked() -> None:
    assert_problem(MINIMAL.replace("name: n0", "name: a/b"), 3, "nodes[0].name", "letters")


def test_a_key_given_twice_names_both_lines() -> None:
    text = fleet_text("        weight: 2", "        weight: 3")
    assert_problem(text, 12, "nodes[0].replicas[0].weight", "given twice", "line 11")


def test_a_key_given_twice_with_a_merge_counts_only_keys_written_in_the_mapping() -> None:
    """Overriding a merged-in key is what merges are for; it is not a duplicate."""
    text = "x-a: &a {weight: 2}\n" + fleet_text("        <<: *a", "        weight: 3")
    assert parse_fleet(text, FILE).replicas[0].weight == 3.0


def test_yaml_syntax_errors_carry_their_line() -> None:
    assert_problem(fleet_text("        weight: [2"), 12, "<file>", "not valid YAML")


def test_an_empty_file_is_a_problem() -> None:
    problem = only_problem("")
    assert (problem.key, problem.line) == ("<file>", None)
    assert "empty" in problem.message


def test_a_missing_file_is_a_config_error(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError) as info:
        load_fleet(missing)
    (problem,) = info.value.problems
    assert (problem.file, problem.line, problem.key) == (str(missing), None, "<file>")
    assert "No such file" in problem.message


def test_every_problem_in_a_file_is_reported_at_once_in_line_order() -> None:
    text = fleet_text(
        "        weight: 0",
        "        batch_size: 0",
        "router:",
        "  strategy: {name: fastest}",
        "  queue: {size: -1}",
        "broker: {url: nowhere}",
    )
    found = problems_in(text)
    assert [(p.line, p.key) for p in found] == [
        (11, "nodes[0].replicas[0].weight"),
        (12, "nodes[0].replicas[0].batch_size"),
        (14, "router.strategy.name"),
        (15, "router.queue.size"),
        (16, "broker.url"),
    ]
    assert all(p.file == FILE for p in found)


def test_problems_inside_a_bad_list_item_keep_their_own_index() -> None:
    """A list item that is not a mapping does not shift the keys of the items after it."""
    text = fleet_text("      - 7", "      - {id: r0, endpoint: 'http://h:18002', gpus: [1]}")
    found = problems_in(text)
    assert [(p.line, p.key) for p in found] == [
        (11, "nodes[0].replicas[1]"),
        (12, "nodes[0].replicas[2].id"),
    ]


# --- robustness -------------------------------------------------------------------------------


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix] if prefix else []
    if isinstance(value, dict):
        items: list[tuple[Any, Any]] = list(value.items())
    elif isinstance(value, list):
        items = list(enumerate(value))
    else:
        items = []
    for key, item in items:
        found += _paths(item, (*prefix, key))
    return found


EXAMPLE_DATA = yaml.safe_load((EXAMPLES / "mixed-a100-v100.yaml").read_text())
EXAMPLE_PATHS = _paths(EXAMPLE_DATA)
JUNK = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 3),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=4),
    st.lists(st.integers(-1, 9), max_size=3),
    st.dictionaries(st.sampled_from(["id", "index", "name", "x"]), st.integers(), max_size=2),
)


@settings(max_examples=300, derandomize=True, database=None, deadline=None)
@given(path=st.sampled_from(EXAMPLE_PATHS), junk=JUNK, delete=st.booleans())
def test_any_corruption_of_a_valid_file_loads_or_is_reported_with_a_line(
    path: tuple[Any, ...], junk: Any, delete: bool
) -> None:
    """Whatever value is broken, the loader never fails with anything but a located ConfigError."""
    data = copy.deepcopy(EXAMPLE_DATA)
    parent = data
    for key in path[:-1]:
        parent = parent[key]
    if delete:
        del parent[path[-1]]
    else:
        parent[path[-1]] = junk
    problems: tuple[Problem, ...] = ()
    try:
        parse_fleet(yaml.dump(data, Dumper=yaml.CSafeDumper), FILE)
    except ConfigError as exc:
        problems = exc.problems
        assert problems
    assert all(p.line is not None for p in problems), problems


# --- profile files named by the fleet -------------------------------------------------------

PROFILE = """\
gpus:
  MI300X:
    fp16_tflops: 1307.4
    bf16: true
    bandwidth_gbs: 5300
    memory_mib: 196608
models:
  m:
    params: 1000000000
    layers: 16
    attention_heads: 16
    kv_heads: 4
    head_dim: 64
    dtype: bf16
    max_context_tokens: 8192
"""


def write_fleet(folder: Path, *extra: str) -> Path:
    """MINIMAL plus ``extra`` lines, as ``fleet.yaml`` in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / FILE
    path.write_text(fleet_text(*extra))
    return path


def test_profile_paths_are_relative_to_the_fleet_file_not_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fleet_path = write_fleet(tmp_path / "conf", "profiles: [perf/mine.yaml]")
    (tmp_path / "conf" / "perf").mkdir()
    (tmp_path / "conf" / "perf" / "mine.yaml").write_text(PROFILE)
    monkeypatch.chdir(tmp_path)
    fleet = load_fleet(fleet_path)
    assert fleet.profiles == (str(tmp_path / "conf" / "perf" / "mine.yaml"),)


def test_a_missing_profile_file_is_a_problem_at_the_line_of_its_entry(tmp_path: Path) -> None:
    fleet_path = write_fleet(tmp_path, "profiles:", "  - absent.yaml")
    with pytest.raises(ConfigError) as info:
        load_fleet(fleet_path)
    (problem,) = info.value.problems
    assert (problem.file, problem.line, problem.key) == (str(fleet_path), 12, "profiles[0]")
    assert str(tmp_path / "absent.yaml") in problem.message
    assert "relative paths start at the fleet file" in problem.message


def test_a_problem_in_a_profile_file_is_a_fleet_problem_naming_that_file_and_line(
    tmp_path: Path,
) -> None:
    """The profile files a fleet names are configuration: their problems fail the load."""
    (tmp_path / "mine.yaml").write_text(PROFILE.replace("bf16: true", "bf16: maybe"))
    fleet_path = write_fleet(tmp_path, "        weight: 0", "profiles: [mine.yaml]")
    with pytest.raises(ConfigError) as info:
        load_fleet(fleet_path)
    assert [(p.file, p.line, p.key) for p in info.value.problems] == [
        (str(fleet_path), 11, "nodes[0].replicas[0].weight"),
        (str(tmp_path / "mine.yaml"), 4, "gpus.MI300X.bf16"),
    ]


def test_a_model_or_gpu_without_a_profile_loads_and_is_listed_once_per_kind() -> None:
    """Routing needs no profile, so an unknown model is not a problem; it is only listed."""
    text = fleet_text("      - {id: r1, endpoint: 'http://127.0.0.1:18002', gpus: [1]}")
    fleet = parse_fleet(text, FILE)
    assert unprofiled_kinds(fleet) == (("m", "A100-80GB"),)
    named = parse_fleet(text.replace("model: m", "model: meta-llama/Llama-3.1-8B"), FILE)
    assert unprofiled_kinds(named) == ()


def test_a_profile_file_named_by_the_fleet_makes_its_models_known(tmp_path: Path) -> None:
    (tmp_path / "mine.yaml").write_text(PROFILE)
    fleet = load_fleet(write_fleet(tmp_path, "profiles: [mine.yaml]"))
    assert unprofiled_kinds(fleet) == ()


# --- one YAML reader for fleets and profiles --------------------------------------------------


def test_fleet_and_profile_files_report_a_yaml_error_the_same_way(tmp_path: Path) -> None:
    """Both read through router.yaml_lines: same message, same line, same key."""
    broken = tmp_path / "broken.yaml"
    broken.write_text("gpus:\n  A: [1, 2\n")
    with pytest.raises(ConfigError) as as_fleet:
        load_fleet(broken)
    with pytest.raises(ConfigError) as as_profile:
        load_catalog([broken])
    assert as_fleet.value.problems == as_profile.value.problems
    (problem,) = as_profile.value.problems
    assert (problem.line, problem.key) == (3, "<file>")
    assert problem.message.startswith("not valid YAML: ")


def test_a_profile_file_may_share_fields_through_merge_keys(tmp_path: Path) -> None:
    """Profiles gain what fleet files had: anchors and `<<` merges, with overrides."""
    shared = tmp_path / "shared.yaml"
    shared.write_text(
        "gpus:\n"
        "  X1: &x {fp16_tflops: 100, bf16: true, bandwidth_gbs: 1000, memory_mib: 1024}\n"
        "  X2: {<<: *x, memory_mib: 2048}\n"
    )
    catalog = load_catalog([shared])
    assert (catalog.gpu("X1").memory_mib, catalog.gpu("X2").memory_mib) == (1024, 2048)
    assert catalog.gpu("X2").fp16_tflops == 100


def test_a_profile_written_twice_is_reported_at_the_repeat(tmp_path: Path) -> None:
    twice = tmp_path / "twice.yaml"
    entry = "  X1: {fp16_tflops: 1, bf16: true, bandwidth_gbs: 1, memory_mib: 1}\n"
    twice.write_text("gpus:\n" + entry + entry)
    with pytest.raises(ConfigError) as info:
        load_catalog([twice])
    (problem,) = info.value.problems
    assert (problem.line, problem.key, problem.message) == (3, "gpus.X1", "defined twice")


# --- server, health, broker TLS and console sections -----------------------------------------


def test_server_health_and_console_sections_load() -> None:
    fleet = parse_fleet(
        fleet_text(
            "server: {listen: '0.0.0.0:9000', admin_listen: '[::1]:9001', admin_token_env: TOK}",
            "router: {health: {check_interval_s: 0, eject_after_failures: 2}}",
            "console: {theme: light, keys: {drain: ctrl+e}}",
            "broker: {url: 'mqtts://broker:8883', ca_file: ca.pem}",
        ),
        FILE,
    )
    assert (fleet.server.listen, fleet.server.admin_listen) == ("0.0.0.0:9000", "[::1]:9001")
    assert fleet.server.admin_token_env == "TOK"
    assert (fleet.router.health.check_interval_s, fleet.router.health.eject_after_failures) == (
        0.0,
        2,
    )
    assert fleet.console.theme == "light"
    assert dict(fleet.console.keys) == {"drain": "ctrl+e"}
    assert fleet.broker.ca_file == "ca.pem"


@pytest.mark.parametrize("value", ["8000", "localhost", "host:port", "host:70000", ":8000"])
def test_a_listen_address_must_be_host_and_port(value: str) -> None:
    assert_problem(fleet_text(f"server: {{listen: '{value}'}}"), 11, "server.listen", "host:port")


def test_the_longest_ejection_is_not_shorter_than_the_first() -> None:
    assert_problem(
        fleet_text("router: {health: {eject_base_s: 60, eject_max_s: 30}}"),
        11,
        "router.health.eject_max_s",
        ">= eject_base_s",
    )


@pytest.mark.parametrize("key", ["max_ejection_percent", "panic_threshold_percent"])
@pytest.mark.parametrize("value", ["-1", "100.5", "250"])
def test_an_ejection_limit_is_a_percentage(key: str, value: str) -> None:
    assert_problem(
        fleet_text(f"router: {{health: {{{key}: {value}}}}}"),
        11,
        f"router.health.{key}",
        f"must be between 0 and 100, got {float(value)!r}",
    )


def test_ejection_limits_load() -> None:
    text = fleet_text("router: {health: {max_ejection_percent: 100, panic_threshold_percent: 0}}")
    health = parse_fleet(text, FILE).router.health
    assert (health.max_ejection_percent, health.panic_threshold_percent) == (100.0, 0.0)


def test_a_health_path_starts_with_a_slash() -> None:
    assert_problem(
        fleet_text("router: {health: {check_path: health}}"),
        11,
        "router.health.check_path",
        "starting with '/'",
    )
