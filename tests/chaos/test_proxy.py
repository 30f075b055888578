"""The partition nemesis's TCP proxy (issue 24 item 3) on a real redis-server: a cut path
holds traffic (one way or both), a reset path resets connections, a slow path delays."""

from __future__ import annotations

import time

import pytest
import redis

from aaa_celery.chaos.proxy import ProxyHub

pytestmark = [pytest.mark.redis]


@pytest.fixture
def link(redis_url):
    hub = ProxyHub()
    try:
        yield hub.link(redis_url), redis_url
    finally:
        hub.stop()


def client(url: str, timeout_s: float = 1.0) -> redis.Redis:
    return redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)


def test_a_healthy_link_passes_commands_both_ways(link):
    path, direct = link
    c = client(path.url(direct))
    assert c.set("k", "v") and c.get("k") == b"v"
    c.close()


def test_a_path_cut_both_ways_times_out_and_heals(link):
    path, direct = link
    c = client(path.url(direct))
    assert c.ping()
    path.cut("both")
    with pytest.raises(redis.TimeoutError):
        c.set("cut", "1")
    assert client(direct).get("cut") is None  # the request never reached the server
    path.heal()
    assert client(path.url(direct), 5).ping()


def test_a_path_cut_one_way_down_loses_the_reply_but_not_the_write(link):
    path, direct = link
    c = client(path.url(direct))
    assert c.ping()
    path.cut("down")
    with pytest.raises(redis.TimeoutError):
        c.set("oneway", "1")
    assert client(direct).get("oneway") == b"1"  # the write happened; only its reply was lost
    path.heal()


def test_a_reset_path_refuses_connections_until_healed(link):
    path, direct = link
    c = client(path.url(direct))
    assert c.ping()
    path.reset()
    with pytest.raises(redis.ConnectionError):
        client(path.url(direct)).ping()
    path.heal()
    assert client(path.url(direct), 5).ping()


def test_a_slow_path_delays_each_way(link):
    path, direct = link
    c = client(path.url(direct), 10)
    assert c.ping()
    path.slow(0.4)
    started = time.monotonic()
    assert c.ping()
    assert time.monotonic() - started >= 0.75  # 0.4 s up and 0.4 s down (a lower bound holds under load)
    path.heal()
