from engine.namespace import ROOT


def test_mkdir_visible_in_readdir(namespace):
    namespace.mkdir(ROOT, namespace.root_ino, "d")
    entries, eof = namespace.readdir(ROOT, namespace.root_ino)
    assert eof and [e.name for e in entries] == ["d"]
