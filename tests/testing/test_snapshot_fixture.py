"""The snapshot fixture extracts a snapshot when it is first asked for, and only that one."""

import pytest

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



def _tree(root):
    """Every path below root: a symlink's target, a file's bytes, or a directory."""
    out = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        out[rel] = (("link", str(path.readlink())) if path.is_symlink()
                    else ("file", path.read_bytes()) if path.is_file() else ("dir", None))
    return out


def test_the_system_tar_and_tarfile_make_the_same_tree(tmp_path, monkeypatch):
    import tests.conftest as conftest

    if conftest._TAR is None:
        pytest.skip("no system tar: tarfile is the only way, checked by the tests above")
    name = "intel-snb-2s-2numa-pci-nvme-nic"  # symlinks, PCI devices, NUL bytes
    (tmp_path / "tar").mkdir()
    (tmp_path / "tarfile").mkdir()
    by_tar = Snapshots(tmp_path / "tar").root(name)
    monkeypatch.setattr(conftest, "_TAR", None)
    by_tarfile = Snapshots(tmp_path / "tarfile").root(name)
    tree = _tree(by_tar)
    assert len(tree) > 1000 and tree == _tree(by_tarfile)
