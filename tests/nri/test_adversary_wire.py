"""The plugin session against a runtime that misbehaves: answers too large for
ttrpc, floods of calls, calls after Shutdown. Each test names what the
session must survive; the fake runtime (fake_runtime.py) speaks the wire."""

from __future__ import annotations

import os
import threading

import pytest

from numa_agent.nri import nri_api_pb2 as api
from numa_agent.nri import plugin, ttrpc
from tests.nri.fake_runtime import FakeRuntime
from tests.nri.test_plugin import EmptyHandler, Session, _configure_and_sync, _container, _pod


class HugeAnswer(EmptyHandler):
    """Answers CreateContainer for `huge` with more updates than a ttrpc message holds."""

    huge = "ctr-huge"

    def create_container(self, request):
        response = super().create_container(request)
        if request.container.id == self.huge:
            response.update.extend(api.ContainerUpdate(container_id=f"{i:08d}" + "x" * 1000)
                                   for i in range(5000))  # about 5 MB, over ttrpc's 4 MiB
        return response


def test_an_answer_over_ttrpcs_limit_is_an_error_and_the_session_goes_on(tmp_path):
    handler = HugeAnswer()
    s = Session(tmp_path, handler)
    try:
        rt = s.runtime
        _configure_and_sync(rt)
        code, message, _ = rt.call("CreateContainer", api.CreateContainerRequest(
            pod=_pod("1"), container=_container("huge")), api.CreateContainerResponse)
        assert code == ttrpc.RESOURCE_EXHAUSTED and "4 MiB" in message and "\n" not in message
        # The worker that answers the handler's calls still runs: the next call is the handler's.
        code, _, created = rt.call("CreateContainer", api.CreateContainerRequest(
            pod=_pod("1"), container=_container("2")), api.CreateContainerResponse)
        assert code == 0 and created is not None
        assert handler.calls[-1] == ("create", "ctr-2")
    finally:
        assert s.finish() is None


def test_a_flood_of_calls_is_refused_past_a_bound_and_holds_no_thread_each(tmp_path):
    handler = EmptyHandler()
    handler.release.clear()  # the handler blocks on the first call: every other one waits
    s = Session(tmp_path, handler)
    try:
        rt = s.runtime
        _configure_and_sync(rt)
        before = threading.active_count()
        sent = [rt.send_call("CreateContainer", api.CreateContainerRequest(pod=_pod("1"), container=_container(str(i))),
                             timeout_nano=600 * 10**9) for i in range(plugin.QUEUED_MAX + 200)]
        # Those past the bound are answered at once, without the handler.
        refused = rt.read_answers(200)
        assert set(refused) <= set(sent)
        assert {a.status.code for a in refused.values()} == {ttrpc.RESOURCE_EXHAUSTED}
        # Each waiting call holds no thread of its own (a deadline each would be one).
        assert threading.active_count() - before <= 2
        handler.release.set()
        answered = rt.read_answers(plugin.QUEUED_MAX)
        assert {a.status.code for a in answered.values()} == {0}
        assert set(answered) | set(refused) == set(sent)
    finally:
        handler.release.set()
        assert s.finish() is None


def test_an_unknown_method_of_ttrpcs_whole_size_is_unimplemented_and_the_session_goes_on(tmp_path):
    s = Session(tmp_path, EmptyHandler())
    try:
        rt = s.runtime
        _configure_and_sync(rt)
        method = "M" * (ttrpc.MESSAGE_LENGTH_MAX - 50)  # the request fits; echoed whole, its answer would not
        code, message, _ = rt.call(method, api.Empty())
        assert code == ttrpc.UNIMPLEMENTED and len(message) < 300
        code, _, _ = rt.call("StopContainer", api.StopContainerRequest(pod=_pod("1"), container=_container("9")))
        assert code == 0
    finally:
        assert s.finish() is None


