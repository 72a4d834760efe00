"""The API's fake service behind a real ApiServer: the same fixtures as tests/api."""

from tests.api.conftest import fake, server, sock_dir  # noqa: F401  (pytest fixtures)
