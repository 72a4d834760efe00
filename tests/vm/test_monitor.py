"""The guest's requests to QEMU's monitor through the job folder, against a
QMP server played by a thread (greeting, capabilities, an event in between)."""

import json
import socket
import threading

from vmharness.monitor import REPLY, REQUEST, SOCKET, ask, qmp_run, serve_request


class FakeQmp:
    """Answers like QEMU 7.2: a greeting, then one reply per command; after a
    device_add an ACPI event comes before the reply."""

    def __init__(self, path):
        self.commands = []
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(str(path))
        self.server.listen(1)
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self):
        conn, _ = self.server.accept()
        with conn, conn.makefile("rw", encoding="utf-8") as f:
            f.write(json.dumps({"QMP": {"version": {"qemu": {"major": 7}}, "capabilities": []}}) + "\n")
            f.flush()
            for line in f:
                command = json.loads(line)
                self.commands.append(command)
                if command["execute"] == "device_add":
                    f.write(json.dumps({"event": "ACPI_DEVICE_OST", "data": {}}) + "\n")
                if command["execute"] == "bad":
                    f.write(json.dumps({"error": {"class": "GenericError", "desc": "no"}}) + "\n")
                else:
                    f.write(json.dumps({"return": {}}) + "\n")
                f.flush()

    def close(self):
        self.server.close()


DIMM = [{"execute": "object-add", "arguments": {"qom-type": "memory-backend-ram", "id": "m", "size": 1 << 28}},
        {"execute": "device_add", "arguments": {"driver": "pc-dimm", "id": "d", "memdev": "m", "node": 1}}]


def test_qmp_commands_run_in_order_after_the_capabilities_and_events_are_skipped(tmp_path):
    qmp = FakeQmp(tmp_path / SOCKET)
    try:
        assert qmp_run(tmp_path / SOCKET, [*DIMM, {"execute": "bad"}]) == [
            {"return": {}}, {"return": {}}, {"error": {"class": "GenericError", "desc": "no"}}]
        assert [c["execute"] for c in qmp.commands] == ["qmp_capabilities", "object-add", "device_add", "bad"]
    finally:
        qmp.close()


def test_a_guest_request_is_answered_through_the_job_folder(tmp_path):
    qmp = FakeQmp(tmp_path / SOCKET)
    answered = []

    def host():  # the boot loop's side, until it has answered once
        while not serve_request(tmp_path):
            pass
        answered.append(True)

    t = threading.Thread(target=host, daemon=True)
    t.start()
    try:
        assert ask(tmp_path, DIMM, timeout=30) == [{"return": {}}, {"return": {}}]
        t.join(5)
        assert answered and not (tmp_path / REQUEST).exists() and not (tmp_path / REPLY).exists()
        assert qmp.commands[2]["arguments"]["node"] == 1
    finally:
        qmp.close()


def test_no_monitor_is_an_error_reply_not_a_hang(tmp_path):
    (tmp_path / REQUEST).write_text(json.dumps(DIMM))
    assert serve_request(tmp_path)
    reply = json.loads((tmp_path / REPLY).read_text())
    assert reply[0]["error"]["class"] == "HarnessError" and "cannot connect" in reply[0]["error"]["desc"]
    assert not serve_request(tmp_path)  # nothing pending any more
