"""Trust nothing that enters (issue 31): pinned artifacts, atomic writes, one-line failures.

Families, one test (or more) each:

* pins: the record ``g2c/assets/pins.json`` is fresh; a hostile mirror whose ``StoryLM-1M``
  folder holds StoryLM-5M (self-consistent manifest) is refused and nothing is installed; a
  huge (sparse) file is refused by its size without being hashed; ``load_model`` checks the
  pins; ``--train`` writes the new pin and says so; ``--pin`` re-pins on purpose.
* atomic writes: a full disk (``OSError(ENOSPC)`` injected into the write, no root needed) or
  Ctrl-C (``KeyboardInterrupt`` injected mid-write) leaves the previous file and no temporary,
  for datasets, token caches, artifacts, GGUF files and trainer checkpoints; leftovers of a
  killed run (``*.tmp``, ``.tmp-*`` folders, a dangling ``<Name>.old`` link) are cleaned and
  reported; a truncated notebook working copy is backed up, never handed to Jupyter.
* say what happened: a read-only checkout (simulated: the tests run as root, which ignores
  permission bits, so ``os.access`` / the write is patched to fail with EROFS/EACCES) is named as
  such, never "no source to restore it from"; ``--train`` checks writability before training;
  a truncated GGUF is a ValueError, not an IndexError; a bad ``G2C_APPLY_SOLUTIONS`` is one line
  and exit 1; ``bench/roofline.py`` prints the context it measured at.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from g2c.assets import artifacts, checkpoints
from g2c.assets.artifacts import ChecksumError, artifact_dir, verify_artifact, write_artifact
from g2c.course import REPO_ROOT


def _enospc(path="x"):
    return OSError(errno.ENOSPC, "No space left on device", str(path))


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in Path(folder).rglob("*") if "tmp" in p.name or p.name.endswith(".old"))


# -- pins ---------------------------------------------------------------------------------------

def test_pinned_record_is_fresh():
    """The tooling check: pins.json is exactly what the shipped artifacts generate."""
    from g2c.assets.artifacts import PINS_FILE, load_pins, pins_from_tree

    fresh = pins_from_tree()
    assert set(fresh) == set(checkpoints.all_names()), "every shipped artifact is pinned"
    stale = sorted(n for n in fresh if load_pins().get(n) != fresh[n])
    assert not stale, (f"{PINS_FILE} is stale for {', '.join(stale)}: restore the artifacts with ./checkpoints.sh "
                       f"--force, or, if you replaced them on purpose, run ./checkpoints.sh --pin {' '.join(stale)}")


def test_mirror_holding_storylm_5m_as_storylm_1m_is_refused(capsys, tmp_path):
    """Family 3: the mirror's manifest matches its files, but they are not the pinned StoryLM-1M."""
    mirror, root = tmp_path / "mirror", tmp_path / "root"
    shutil.copytree(artifact_dir("StoryLM-5M"), artifact_dir("StoryLM-1M", mirror))
    verify_artifact("StoryLM-1M", mirror)            # self-consistent: a check against its own manifest passes it
    rc = checkpoints.main(["storylm-1m", "--root", str(root), "--from", str(mirror)])
    out, err = capsys.readouterr()
    assert rc == 1
    pinned = artifacts.load_pins()["StoryLM-1M"]["config.json"]["sha256"]
    theirs = json.loads((artifact_dir("StoryLM-1M", mirror) / "manifest.json").read_text())["files"]
    assert "config.json is not the pinned StoryLM-1M/config.json" in err
    assert pinned in err and theirs["config.json"] in err
    assert "./checkpoints.sh --force" in err and "Traceback" not in err
    assert not artifact_dir("StoryLM-1M", root).exists()


def test_a_huge_file_is_refused_by_its_size_before_hashing(tmp_path, monkeypatch):
    """An 8 GB sparse file under a shipped name fails at once: sizes are compared before any hash."""
    mirror = tmp_path / "mirror"
    shutil.copytree(artifact_dir("StoryLM-1M"), artifact_dir("StoryLM-1M", mirror))
    big = artifact_dir("StoryLM-1M", mirror) / "model.safetensors"
    os.truncate(big, 8 * 10**9)                                        # sparse: no disk used

    def no_hashing(path):
        raise AssertionError(f"hashed {path}")

    monkeypatch.setattr(artifacts, "sha256_file", no_hashing)
    with pytest.raises(ChecksumError, match=r"has 8,000,000,000 bytes, the pinned StoryLM-1M/model\.safetensors "
                                            r"has 2,705,328 .*not hashed"):
        checkpoints.install_from_dir("StoryLM-1M", mirror, root=tmp_path / "root")


