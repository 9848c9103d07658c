"""The KServe V2 gRPC messages (``grpc_service.proto``).

``grpc_service_pb2`` is generated from the .proto when the package is built (CMakeLists.txt runs
``grpc_tools.protoc``) and installed beside this file; it is never committed. Rebuild after editing
the .proto: ``pip install --no-build-isolation -e .``.
"""
