"""The two halves of a hand-over's order: counting the kubelet's connections into our
listener, and asking a holder whether it keeps that order."""

from __future__ import annotations

import asyncio
import socket

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio

from plugin.serving.deviceplugin.handover import (
    ORDERED_HANDOVER,
    connections_into,
    hands_over_in_order,
    kubelet_released,
)


async def test_connections_into_counts_open_connections_by_bind_path(tmp_path):
    bound = tmp_path / ".staged"
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(bound))
        listener.listen()
        assert connections_into(str(bound)) == 0
        client = socket.socket(socket.AF_UNIX)
        client.connect(str(bound))
        accepted, _ = listener.accept()
        assert connections_into(str(bound)) == 1
        assert connections_into("//" + str(bound)) == 1  # how gRPC spells "unix:///path"
        assert not await kubelet_released(str(bound), 0.05)  # still open: times out
        client.close()
        accepted.close()
        assert await kubelet_released(str(bound), 1.0)


async def _health_server(path, services):
    server = grpc.aio.server()
    health = health_aio.HealthServicer()
    for name in services:
        await health.set(name, health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    server.add_insecure_port(f"unix://{path}")
    await server.start()
    return server


async def test_a_holder_that_says_so_hands_over_in_order(tmp_path):
    server = await _health_server(tmp_path / "new.sock", [ORDERED_HANDOVER])
    try:
        assert await hands_over_in_order(tmp_path / "new.sock")
    finally:
        await server.stop(None)


async def test_an_older_holder_or_no_answer_does_not(tmp_path):
    server = await _health_server(tmp_path / "old.sock", [])
    try:
        assert not await hands_over_in_order(tmp_path / "old.sock")
    finally:
        await server.stop(None)
    with socket.socket(socket.AF_UNIX) as silent:  # listens, never speaks gRPC
        silent.bind(str(tmp_path / "silent.sock"))
        silent.listen()
        assert not await asyncio.wait_for(
            hands_over_in_order(tmp_path / "silent.sock", timeout=0.3), 5)
