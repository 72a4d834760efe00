"""`numa-agent pod-resources`: a PodResources v1 client (the project's
generated stubs), for checking by hand what node tools read."""

from __future__ import annotations

import argparse
import os

from numa_agent.cli import common

PROG = "numa-agent pod-resources"
SOCKET_ENV = "NUMA_AGENT_POD_RESOURCES_SOCKET"


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "pod-resources", help="ask the PodResources v1 gRPC service (List, Get, GetAllocatableResources)",
        description="Call the agent's PodResources v1 service as the kubelet's clients do and print the "
                    "answer as JSON (proto field names).")
    parser.add_argument("call", choices=("list", "get", "allocatable"),
                        help="list: every pod; get: one pod; allocatable: what the node can hand out")
    parser.add_argument("pod", nargs="?", help="the pod (get only)")
    parser.add_argument("--namespace", default="numa-agent", help="the pod's namespace (get; default %(default)s)")
    parser.add_argument("--pod-resources-socket", metavar="PATH", default=None,
                        help=f"the service's socket (default: ${SOCKET_ENV}, else pod-resources.sock beside the "
                             "API socket)")
    common.add_socket_option(parser)
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    if (args.call == "get") != (args.pod is not None):
        common.print_error(PROG, "get takes a pod name; list and allocatable take none")
        return 2
    import grpc
    from google.protobuf.json_format import MessageToDict

    from numa_agent.daemon.config import POD_RESOURCES_SOCKET_NAME
    from numa_agent.kubelet import podresources_pb2 as pb
    from numa_agent.kubelet import podresources_pb2_grpc as pb_grpc

    path = args.pod_resources_socket or os.environ.get(SOCKET_ENV) or \
        os.path.join(os.path.dirname(common.resolve_socket(args)), POD_RESOURCES_SOCKET_NAME)
    try:
        with grpc.insecure_channel(f"unix:{os.path.abspath(path)}") as channel:
            stub = pb_grpc.PodResourcesListerStub(channel)
            if args.call == "list":
                answer = stub.List(pb.ListPodResourcesRequest(), timeout=10)
            elif args.call == "allocatable":
                answer = stub.GetAllocatableResources(pb.AllocatableResourcesRequest(), timeout=10)
            else:
                answer = stub.Get(pb.GetPodResourcesRequest(pod_name=args.pod, pod_namespace=args.namespace),
                                  timeout=10)
    except grpc.RpcError as exc:
        common.print_error(PROG, f"{path}: {exc.code().name}: {exc.details()}")
        return 1
    # Zeros printed too: NUMA node 0 is an ID of 0, which proto3 JSON would leave out.
    common.print_json(MessageToDict(answer, preserving_proto_field_name=True,
                                    always_print_fields_with_no_presence=True))
    return 0
