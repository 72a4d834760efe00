"""End-to-end scenarios that run inside the QEMU guest (see README.md)."""
