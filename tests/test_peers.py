"""Peer engines in the benchmark: registered only when installed, offline workloads only, honest accounting.

The runs themselves need vLLM or llama-cpp-python (``make bench-peers``); those tests skip without them.
"""

from __future__ import annotations

import importlib.util

import pytest

import minfer.peers as peers
from minfer import bench
from minfer.bench import SYSTEMS
from minfer.workload import WorkItem, uniform_mix

NAMES = peers.NAMES


def test_peers_are_systems_only_when_their_package_imports(monkeypatch):
    here = set(peers.systems())
    assert {name for name in NAMES if name in SYSTEMS} == here, "the benchmark lists the peers installed here"
    assert all(SYSTEMS[name].describe is not dict for name in here), "each peer says how it ran, for --json"
    monkeypatch.setattr(peers, "installed", lambda module: False)
    assert peers.systems() == {}
    monkeypatch.setattr(peers, "installed", lambda module: module == "llama_cpp")
    assert list(peers.systems()) == ["llama.cpp (shipped Q4_1 GGUF)"]
    monkeypatch.setattr(peers, "installed", lambda module: True)
    assert list(peers.systems()) == NAMES == [name for name in bench.DEFAULT_SYSTEMS if name in NAMES]


def test_each_peer_row_says_what_it_streams(monkeypatch):
    """A row's roofline is priced at what it reads: vLLM's rows in their dtype, llama.cpp's at the 4-bit file."""
    monkeypatch.setattr(peers, "installed", lambda module: True)
    found = peers.systems()
    assert {name: (p.dtype, p.weights) for name, p in found.items()} == {
        "vLLM CPU backend, eager": ("float32", "dtype"), "vLLM CPU backend, compiled": ("float32", "dtype"),
        "vLLM CPU backend, bfloat16 eager": ("bfloat16", "dtype"),
        "vLLM CPU backend, bfloat16 compiled": ("bfloat16", "dtype"),
        "llama.cpp (shipped Q4_1 GGUF)": ("float32", "q4")}
    assert peers.vllm_config(eager=False, dtype="bfloat16")["dtype"] == "bfloat16"


def test_descriptions_name_the_weights_and_versions():
    weights = peers.llama_cpp_config()["weights"]
    assert weights["bytes_per_weight"]["Q4_1"] == 20 / 32  # 32 4-bit codes, a 16-bit scale and a 16-bit minimum
    assert weights["weights_per_type"]["Q4_1"] > 0.7 * sum(weights["weights_per_type"].values())  # the layers
    assert 0.6 < weights["overall_bytes_per_weight"] < 1  # against float32's 4
    assert set(peers.vllm_config(eager=True)) >= {"version", "enforce_eager", "dtype", "kv_cache_gib"}


def test_peers_refuse_arrival_times():
    with pytest.raises(ValueError, match="arrive at time 0"):
        peers.offline([WorkItem(0.0, 4, 4), WorkItem(1.5, 4, 4)])
    peers.offline(uniform_mix(4))


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="llama-cpp-python is not installed")
def test_llama_cpp_generates_every_token():
    work = uniform_mix(3, (8, 40), (2, 12), seed=1)
    tokens, seconds = peers.run_llama_cpp(work)
    assert tokens == sum(w.output_len for w in work) and seconds > 0


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")
def test_vllm_generates_every_token_in_its_own_process():
    work = uniform_mix(2, (200, 300), (2, 12), seed=1)  # prompts longer than a 128-token block of its cache
    for turn in range(2):  # the same prompts again: served cold, not from the prefix cache of the first turn
        tokens, seconds = peers.run_vllm(work, eager=True)
        assert tokens == sum(w.output_len for w in work) and seconds > 0
        served = peers.vllm_engine(True, "float32").last_cached_tokens
        assert served == 0, f"turn {turn} was served from the prefix cache"
    assert peers.vllm_config(eager=True)["threads"] >= 1


def test_a_peer_whose_process_dies_fails_its_row_only():
    """A peer's child that ends without answering (here: a role the child does not know, so it exits at once; on a
    real machine, llama.cpp's C code crashing) is an error of that peer, raised in the benchmark's process, which
    goes on; its message names the peer and the exit code."""
    with pytest.raises(RuntimeError, match=r"no-such-peer's process ended \(exit code"):
        peers.PeerProcess("no-such-peer", "no-such-role")


@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is not None, reason="llama-cpp-python is installed here")
def test_an_error_in_the_peers_process_comes_back_as_its_rows_error():
    """A Python error in the child (llama.cpp's runner without llama-cpp-python) is sent back and raised here."""
    child = peers.PeerProcess("llama.cpp", "llama-cpp")
    try:
        with pytest.raises(RuntimeError, match="llama.cpp failed in its process: ModuleNotFoundError"):
            child.run([[1, 2, 3]], [2])
    finally:
        child.close()
