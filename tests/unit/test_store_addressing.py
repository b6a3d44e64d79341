"""The store's pure parts: URL forms, version fencing, the key layout with its hash tags."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controlplane.store.fencing import MAX_EPOCH, MAX_VERSION, SEQUENCE_LIMIT, compose_version, split_version
from controlplane.store.keys import KeySpace, pool_hash
from controlplane.store.urls import StoreAddress, parse_store_url

# ---- URLs ------------------------------------------------------------------------------------------------


def test_single_server_forms() -> None:
    assert parse_store_url("redis://cache.internal") == StoreAddress("single", (("cache.internal", 6379),))
    assert parse_store_url("redis://:s%40cret@10.0.0.5:6380/3") == StoreAddress(
        "single", (("10.0.0.5", 6380),), db=3, password="s@cret")
    tls = parse_store_url("rediss://ops:pw@redis:6390/0?ssl_ca_certs=/etc/ca.pem&ssl_cert_reqs=Required"
                          "&ssl_check_hostname=false")
    assert tls.tls and (tls.username, tls.password) == ("ops", "pw")
    assert dict(tls.tls_options) == {"ssl_ca_certs": "/etc/ca.pem", "ssl_cert_reqs": "required",
                                     "ssl_check_hostname": False}
    unix = parse_store_url("unix:///var/run/redis%20x/redis.sock?db=2")
    assert (unix.unix_socket_path, unix.nodes, unix.db) == ("/var/run/redis x/redis.sock", (), 2)
    assert parse_store_url("redis://[::1]:7000").nodes == (("::1", 7000),)


def test_sentinel_and_cluster_forms() -> None:
    sentinel = parse_store_url("redis+sentinel://:pw@s1,s2:26380,[fd00::2]/cp-main/4?sentinel_password=spw")
    assert sentinel.topology == "sentinel" and sentinel.service_name == "cp-main" and sentinel.db == 4
    assert sentinel.nodes == (("s1", 26379), ("s2", 26380), ("fd00::2", 26379))
    assert (sentinel.password, sentinel.sentinel_password) == ("pw", "spw")
    assert "pw" not in sentinel.redacted() and "cp-main" in sentinel.redacted()
    cluster = parse_store_url("rediss+cluster://n1:7000,n2:7001,n3")
    assert cluster.topology == "cluster" and cluster.tls
    assert cluster.nodes == (("n1", 7000), ("n2", 7001), ("n3", 6379))
    assert parse_store_url("redis+cluster://n1:7000/0").db == 0


@pytest.mark.parametrize(("url", "message"), [
    ("", "empty"),
    ("localhost:6379", "scheme"),
    ("memcached://localhost", "scheme"),
    ("redis://", "no host"),
    ("redis://a:1,b:2", "one host only"),
    ("redis://localhost:0", "port must be in 1..65535"),
    ("redis://localhost:http", "port must be in 1..65535"),
    ("redis://localhost/x", "db must be a non-negative integer"),
    ("redis://localhost/0/1", "unexpected path"),
    ("redis://localhost?db=-1", "db must be a non-negative integer"),
    ("redis://localhost?timeout=3", "unknown query parameter 'timeout'"),
    ("redis://localhost?db=1&db=2", "given twice"),
    ("redis://localhost?ssl_ca_certs=/ca.pem", "needs a TLS scheme"),
    ("rediss://localhost?ssl_cert_reqs=maybe", "ssl_cert_reqs must be one of"),
    ("rediss://localhost?ssl_check_hostname=perhaps", "ssl_check_hostname must be true or false"),
    ("redis://localhost?sentinel_password=x", "for sentinel URLs only"),
    ("unix://host/path.sock", "unix:// takes no host"),
    ("unix://", "absolute socket path"),
    ("redis+sentinel://s1:26379", "needs the service name"),
    ("redis+sentinel://s1:26379/", "needs the service name"),
    ("redis+cluster://n1:7000/2", "only db 0"),
    ("redis+cluster://n1:7000,:7001", "empty host"),
    ("redis://[::1:7000", "IPv6"),
])
def test_malformed_urls_name_the_problem(url: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_store_url(url)


def test_errors_never_show_the_password() -> None:
    with pytest.raises(ValueError) as raised:
        parse_store_url("redis://user:hunter2@localhost:99999")
    assert "hunter2" not in str(raised.value) and "user:***" in str(raised.value)


# ---- fencing ---------------------------------------------------------------------------------------------


def test_versions_compose_and_split() -> None:
    assert compose_version(0, 0) == 0
    assert compose_version(3, 17) == 3_000_000_017
    assert split_version(3_000_000_017) == (3, 17)
    assert compose_version(MAX_EPOCH, MAX_VERSION % SEQUENCE_LIMIT) == MAX_VERSION
    assert split_version(MAX_VERSION) == (MAX_EPOCH, MAX_VERSION % SEQUENCE_LIMIT)
    # every version of a later epoch is above every version of an earlier one
    assert compose_version(4, 0) > compose_version(3, SEQUENCE_LIMIT - 1)


@pytest.mark.parametrize(("epoch", "seq", "message"), [
    (-1, 0, "epoch must not be negative"),
    (1, -1, r"sequence must be in \[0, 1000000000\)"),
    (1, SEQUENCE_LIMIT, r"sequence must be in \[0, 1000000000\)"),
    (MAX_EPOCH, MAX_VERSION % SEQUENCE_LIMIT + 1, "above uint64"),
    (MAX_EPOCH + 1, 0, "above uint64"),
    (1.5, 0, "epoch must be an int"),
    (1, True, "sequence must be an int"),
])
def test_out_of_range_version_parts_are_refused(epoch: object, seq: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        compose_version(epoch, seq)  # type: ignore[arg-type]


@pytest.mark.parametrize("version", [-1, MAX_VERSION + 1, 2**70, "5"])
def test_out_of_range_versions_are_refused(version: object) -> None:
    with pytest.raises(ValueError, match="version must be"):
        split_version(version)  # type: ignore[arg-type]


@given(st.integers(0, MAX_VERSION))
def test_split_inverts_compose(version: int) -> None:
    assert compose_version(*split_version(version)) == version


# ---- keys ------------------------------------------------------------------------------------------------


def test_keys_carry_their_hash_tags_first() -> None:
    keys = KeySpace("cp")
    assert keys.decision("engine-1") == "cp:decision:{e:engine-1}"
    assert keys.epoch("engine-1") == "cp:epoch:{e:engine-1}"
    assert keys.engine_id_of(keys.engine("e:x.1"), kind="engine") == "e:x.1"
    pool = "Qwen/Qwen3-8B|NVIDIA H200"
    assert keys.history(pool) == f"cp:history:{{p:{pool_hash(pool)}}}:{pool}"
    assert keys.pool_contribution(pool, 1_700_000_040) == f"cp:poolstat:{{p:{pool_hash(pool)}}}:1700000040:{pool}"
    assert keys.override("delta", "pool:a|b") == "cp:override:{o}:delta:pool:a|b"
    assert keys.pool_of_calibration(keys.calibration("m{1}|a")) == "m{1}|a"
    assert len(pool_hash(pool)) == 12 and pool_hash(pool) == pool_hash(str(pool))
    assert pool_hash("a|b") != pool_hash("a|c")
    # SCAN patterns escape the prefix's glob characters and match only the tagged layout
    assert KeySpace("c*p").decision_pattern == "c\\*p:decision:{e:*}"
    with pytest.raises(ValueError, match="not a decision key"):
        keys.engine_id_of("cp:decision:engine-1", kind="decision")
    with pytest.raises(ValueError, match="braces"):
        KeySpace("{cp}")
    with pytest.raises(ValueError, match="empty"):
        KeySpace("")
