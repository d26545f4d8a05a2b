"""Runtime access to one API generation's wire types, each in its own descriptor pool.

Why private pools: v1alpha1 and v1alpha2 both declare ``deviceplugin.AllocateResponse`` with
different types for field 1. Generated ``*_pb2`` modules would register both in protobuf's
default pool and the second import would fail. Loading each generation's build-time
descriptor set into a pool of its own lets the two live in one process; the gRPC method path
(``/deviceplugin.DevicePlugin/Allocate``) is all the wire needs to agree on.

This module is the only place that knows how wire types are materialised; adapters, the
negotiator and the kubelet emulators all go through :class:`WireApi`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.descriptor import MethodDescriptor, ServiceDescriptor
from google.protobuf.message import Message

GENERATED_PACKAGE = "api_versions._generated"


class WireDefinitionsMissing(RuntimeError):
    """The build-time descriptor sets are absent: the package was not built or installed."""


@dataclass(frozen=True)
class Method:
    """One RPC of a service, with everything gRPC needs to (de)serialise it."""

    path: str
    name: str
    request: type[Message]
    response: type[Message]
    server_streaming: bool
    client_streaming: bool


class WireApi:
    """Message classes and RPC metadata of one generation, e.g. ``WireApi.load("v1beta1")``."""

    def __init__(self, generation: str, file_set: descriptor_pb2.FileDescriptorSet) -> None:
        self.generation = generation
        self._pool = descriptor_pool.DescriptorPool()
        for file_proto in file_set.file:
            self._pool.Add(file_proto)
        if len(file_set.file) != 1:
            raise WireDefinitionsMissing(
                f"descriptor set of {generation} holds {len(file_set.file)} files, expected 1"
            )
        self._file = self._pool.FindFileByName(file_set.file[0].name)
        self.package = self._file.package

    @classmethod
    @functools.cache
    def load(cls, generation: str) -> WireApi:
        """Load (once per process) the descriptor set generated for ``generation``."""
        try:
            data = resources.files(GENERATED_PACKAGE).joinpath(f"{generation}.binpb").read_bytes()
        except (FileNotFoundError, ModuleNotFoundError) as exc:
            raise WireDefinitionsMissing(
                f"wire definitions for {generation!r} are not built; install the package "
                "(pip install . or pip install -e .) so protos/ is compiled"
            ) from exc
        file_set = descriptor_pb2.FileDescriptorSet.FromString(data)
        return cls(generation, file_set)

    def message(self, name: str) -> type[Message]:
        """The class of message ``name`` (unqualified, e.g. ``"AllocateResponse"``)."""
        descriptor = self._pool.FindMessageTypeByName(f"{self.package}.{name}")
        return message_factory.GetMessageClass(descriptor)

    def new(self, message_name: str, /, **fields: Any) -> Message:
        """An instance of ``message_name``; positional-only so a field may be called ``name``."""
        return self.message(message_name)(**fields)

    def service(self, name: str) -> ServiceDescriptor:
        return self._pool.FindServiceByName(f"{self.package}.{name}")

    def methods(self, service_name: str) -> dict[str, Method]:
        """Every RPC of ``service_name`` keyed by method name."""
        service = self.service(service_name)
        return {m.name: self._method(service, m) for m in service.methods}

    def method(self, service_name: str, method_name: str) -> Method:
        return self.methods(service_name)[method_name]

    def _method(self, service: ServiceDescriptor, method: MethodDescriptor) -> Method:
        return Method(
            path=f"/{service.full_name}/{method.name}",
            name=method.name,
            request=message_factory.GetMessageClass(method.input_type),
            response=message_factory.GetMessageClass(method.output_type),
            server_streaming=method.server_streaming,
            client_streaming=method.client_streaming,
        )


def rpc_handler(method: Method, behaviour: Callable[..., Any]) -> grpc.RpcMethodHandler:
    """Wrap an async servicer function as the gRPC handler for ``method``."""
    if method.client_streaming:
        raise NotImplementedError(f"{method.path}: client streaming is not used by any generation")
    make = (
        grpc.unary_stream_rpc_method_handler
        if method.server_streaming
        else grpc.unary_unary_rpc_method_handler
    )
    return make(
        behaviour,
        request_deserializer=method.request.FromString,
        response_serializer=method.response.SerializeToString,
    )


def client_call(channel: grpc.aio.Channel, method: Method) -> Any:
    """A callable for ``method`` on ``channel`` (unary-unary or unary-stream)."""
    factory = channel.unary_stream if method.server_streaming else channel.unary_unary
    return factory(
        method.path,
        request_serializer=method.request.SerializeToString,
        response_deserializer=method.response.FromString,
    )