def test_load_model_checks_the_pins(monkeypatch, tmp_path):
    """The expected hash lives with the loader: a pin that differs refuses the shipped file."""
    pins = json.loads(artifacts.PINS_FILE.read_text())
    pins["artifacts"]["StoryLM-1M"]["config.json"]["sha256"] = "0" * 64
    fake = tmp_path / "pins.json"
    fake.write_text(json.dumps(pins))
    monkeypatch.setattr(artifacts, "PINS_FILE", fake)
    with pytest.raises(ChecksumError, match=r"config\.json is not the pinned StoryLM-1M/config\.json: .*pins "
                                            r"sha256 0{64}.*manifest says [0-9a-f]{64}; "
                                            r"run \./checkpoints\.sh --force"):
        artifacts.load_model("StoryLM-1M", device="cpu")


def test_pin_command_repins_on_purpose_and_says_so(capsys, tmp_path, monkeypatch):
    pins = json.loads(artifacts.PINS_FILE.read_text())
    good = pins["artifacts"]["StoryLM-1M"]
    pins["artifacts"]["StoryLM-1M"] = {"model.safetensors": {"sha256": "1" * 64, "size": 1}}
    fake = tmp_path / "pins.json"
    fake.write_text(json.dumps(pins))
    monkeypatch.setattr(artifacts, "PINS_FILE", fake)
    assert not artifacts.is_verified("StoryLM-1M")
    assert checkpoints.main(["--pin", "StoryLM-1M"]) == 0
    out = capsys.readouterr().out
    assert "StoryLM-1M           pinned (changed)" in out and f"commit {fake} together with" in out
    assert json.loads(fake.read_text())["artifacts"]["StoryLM-1M"] == good
    assert artifacts.is_verified("StoryLM-1M")


@pytest.fixture
def fake_shipped(tmp_path, monkeypatch):
    """artifacts/ and pins.json moved to tmp: what --train writes lands there."""
    root = tmp_path / "artifacts"
    shutil.copytree(artifact_dir("StoryTokenizer"), artifact_dir("StoryTokenizer", root))
    pins = tmp_path / "pins.json"
    shutil.copyfile(artifacts.PINS_FILE, pins)
    monkeypatch.setattr(artifacts, "ARTIFACTS_DIR", root)
    monkeypatch.setattr(checkpoints, "ARTIFACTS_DIR", root)
    monkeypatch.setattr(artifacts, "PINS_FILE", pins)
    monkeypatch.setattr(checkpoints, "_solutions_applied", lambda: True)
    return root


def test_train_writes_the_new_pin_in_the_same_command(capsys, fake_shipped, monkeypatch):
    from g2c.assets.recipes import ladder

    def train_model(name, force):
        write_artifact(name, {"model.safetensors": b"retrained", "config.json": b"{}"},
                       {"name": name, "kind": "model", "val_loss": 3.0}, force=True)

    monkeypatch.setattr(ladder, "train_model", train_model)
    assert checkpoints.main(["--train", "StoryLM-1M"]) == 0
    out = capsys.readouterr().out
    assert "StoryLM-1M           OK" in out
    assert "pinned the new StoryLM-1M in" in out and "commit it with" in out
    pin = json.loads(artifacts.PINS_FILE.read_text())["artifacts"]["StoryLM-1M"]["model.safetensors"]
    assert pin == {"sha256": artifacts.sha256_file(artifact_dir("StoryLM-1M") / "model.safetensors"), "size": 9}
    verify_artifact("StoryLM-1M")                                       # the shipped root checks the new pin


