"""The snapshot fixture extracts a snapshot when it is first asked for, and only that one."""

from tests.conftest import SNAPSHOT_NAMES, Snapshots


def test_only_the_snapshot_asked_for_is_extracted(tmp_path):
    snapshots = Snapshots(tmp_path)
    assert list(tmp_path.iterdir()) == []
    name = SNAPSHOT_NAMES[0]
    root = snapshots.root(name)
    assert [p.name for p in tmp_path.iterdir()] == [name]
    assert (root / "EXPECTED.json").is_file() and (root / "sys" / "devices").is_dir()


def test_a_second_ask_reuses_the_extracted_tree(tmp_path):
    snapshots = Snapshots(tmp_path)
    name = SNAPSHOT_NAMES[-1]
    marker = snapshots.root(name) / "written-by-this-test"
    marker.write_text("kept")
    assert (snapshots.root(name) / "written-by-this-test").read_text() == "kept"

