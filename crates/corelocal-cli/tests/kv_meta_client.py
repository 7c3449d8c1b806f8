"""A memcached meta-protocol client nobody here wrote (RevenueCat's meta-memcache, from PyPI)
driving a server at HOST PORT: every call it makes is an mg/ms/md/ma/mn command line. The same
script passes against memcached 1.6.18 itself (crates/corelocal-cli/tests/e2e_kv_meta.rs), so
its expectations are memcached's behaviour. Prints "ok" when every check held."""

import os
import sys
import time

from meta_memcache import (
    CacheClient,
    Conflict,
    Key,
    LeasePolicy,
    MemcacheServerError,
    Miss,
    NotStored,
    RecachePolicy,
    RequestFlags,
    ServerAddress,
    SetMode,
    StalePolicy,
    Success,
    Value,
    connection_pool_factory_builder,
)

host, port = sys.argv[1], int(sys.argv[2])
# A run-unique prefix: the script may run twice against one server without seeing its past.
run = "r%d_" % os.getpid()

c = CacheClient.cache_client_from_servers(
    servers=[ServerAddress(host=host, port=port)],
    connection_pool_factory_fn=connection_pool_factory_builder(
        connection_timeout=3, recv_timeout=5, read_buffer_size=64 * 1024
    ),
)


def k(name):
    return Key(run + name)


def raw(v):
    """A low-level reply's value as bytes (the client decodes some to str)."""
    return v.encode() if isinstance(v, str) else bytes(v)


# --- set / get / delete, values of every type the client's serializer knows (client flags) ---
values = {
    "bytes": b"\x00\x01binary\xff",
    "str": "text \u00e9\u4e2d",
    "int": 1234567890123,
    "neg": -5,
    "dict": {"a": [1, 2, 3], "b": None},
    "empty": b"",
}
for name, v in values.items():
    assert c.set(k(name), v, ttl=0) is True, name
for name, v in values.items():
    assert c.get(k(name)) == v, (name, c.get(k(name)))
assert c.get(k("absent")) is None
assert c.delete(k("bytes")) is True
assert c.delete(k("bytes")) is False, "deleting a missing key is NF"
assert c.get(k("bytes")) is None
assert c.invalidate(k("bytes")) is True, "invalidate of a missing key succeeds"
assert c.invalidate(k("str")) is True
assert c.get(k("str")) is None

# --- set modes (ms M<mode>) ---
assert c.set(k("mode"), b"x", ttl=0, set_mode=SetMode.ADD) is True
assert c.set(k("mode"), b"y", ttl=0, set_mode=SetMode.ADD) is False, "add of a present key"
assert c.set(k("nomode"), b"y", ttl=0, set_mode=SetMode.REPLACE) is False
assert c.set(k("mode"), b"z", ttl=0, set_mode=SetMode.REPLACE) is True
assert c.set(k("mode"), b"<", ttl=0, set_mode=SetMode.PREPEND) is True
assert c.set(k("mode"), b">", ttl=0, set_mode=SetMode.APPEND) is True
assert c.get(k("mode")) == b"<z>"
assert c.set(k("nomode"), b">", ttl=0, set_mode=SetMode.APPEND) is False
assert c.refill(k("mode"), b"again", ttl=0) is False, "refill is an add"

# --- CAS (c/C flags) ---
value, cas = c.get_cas(k("mode"))
assert value == b"<z>" and isinstance(cas, int) and cas > 0, (value, cas)
assert c.set(k("mode"), b"new", ttl=0, cas_token=cas + 1000) is False, "stale CAS: EX"
assert c.set(k("mode"), b"new", ttl=0, cas_token=cas) is True
assert c.get(k("mode")) == b"new"
new_cas = c.set_cas(k("mode"), b"newer", ttl=0)
assert isinstance(new_cas, int) and new_cas != cas
assert c.get_cas(k("mode")) == (b"newer", new_cas)
assert c.delete(k("mode"), cas_token=new_cas + 1) is False, "delete with a stale CAS"
assert c.delete(k("mode"), cas_token=new_cas) is True
assert c.set(k("absentcas"), b"v", ttl=0, cas_token=12345) is False, "CAS of a missing key"

