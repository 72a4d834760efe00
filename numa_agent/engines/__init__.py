"""Container engines (podman, CRI-O): their annotations and the OCI hook."""
