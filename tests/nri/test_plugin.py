"""The plugin session against a fake runtime on a unix socket: registration,
Configure, Synchronize and the container events through the handler, and a
runtime that breaks the protocol."""

from __future__ import annotations

import os
import socket
import threading

import pytest

from numa_agent.nri import nri_api_pb2 as api
from numa_agent.nri import plugin
from numa_agent.nri import ttrpc_wire_pb2 as wire
from tests.nri.fake_runtime import PLUGIN_CONN, FakeRuntime

UNIMPLEMENTED, DEADLINE_EXCEEDED = 12, 4


class EmptyHandler:
    """The test double: records the calls, answers empty adjustments."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []
        self.release = threading.Event()
        self.release.set()
        self.entered = threading.Event()
        self.synchronize_updates: list = []
        self.adjust: api.ContainerAdjustment | None = None

    def synchronize(self, pods, containers):
        self.calls.append(("synchronize", ([p.id for p in pods], [c.id for c in containers])))
        return self.synchronize_updates

    def create_container(self, request):
        self.calls.append(("create", request.container.id))
        self.entered.set()
        self.release.wait()
        return api.CreateContainerResponse(adjust=self.adjust)

    def update_container(self, request):
        self.calls.append(("update", request.container.id))
        return api.UpdateContainerResponse()

    def stop_container(self, request):
        self.calls.append(("stop", request.container.id))
        return api.StopContainerResponse()

    def state_change(self, event):
        self.calls.append((api.Event.Name(event.event), event.container.id or event.pod.id))

    def answer_lost(self, method):
        self.calls.append(("lost", method))


class Session:
    """A plugin session run in a thread against a fake runtime."""

    def __init__(self, tmp_path, handler) -> None:
        self.runtime = FakeRuntime(str(tmp_path / "nri.sock"))
        self.error: BaseException | None = None
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(self.runtime.path)
        self.session = plugin.PluginSession(sock, handler, "numa-agent", "05")
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        self.runtime.accept()

    def _run(self) -> None:
        try:
            self.session.run()
        except BaseException as e:
            self.error = e

    def finish(self) -> BaseException | None:
        self.runtime.close()
        self.thread.join(10)
        assert not self.thread.is_alive()
        return self.error


@pytest.fixture
def handler():
    return EmptyHandler()


@pytest.fixture
def running(tmp_path, handler):
    s = Session(tmp_path, handler)
    yield s
    handler.release.set()  # a failed test must not leave the worker stuck in the handler
    s.finish()


def _pod(i: str) -> api.PodSandbox:
    return api.PodSandbox(id=f"pod-{i}", name=f"p{i}", namespace="default", uid=f"uid-{i}")


def _container(i: str, pod: str = "1") -> api.Container:
    return api.Container(id=f"ctr-{i}", pod_sandbox_id=f"pod-{pod}", name=f"c{i}")


def _configure_and_sync(rt: FakeRuntime, containers=()) -> None:
    rt.expect_register()
    rt.call("Configure", api.ConfigureRequest(runtime_name="fake", runtime_version="1"), api.ConfigureResponse)
    rt.call("Synchronize", api.SynchronizeRequest(pods=[_pod("1")], containers=list(containers)),
            api.SynchronizeResponse)


def test_register_configure_synchronize_and_create_through_the_handler(running, handler):
    rt = running.runtime
    registered = rt.expect_register()
    assert (registered.plugin_name, registered.plugin_idx) == ("numa-agent", "05")

    code, _, configured = rt.call("Configure", api.ConfigureRequest(runtime_name="containerd", runtime_version="1.7"),
                                  api.ConfigureResponse)
    # RunPodSandbox 1, StopPodSandbox 2, RemovePodSandbox 3, CreateContainer 4, UpdateContainer 8,
    # StopContainer 10, RemoveContainer 11: bit (event - 1) each.
    assert code == 0 and configured.events == 0b110_1000_1111

    handler.synchronize_updates = [api.ContainerUpdate(container_id="ctr-0")]
    code, _, synced = rt.call("Synchronize", api.SynchronizeRequest(pods=[_pod("1")], containers=[_container("0")]),
                              api.SynchronizeResponse)
    assert code == 0 and [u.container_id for u in synced.update] == ["ctr-0"]

    handler.adjust = api.ContainerAdjustment(linux=api.LinuxContainerAdjustment(
        resources=api.LinuxResources(cpu=api.LinuxCPU(cpus="1", mems="0"))))
    code, _, created = rt.call("CreateContainer", api.CreateContainerRequest(pod=_pod("1"), container=_container("1")),
                               api.CreateContainerResponse)
    assert code == 0 and created.adjust.linux.resources.cpu.cpus == "1"
    assert handler.calls == [("synchronize", (["pod-1"], ["ctr-0"])), ("create", "ctr-1")]
    assert running.session.runtime == "containerd 1.7"


def test_a_message_larger_than_4096_bytes_goes_in_4096_byte_frames_both_ways(running, handler):
    rt = running.runtime
    rt.expect_register()
    many = [_container(str(i)) for i in range(300)]  # about 9 kB
    handler.synchronize_updates = [api.ContainerUpdate(container_id=f"{c.id}-{'x' * 40}") for c in many]
    code, _, synced = rt.call("Synchronize", api.SynchronizeRequest(pods=[_pod("1")], containers=many),
                              api.SynchronizeResponse)
    assert code == 0 and len(synced.update) == 300
    assert handler.calls[0][1][1] == [c.id for c in many]  # reassembled from the runtime's 4096-byte frames
    assert max(rt.frame_sizes) == 4096 and all(size <= 4096 for size in rt.frame_sizes)


def test_an_unknown_method_is_unimplemented_and_the_session_goes_on(running):
    rt = running.runtime
    rt.expect_register()
    code, message, _ = rt.call("PostStartContainer", api.Empty())
    assert code == UNIMPLEMENTED and "PostStartContainer" in message
    code, _, _ = rt.call("Configure", api.ConfigureRequest(), service="some.other.Service")
    assert code == UNIMPLEMENTED
    assert rt.call("Configure", api.ConfigureRequest(), api.ConfigureResponse)[0] == 0


def test_events_for_containers_never_announced_do_not_reach_the_handler(running, handler):
    rt = running.runtime
    _configure_and_sync(rt, [_container("0")])
    code, message, _ = rt.call("UpdateContainer", api.UpdateContainerRequest(pod=_pod("1"), container=_container("9")))
    assert code != 0 and "ctr-9 was never announced" in message and "\n" not in message
    assert rt.call("StopContainer", api.StopContainerRequest(pod=_pod("1"), container=_container("9")))[0] == 0
    assert rt.call("StateChange", api.StateChangeEvent(event=api.REMOVE_CONTAINER, pod=_pod("1"),
                                                        container=_container("9")))[0] == 0
    # announced ones do, and a removed one is forgotten
    assert rt.call("StopContainer", api.StopContainerRequest(pod=_pod("1"), container=_container("0")))[0] == 0
    assert rt.call("StateChange", api.StateChangeEvent(event=api.REMOVE_CONTAINER, pod=_pod("1"),
                                                        container=_container("0")))[0] == 0
    assert rt.call("UpdateContainer", api.UpdateContainerRequest(pod=_pod("1"), container=_container("0")))[0] != 0
    assert rt.call("StateChange", api.StateChangeEvent(event=api.REMOVE_POD_SANDBOX, pod=_pod("1")))[0] == 0
    assert handler.calls[1:] == [("stop", "ctr-0"), ("REMOVE_CONTAINER", "ctr-0"), ("REMOVE_POD_SANDBOX", "pod-1")]


def test_a_failing_handler_answers_one_line_and_the_session_goes_on(running, handler):
    rt = running.runtime
    _configure_and_sync(rt)

    def refuse(request):
        raise plugin.NriRefusal("TopologyAffinityError: no NUMA node\nfits")

    handler.create_container = refuse
    code, message, _ = rt.call("CreateContainer", api.CreateContainerRequest(pod=_pod("1"), container=_container("1")))
    assert code != 0 and message == "TopologyAffinityError: no NUMA node fits"

    def crash(request):
        raise KeyError("boom")

    handler.create_container = crash
    code, message, _ = rt.call("CreateContainer", api.CreateContainerRequest(pod=_pod("1"), container=_container("2")))
    assert code != 0 and "KeyError" in message and "\n" not in message
    assert rt.call("Configure", api.ConfigureRequest(), api.ConfigureResponse)[0] == 0


def test_a_slow_handler_never_blocks_the_read_loop_and_is_answered_in_time(running, handler):
    rt = running.runtime
    _configure_and_sync(rt)
    handler.release.clear()
    slow = rt.send_call("CreateContainer", api.CreateContainerRequest(pod=_pod("1"), container=_container("1")),
                        timeout_nano=300_000_000)
    assert handler.entered.wait(10)
    # the handler is stuck: a call that needs none is still read and answered, and the stuck
    # call is answered before its time is up, without the handler (in either order)
    configure = rt.send_call("Configure", api.ConfigureRequest())
    answers = rt.read_answers(2)
    assert answers[configure].status.code == 0
    assert answers[slow].status.code == DEADLINE_EXCEEDED and "CreateContainer" in answers[slow].status.message
    handler.release.set()  # its late answer is dropped, not sent a second time
    assert rt.call("StopContainer", api.StopContainerRequest(pod=_pod("1"), container=_container("1")))[0] == 0


def test_garbage_in_a_request_is_answered_invalid_and_the_session_goes_on(running):
    rt = running.runtime
    rt.expect_register()
    rt.send_ttrpc(PLUGIN_CONN, 1, 1, b"\xff\xff\xff\xff")
    answer = rt.read_answer(1)
    assert answer.status.code == 3 and "\n" not in answer.status.message
    code, _, _ = rt.call("CreateContainer", api.Empty(), service="nri.pkg.api.v1alpha1.Plugin")
    assert code == 0  # an empty payload is an empty CreateContainerRequest: the handler decides
    rt.send_mux(7, b"for nobody")  # a connection nobody opened: dropped
    assert rt.call("Configure", api.ConfigureRequest(), api.ConfigureResponse)[0] == 0
    assert running.session.dropped_frames == 1


@pytest.mark.parametrize(("garbage", "says"), [
    (b"\x00\x00\x00\x01\xff\xff\xff\xff", "multiplexer frame of 4294967295 bytes, over the limit"),
    (b"\x00\x00\x00\x01\x00\x00\x00\x0a" + b"\x00\x50\x00\x01\x00\x00\x00\x01\x01\x00",
     "ttrpc message of 5242881 bytes, over the limit"),
    (b"\x00\x00\x00\x01\x00\x00\x00\x10abc", "in the middle of a multiplexer frame"),
    (b"\x00\x00\x00\x01\x00\x00\x00\x0c" + b"\x00\x00\x00\x09\x00\x00\x00\x01\x01\x00ab",
     "in the middle of a ttrpc message"),
])
def test_a_runtime_that_breaks_the_framing_ends_the_session_with_one_line(tmp_path, handler, garbage, says):
    s = Session(tmp_path, handler)
    s.runtime.expect_register()
    s.runtime.send_raw(garbage)
    if "middle" in says:
        s.runtime.conn.shutdown(socket.SHUT_WR)
    error = s.finish()
    assert isinstance(error, plugin.NriError) and says in str(error) and "\n" not in str(error)


def test_a_runtime_that_closes_before_answering_the_registration(tmp_path, handler):
    s = Session(tmp_path, handler)
    s.runtime.conn.close()
    error = s.finish()
    assert isinstance(error, plugin.NriError) and "RegisterPlugin" in str(error)


def test_the_plugin_index_is_two_digits():
    for bad in ("5", "100", "a1", "٠١"):
        with pytest.raises(plugin.NriError, match="two digits"):
            plugin.check_index(bad)
    assert plugin.check_index("00") == "00"


# --- the socket


def test_a_missing_socket_is_one_clear_line(tmp_path):
    with pytest.raises(plugin.NriError) as e:
        plugin.connect(str(tmp_path / "nri.sock"))
    assert str(e.value).startswith(f"NRI socket {tmp_path}/nri.sock does not exist") and "\n" not in str(e.value)
    with pytest.raises(plugin.NriError, match="does not exist"):
        plugin.connect(str(tmp_path / "no-such-dir" / "nri.sock"))


def test_a_socket_in_a_directory_others_can_write_is_refused(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    FakeRuntime(str(shared / "nri.sock"))
    shared.chmod(0o777)
    with pytest.raises(plugin.NriError) as e:
        plugin.connect(str(shared / "nri.sock"))
    assert "refused" in str(e.value) and "writable by its group or by others" in str(e.value)
    assert "\n" not in str(e.value)


@pytest.mark.skipif(os.geteuid() != 0, reason="giving the socket to another user needs root")
def test_a_socket_owned_by_another_user_is_refused(tmp_path):
    rt = FakeRuntime(str(tmp_path / "nri.sock"))
    os.chown(rt.path, 65534, 65534)
    with pytest.raises(plugin.NriError) as e:
        plugin.connect(rt.path)
    assert "owned by uid 65534" in str(e.value) and "\n" not in str(e.value)


def test_a_trusted_socket_connects(tmp_path):
    rt = FakeRuntime(str(tmp_path / "nri.sock"))
    sock = plugin.connect(rt.path)
    rt.accept()
    sock.sendall(b"x")
    assert rt.conn.recv(1) == b"x"
    sock.close()
    rt.close()


def test_unsolicited_updates_go_to_the_runtime_on_the_plugins_connection(running):
    rt = running.runtime
    rt.expect_register()
    result: list = []
    caller = threading.Thread(target=lambda: result.append(running.session.update_containers(
        [api.ContainerUpdate(container_id="ctr-1")])))
    caller.start()
    m = rt.read_message()
    assert (m.conn, m.type, m.stream_id) == (2, 1, 3)  # odd and after RegisterPlugin's 1
    request = wire.Request.FromString(m.payload)
    assert (request.service, request.method) == ("nri.pkg.api.v1alpha1.Runtime", "UpdateContainers")
    assert [u.container_id for u in api.UpdateContainersRequest.FromString(request.payload).update] == ["ctr-1"]
    rt.send_ttrpc(2, 3, 2, wire.Response(payload=api.UpdateContainersResponse(
        failed=[api.ContainerUpdate(container_id="ctr-1")]).SerializeToString()).SerializeToString())
    caller.join(10)
    assert [u.container_id for u in result[0].failed] == ["ctr-1"]