# --- TTLs: t flag on reads, T on sets and touches, expiry ---
assert c.set(k("ttl"), b"v", ttl=100) is True
r = c.meta_get(k("ttl"), RequestFlags(return_ttl=True, return_value=True))
assert isinstance(r, Value) and 98 <= r.flags.ttl <= 100, r.flags.ttl
r = c.meta_get(k("values_int"), RequestFlags(return_ttl=True))
assert isinstance(r, Miss)
assert c.set(k("forever"), b"v", ttl=0) is True
r = c.meta_get(k("forever"), RequestFlags(return_ttl=True))
assert isinstance(r, Success) and r.flags.ttl == -1, r.flags.ttl
assert c.touch(k("ttl"), ttl=1000) is True
r = c.meta_get(k("ttl"), RequestFlags(return_ttl=True))
assert 998 <= r.flags.ttl <= 1000, r.flags.ttl
assert c.touch(k("absent"), ttl=10) is False
assert c.get(k("ttl"), touch_ttl=2) == b"v", "get and touch (T on mg)"
r = c.meta_get(k("ttl"), RequestFlags(return_ttl=True))
assert 1 <= r.flags.ttl <= 2, r.flags.ttl
assert c.set(k("short"), b"v", ttl=1) is True
time.sleep(2.2)
assert c.get(k("short")) is None, "expired"
assert c.get(k("ttl")) is None, "expired after the touch shortened it"

# --- other read flags: size, key, opaque, client flags, fetched, last access ---
assert c.set(k("meta"), b"12345", ttl=0) is True
r = c.meta_get(
    k("meta"),
    RequestFlags(
        return_size=True,
        return_client_flag=True,
        return_fetched=True,
        return_last_access=True,
        return_cas_token=True,
        opaque=b"op42",
    ),
)
assert isinstance(r, Success), r
assert r.flags.size == 5 and r.flags.opaque == b"op42", (r.flags.size, r.flags.opaque)
assert r.flags.fetched is False and r.flags.last_access is not None
assert r.flags.cas_token and r.flags.client_flag is not None
r = c.meta_get(k("meta"), RequestFlags(return_fetched=True))
assert r.flags.fetched is True, "fetched once before"
r = c.meta_get(k("meta"), RequestFlags(no_update_lru=True, return_value=True))
assert isinstance(r, Value) and raw(r.value) == b"12345"

# --- arithmetic (ma: N autovivify, J initial, D delta, MI/MD) ---
assert c.delta(k("counter"), 1) is False, "ma on a missing key: NF"
assert c.delta_initialize(k("counter"), 5, initial_value=10, initial_ttl=0) is True
assert c.delta_and_get(k("counter"), 5) == 15
assert c.delta_and_get(k("counter"), -20) == 0, "decrement floors at 0"
assert c.delta_initialize_and_get(k("counter2"), 3, initial_value=7, initial_ttl=0) == 7
assert c.delta_initialize_and_get(k("counter2"), 3, initial_value=7, initial_ttl=0) == 10
assert c.delta_and_get(k("absentcounter"), 1) is None
r = c.meta_get(k("counter2"), RequestFlags(return_value=True))
assert raw(r.value) == b"10"
ctr_value, ctr_cas = c.get_cas(k("counter2"))
assert c.delta(k("counter2"), 1, cas_token=ctr_cas + 7) is False, "ma with a stale CAS"
assert c.delta(k("counter2"), 1, cas_token=ctr_cas) is True
assert c.set(k("text"), b"abc", ttl=0) is True
try:
    c.delta_and_get(k("text"), 1)
    raise AssertionError("ma of a non-numeric value must be a CLIENT_ERROR")
except MemcacheServerError:
    pass  # the client drops the connection and raises; the next call reconnects

