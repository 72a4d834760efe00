"""A CRI v1 client for the containerd guest (tests/vm_e2e/containerd_scenarios.py): the
vendored kubernetes/cri-api proto (cri_api.proto, its licence in LICENSE-cri-api), the
modules grpcio-tools makes of it, and client.py, which asks as the kubelet does."""