def test_train_checks_writability_before_training(capsys, fake_shipped, monkeypatch):
    """A read-only checkout: one line naming the folder, before minutes of training (root ignores
    permission bits, so os.access is patched to say what a read-only mount would)."""
    from g2c.assets.recipes import ladder

    def never(*args, **kwargs):
        raise AssertionError("trained although nothing could be saved")

    real_access = os.access
    monkeypatch.setattr(ladder, "train_model", never)
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: Path(p) != fake_shipped and real_access(p, mode, **kw))
    assert checkpoints.main(["--train", "StoryLM-1M", "--force"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"cannot write the artifacts folder {fake_shipped}" in err
    assert "nothing was trained" in err and "Traceback" not in err


# -- read-only checkout, leftovers ---------------------------------------------------------------

@pytest.fixture
def git_shipped(tmp_path, monkeypatch):
    """A git clone whose artifacts/ holds the real StoryLM-1M, committed."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    repo = tmp_path / "clone"
    root = repo / "artifacts"
    shutil.copytree(artifact_dir("StoryLM-1M"), artifact_dir("StoryLM-1M", root))
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run(git + ["init", "-q"], check=True)
    subprocess.run(git + ["add", "artifacts"], check=True)
    subprocess.run(git + ["commit", "-q", "-m", "artifacts"], check=True)
    return root


def test_read_only_checkout_is_named_not_no_source(capsys, git_shipped, monkeypatch):
    """Family: git holds the copy but the folder cannot be written (EROFS injected, as root)."""
    (artifact_dir("StoryLM-1M", git_shipped) / "model.safetensors").write_bytes(b"damaged")

    real = artifacts.tempfile.mkdtemp

    def read_only(*args, **kwargs):                 # write_artifact's staging folder beside the artifact
        if Path(kwargs.get("dir") or "/nowhere").is_relative_to(git_shipped):
            raise OSError(errno.EROFS, "Read-only file system", str(kwargs["dir"]))
        return real(*args, **kwargs)

    monkeypatch.setattr(artifacts.tempfile, "mkdtemp", read_only)
    rc = checkpoints.main(["storylm-1m", "--root", str(git_shipped)])
    out, err = capsys.readouterr()
    assert rc == 1
    assert "cannot write" in err and "read-only" in err and "Traceback" not in err
    assert "no source to restore it from" not in err


def test_leftovers_of_a_killed_install_are_cleaned_and_reported(capsys, git_shipped):
    models = git_shipped / "models"
    (models / ".tmp-StoryLM-1M-abc123").mkdir()
    (models / ".tmp-StoryLM-1M-abc123" / "model.safetensors").write_bytes(b"half")
    (models / "StoryLM-5M.old").symlink_to(models / "gone")              # dangling
    assert checkpoints.main(["storylm-1m", "--root", str(git_shipped)]) == 0
    err = capsys.readouterr().err
    assert "removed" in err and ".tmp-StoryLM-1M-abc123" in err and "StoryLM-5M.old" in err
    assert sorted(p.name for p in models.iterdir()) == ["StoryLM-1M"]


def test_killed_between_the_two_renames_moves_the_old_copy_back(capsys, git_shipped):
    live = artifact_dir("StoryLM-1M", git_shipped)
    live.rename(live.with_name("StoryLM-1M.old"))
    artifacts.clean_artifact_leftovers(git_shipped, log=print)
    assert "moved" in capsys.readouterr().out
    verify_artifact("StoryLM-1M", git_shipped, pinned=True)


def test_interrupted_artifact_write_keeps_the_previous_copy(tmp_path, monkeypatch):
    write_artifact("StoryLM-1M", {"model.safetensors": b"v1", "config.json": b"{}"}, {}, root=tmp_path)
    calls = []

    def interrupt(path):
        calls.append(path)
        if len(calls) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(artifacts, "_fsync_file", interrupt)
    with pytest.raises(KeyboardInterrupt):
        write_artifact("StoryLM-1M", {"model.safetensors": b"v2", "config.json": b"{}"}, {}, root=tmp_path,
                       force=True)
    assert (artifact_dir("StoryLM-1M", tmp_path) / "model.safetensors").read_bytes() == b"v1"
    verify_artifact("StoryLM-1M", tmp_path)
    assert _leftovers(tmp_path) == []


# -- datasets and token caches -------------------------------------------------------------------

def _corpus(tmp_path: Path, n: int = 200, tag: str = "") -> Path:
    from g2c.assets.data import EOT

    path = tmp_path / f"stories{tag}.txt"
    path.write_text("".join(f"Once upon a time {tag} cat {i} slept.\n{EOT}\n" for i in range(n)), encoding="utf-8")
    return path


def test_prepare_on_a_full_disk_keeps_the_previous_split(tmp_path, monkeypatch, capsys):
    from g2c.assets import data

    out = tmp_path / "data"
    data.prepare(_corpus(tmp_path), out_dir=out, log=lambda *a: None)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    real = Path.write_text

    def full(self, text, *args, **kwargs):
        if "val" in self.name:                      # train is written, then the disk fills up
            real(self, text[: len(text) // 2], *args, **kwargs)
            raise _enospc(self)
        return real(self, text, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", full)
    monkeypatch.setenv("G2C_TINYSTORIES", str(_corpus(tmp_path, 300, "b")))
    monkeypatch.setattr(data, "DATA_DIR", out)
    monkeypatch.setattr(data.prepare, "__kwdefaults__", {**data.prepare.__kwdefaults__, "out_dir": out})
    assert data.main(["--force"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the disk is full while writing" in err and "Traceback" not in err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before        # previous state, no temporary


def test_prepare_removes_leftovers_of_a_crashed_run_and_says_so(tmp_path):
    from g2c.assets import data

    out = tmp_path / "data"
    out.mkdir()
    (out / "train.txt.tmp").write_text("half")
    (out / ".val.g2c-tmp-0a1b2c3d.txt").write_text("half")
    lines = []
    data.prepare(_corpus(tmp_path), out_dir=out, log=lines.append)
    assert sum("removed" in line and "interrupted" in line for line in lines) == 2
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "train.txt", "val.txt"]


def test_token_cache_interrupted_keeps_the_previous_cache(tmp_path, monkeypatch):
    from g2c.assets import data
    from g2c.assets.artifacts import load_story_tokenizer

    out = tmp_path / "data"
    data.prepare(_corpus(tmp_path), out_dir=out, log=lambda *a: None)
    tok = load_story_tokenizer()
    counts = data.tokenize_splits(tok, data_dir=out, log=lambda *a: None)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    real = data.sha256_file
    calls = []

    def interrupt(path):                             # Ctrl-C once the val stream is written, before it is in place
        calls.append(Path(path).name)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(path)

    monkeypatch.setattr(data, "sha256_file", interrupt)
    with pytest.raises(KeyboardInterrupt):
        data.tokenize_splits(tok, data_dir=out, force=True, log=lambda *a: None)
    after = {p.name: p.read_bytes() for p in out.iterdir()}
    assert set(after) == set(before)                                      # no temporary left
    assert after["val.bin"] == before["val.bin"] and after["tokens.json"] == before["tokens.json"]
    assert len(data.load_token_stream("val", data_dir=out)) == counts["val"]


# -- GGUF ---------------------------------------------------------------------------------------

def _tiny_lm():
    from g2c.transformer import TransformerLM

    return TransformerLM(4096, 16, 2, 2, 24, generator=torch.Generator().manual_seed(0)).eval()


@pytest.fixture(scope="module")
def tok_json():
    return json.loads((artifact_dir("StoryTokenizer") / "tokenizer.json").read_text())


def test_gguf_export_on_a_full_disk_leaves_the_previous_file(tmp_path, monkeypatch, tok_json):
    import gguf

    from g2c.assets.gguf import write_gguf

    path = tmp_path / "tiny.gguf"
    write_gguf(_tiny_lm(), path, tokenizer=tok_json)
    before = path.read_bytes()

    def full(self, *args, **kwargs):                 # header and metadata are on disk: a partial file
        raise _enospc(path)

    monkeypatch.setattr(gguf.GGUFWriter, "write_tensors_to_file", full)
    with pytest.raises(OSError) as exc:
        write_gguf(_tiny_lm(), path, tokenizer=tok_json)
    assert exc.value.errno == errno.ENOSPC
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["tiny.gguf"]


def test_truncated_gguf_is_a_clear_error(tmp_path, tok_json, capsys):
    from g2c.assets.gguf import main, read_gguf, write_gguf

    raw = write_gguf(_tiny_lm(), tmp_path / "tiny.gguf", tokenizer=tok_json).read_bytes()
    cut = tmp_path / "cut.gguf"
    for n in (len(raw) - 100, len(raw) // 2, 100):
        cut.write_bytes(raw[:n])
        with pytest.raises(ValueError, match=r"cut\.gguf is not a complete GGUF file .*export it again"):
            read_gguf(cut)
    assert main(["--check", str(cut), "StoryLM-1M"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not a complete GGUF file" in err


# -- trainer checkpoints ---------------------------------------------------------------------------

def test_trainer_checkpoint_on_a_full_disk_keeps_the_previous_one(tmp_path, monkeypatch):
    from g2c.pretraining import trainer

    path = tmp_path / "trainer.pt"
    trainer.save_checked({"step": 1}, path)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    real = torch.save

    def full(obj, f, *a, **k):                       # save_checked hands torch.save an open file
        f.write(b"\0" * 100)
        raise _enospc(f.name)

    monkeypatch.setattr(trainer.torch, "save", full)
    with pytest.raises(OSError):
        trainer.save_checked({"step": 2}, path)
    monkeypatch.setattr(trainer.torch, "save", real)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before   # no trainer.pt.tmp
    assert trainer.load_checked(path)["step"] == 1


# -- notebooks -----------------------------------------------------------------------------------

def test_truncated_working_copy_is_backed_up_not_opened(tmp_path, capsys):
    from g2c.course import get_module
    from g2c.course.notebooks import prepare_working_copy, working_copy_path

    clean = get_module("03").notebook
    (tmp_path / clean).parent.mkdir(parents=True)
    shutil.copyfile(REPO_ROOT / clean, tmp_path / clean)
    work = prepare_working_copy("03", root=tmp_path)
    full = work.read_text()
    work.write_text(full[: len(full) // 2])                               # a full disk cut it
    again = prepare_working_copy("03", root=tmp_path)
    err = capsys.readouterr().err
    assert again == working_copy_path("03", root=tmp_path)
    assert json.loads(again.read_text())["cells"]                          # what Jupyter gets parses
    backups = list((again.parent / "archive").glob("*-damaged-*.ipynb"))
    assert len(backups) == 1 and backups[0].read_text() == full[: len(full) // 2]
    assert "cannot be opened" in err and backups[0].name in err


# -- say what happened --------------------------------------------------------------------------

def test_bad_solutions_variable_is_one_line_for_the_scripts():
    env = {**os.environ, "G2C_APPLY_SOLUTIONS": "bogus", "PYTHONPATH": str(REPO_ROOT)}
    for cmd in (["-m", "g2c.assets.checkpoints", "StoryLM-1M"], ["-m", "g2c.assets.data", "--help"],
                # plain pytest too (a fresh trial: an 8-line "ImportError while loading conftest" traceback)
                ["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_specdec.py"]):
        done = subprocess.run([sys.executable, *cmd], env=env, capture_output=True, text=True, cwd=REPO_ROOT)
        assert done.returncode == 1
        assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
        assert "unknown module id 'bogus'" in done.stderr and "unset G2C_APPLY_SOLUTIONS" in done.stderr


def test_unwritable_output_is_refused_at_parse_time(monkeypatch, tmp_path):
    import argparse

    from g2c.assets.cli import output_dir, output_file

    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: Path(p) != tmp_path and real_access(p, mode, **kw))
    with pytest.raises(argparse.ArgumentTypeError, match=f"cannot write the output folder {tmp_path}"):
        output_file()(str(tmp_path / "fig.png"))
    with pytest.raises(argparse.ArgumentTypeError, match="read-only or not yours"):
        output_dir()(str(tmp_path / "new" / "deeper"))
    monkeypatch.setattr(os, "access", real_access)
    assert output_file()(str(tmp_path / "fig.png")) == str(tmp_path / "fig.png")
    (tmp_path / "afile").write_text("kept")          # a helper's trial: this was blamed on permissions (chmod)
    for parse, text in ((output_file(), tmp_path / "afile" / "x.png"), (output_dir(), tmp_path / "afile" / "d" / "e")):
        with pytest.raises(argparse.ArgumentTypeError, match=f"{tmp_path / 'afile'} is a file, not a folder: "):
            parse(str(text))
    with pytest.raises(argparse.ArgumentTypeError, match="is a file; give a folder to write into"):
        output_dir()(str(tmp_path / "afile"))


def test_roofline_prints_the_context_it_measured_at(capsys):
    import importlib.util

    spec = importlib.util.spec_from_file_location("g2c_bench_roofline", REPO_ROOT / "bench" / "roofline.py")
    roofline = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(roofline)
    args = roofline.parse_args(["--models", "StoryLM-1M", "--rows", "1,9", "--rounds", "1", "--paths", "teaching",
                                "--context", "100000", "--plot", ""])
    results = roofline.measure_ladder(args, torch.device("cpu"))
    out = capsys.readouterr().out
    assert results["StoryLM-1M"]["context"] == 256 - 9
    assert "StoryLM-1M: measuring at context 247, not 100000: clamped to max_seq_len 256 - 9 rows" in out


def test_download_stops_at_the_pinned_size(tmp_path):
    """A mirror serving a longer file under the pinned hash is cut off at the pinned size."""
    mirror = tmp_path / "mirror"
    shutil.copytree(artifact_dir("StoryLM-1M"), artifact_dir("StoryLM-1M", mirror))
    with open(artifact_dir("StoryLM-1M", mirror) / "model.safetensors", "ab") as f:
        f.write(b"\0" * (3 << 20))
    with pytest.raises(ChecksumError, match=r"model\.safetensors is larger than the pinned 2,705,328 bytes"):
        checkpoints.install_from_url("StoryLM-1M", mirror.as_uri(), root=tmp_path / "root")
    assert not artifact_dir("StoryLM-1M", tmp_path / "root").exists()