# --- leases (N vivify on miss: W win / Z already sent) and recache (R: W and X) ---
lease = LeasePolicy(ttl=30, miss_retries=2, miss_retry_wait=0.05, wait_backoff_factor=1)
waits = []
assert c.get_or_lease(k("lease"), lease, lease_wait_fn=waits.append) is None, "won the lease"
assert waits == []
r = c.meta_get(k("lease"), RequestFlags(vivify_on_miss_ttl=30, return_value=True))
assert isinstance(r, Value) and r.flags.win is False, "lease already taken (Z)"
assert c.get_or_lease(k("lease"), lease, lease_wait_fn=waits.append) is None
assert len(waits) >= 1, ("lost the lease: waited and retried", waits)
assert c.set(k("lease"), b"filled", ttl=0) is True
assert c.get_or_lease(k("lease"), lease) == b"filled"
assert c.set(k("hot"), b"old", ttl=10) is True
r = c.meta_get(k("hot"), RequestFlags(recache_ttl=30, return_value=True, return_ttl=True))
assert isinstance(r, Value) and r.flags.win is True, "under the recache TTL: this client wins"
r = c.meta_get(k("hot"), RequestFlags(recache_ttl=30, return_value=True))
assert r.flags.win is False and raw(r.value) == b"old", "the others keep the old value"
assert c.get(k("hot"), recache_policy=RecachePolicy(ttl=30)) == b"old"

# --- stale: md I (mark stale) then ms I, W/X flags ---
assert c.set(k("stale"), b"v1", ttl=0) is True
assert c.delete(k("stale"), stale_policy=StalePolicy(mark_stale_on_deletion_ttl=30)) is True
r = c.meta_get(k("stale"), RequestFlags(return_value=True, return_cas_token=True))
assert isinstance(r, Value) and r.flags.stale is True and r.flags.win is True, r.flags
r = c.meta_get(k("stale"), RequestFlags(return_value=True))
assert r.flags.stale is True and r.flags.win is False
assert c.set(k("stale"), b"v2", ttl=0) is True
r = c.meta_get(k("stale"), RequestFlags(return_value=True))
assert raw(r.value) == b"v2" and not r.flags.stale

# --- keys the client base64-encodes (b flag): long and non-ASCII ---
long_key = Key(run + "L" * 400)
uni_key = Key(run + "cl\u00e9 \u2603 with spaces")
assert c.set(long_key, b"long", ttl=0) is True
assert c.set(uni_key, b"uni", ttl=0) is True
assert c.get(long_key) == b"long" and c.get(uni_key) == b"uni"
assert c.multi_get([long_key, uni_key]) == {long_key: b"long", uni_key: b"uni"}
assert c.delete(uni_key) is True and c.get(uni_key) is None

# --- big values: up to the 1 MiB item limit (incompressible), then over it ---
for size in (100_000, 500_000, 1_000_000):
    blob = os.urandom(size)
    assert c.set(k("big%d" % size), blob, ttl=0) is True, size
    assert c.get(k("big%d" % size)) == blob, size
try:
    c.set(k("toobig"), os.urandom(2_000_000), ttl=0)
    raise AssertionError("a value over -I must be a SERVER_ERROR")
except MemcacheServerError:
    pass
assert c.get(k("toobig")) is None

# --- many keys: a multiget of 2000 (pipelined mg ... q k, then mn) ---
many = {k("many%d" % i): ("value-%d" % i).encode() * (1 + i % 7) for i in range(2000)}
for key, v in many.items():
    assert c.set(key, v, ttl=0, no_reply=True) is True
got = c.multi_get(list(many) + [k("manymissing")])
assert len(got) == 2001 and got[k("manymissing")] is None
assert all(got[key] == v for key, v in many.items())
got = c.multi_get_cas(list(many)[:100])
assert all(isinstance(cas, int) and cas > 0 for _, cas in got.values())
for key in list(many)[:1000]:
    assert c.invalidate(key, no_reply=True) is True
got = c.multi_get(list(many))
assert sum(v is None for v in got.values()) == 1000

# --- low-level answers the client parses itself ---
assert isinstance(c.meta_set(k("raw"), b"x", RequestFlags(cache_ttl=0)), Success)
assert isinstance(c.meta_set(k("raw"), b"x", RequestFlags(mode=SetMode.ADD.value)), NotStored)
assert isinstance(
    c.meta_set(k("raw"), b"x", RequestFlags(cas_token=1, cache_ttl=0)), Conflict
), "EX"
assert isinstance(c.meta_delete(k("rawmissing")), Miss)
print("ok")