def test_a_creation_granted_after_its_time_is_released(tmp_path):
    handler = EmptyHandler()
    s = Session(tmp_path, handler)
    try:
        rt = s.runtime
        _configure_and_sync(rt)
        handler.release.clear()
        late = rt.send_call("CreateContainer", api.CreateContainerRequest(pod=_pod("1"), container=_container("1")),
                            timeout_nano=100_000_000)
        assert handler.entered.wait(10)
        assert rt.read_answer(late).status.code == ttrpc.DEADLINE_EXCEEDED  # the runtime fails the creation
        handler.release.set()  # the handler grants it after all: its answer is dropped
        # The calls are handled in order: by this one's answer, the late grant was undone.
        assert rt.call("StopContainer", api.StopContainerRequest(pod=_pod("1"), container=_container("2")))[0] == 0
        assert handler.calls[-2:] == [("create", "ctr-1"), ("stop", "ctr-1")]
    finally:
        handler.release.set()
        assert s.finish() is None


class SlowUpdate(EmptyHandler):
    def update_container(self, request):
        response = super().update_container(request)
        self.entered.set()
        self.release.wait()
        return response


def test_the_handler_is_told_of_an_answer_the_runtime_never_got(tmp_path):
    handler = SlowUpdate()
    s = Session(tmp_path, handler)
    try:
        rt = s.runtime
        _configure_and_sync(rt, [_container("1")])
        handler.release.clear()
        late = rt.send_call("UpdateContainer", api.UpdateContainerRequest(pod=_pod("1"), container=_container("1")),
                            timeout_nano=100_000_000)
        assert handler.entered.wait(10)
        assert rt.read_answer(late).status.code == ttrpc.DEADLINE_EXCEEDED
        handler.release.set()
        assert rt.call("StopContainer", api.StopContainerRequest(pod=_pod("1"), container=_container("2")))[0] == 0
        assert handler.calls[-2:] == [("update", "ctr-1"), ("lost", "UpdateContainer")]
    finally:
        handler.release.set()
        assert s.finish() is None


def test_a_runtimes_name_is_kept_short_for_health_and_status(tmp_path):
    s = Session(tmp_path, EmptyHandler())
    try:
        rt = s.runtime
        rt.expect_register()
        code, _, _ = rt.call("Configure", api.ConfigureRequest(runtime_name="containerd" * 100_000,
                                                               runtime_version="\x1b]0;v\x07"), api.ConfigureResponse)
        assert code == 0 and s.session.runtime.startswith("containerd") and len(s.session.runtime) <= 200
    finally:
        assert s.finish() is None


def test_a_symlink_at_the_sockets_name_is_refused_even_to_a_trusted_socket(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    rt = FakeRuntime(str(elsewhere / "nri.sock"))
    (tmp_path / "nri").mkdir()
    (tmp_path / "nri" / "nri.sock").symlink_to(rt.path)
    try:
        with pytest.raises(plugin.NriError, match="is not a socket"):
            plugin.connect(str(tmp_path / "nri" / "nri.sock"))
    finally:
        rt.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a directory to another user needs root")
def test_a_directory_another_user_owns_on_the_path_is_refused(tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    rt = FakeRuntime(str(theirs / "nri.sock"))
    os.chown(theirs, 65534, 65534)
    (tmp_path / "nri").symlink_to(theirs)  # a link root made, to a directory a user owns
    try:
        for path in (rt.path, str(tmp_path / "nri" / "nri.sock")):
            with pytest.raises(plugin.NriError, match="refused"):
                plugin.connect(path)
    finally:
        rt.close()


class AnswersNothing(EmptyHandler):
    def create_container(self, request):
        super().create_container(request)
        return None  # a handler's bug: no answer at all


def test_a_handler_that_answers_nothing_is_an_internal_error_and_the_session_goes_on(tmp_path):
    handler = AnswersNothing()
    s = Session(tmp_path, handler)
    try:
        rt = s.runtime
        _configure_and_sync(rt)
        code, message, _ = rt.call("CreateContainer", api.CreateContainerRequest(pod=_pod("1"),
                                                                                 container=_container("1")))
        assert code == ttrpc.INTERNAL and "\n" not in message
        code, _, _ = rt.call("CreateContainer", api.CreateContainerRequest(pod=_pod("1"), container=_container("2")))
        assert code == ttrpc.INTERNAL and handler.calls[-1] == ("create", "ctr-2")  # the worker still runs
    finally:
        assert s.finish() is None
