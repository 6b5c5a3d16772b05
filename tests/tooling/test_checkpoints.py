"""``./checkpoints.sh`` (g2c/assets/checkpoints.py): verify, install from a mirror or a URL, retrain guard.

Every test works on temporary artifact roots (the hidden ``--root`` option); the real
``artifacts/`` is only read.
"""

from __future__ import annotations

import functools
import hashlib
import http.server
import json
import shutil
import subprocess
import threading
from pathlib import Path

import pytest

from g2c.assets import artifacts, checkpoints
from g2c.assets.artifacts import (
    ArtifactMissingError,
    ChecksumError,
    artifact_dir,
    drafter_names,
    model_names,
    verify_artifact,
    write_artifact,
)
from g2c.assets.checkpoints import install_from_url, main

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
VAL_LOSS = {"StoryLM-1M": 3.5, "StoryLM-5M": 2.5, "StoryLM-30M": 2.0}


def flip_byte(path: Path, offset: int = -1) -> None:
    raw = bytearray(path.read_bytes())
    raw[offset] ^= 0xFF
    path.write_bytes(bytes(raw))


def fill(root: Path, tag: bytes = b"v1") -> Path:
    """A complete artifacts tree: the real corpus and tokenizer, stand-in models and drafters (bytes, not weights)."""
    shutil.copytree(artifact_dir("TinyStories-sample"), artifact_dir("TinyStories-sample", root))
    shutil.copytree(artifact_dir("StoryTokenizer"), artifact_dir("StoryTokenizer", root))
    for name in model_names():
        write_artifact(name, {"model.safetensors": tag + name.encode() * 50, "config.json": b"{}"},
                       {"name": name, "kind": "model", "val_loss": VAL_LOSS[name]}, root=root)
    for name in drafter_names():
        write_artifact(name, {"model.safetensors": tag + name.encode() * 20, "config.json": b"{}"},
                       {"name": name, "kind": "model", "drafter": "mtp", "base": "StoryLM-30M",
                        "val": {"val_agree": 0.5}}, root=root)
    return root


@pytest.fixture(autouse=True)
def no_url(monkeypatch):
    monkeypatch.delenv(checkpoints.URL_ENV, raising=False)


@functools.cache
def _fake_pins(tmp: str) -> str:
    return json.dumps({"artifacts": artifacts.pins_from_tree(fill(Path(tmp) / "pinned"))})


@pytest.fixture(autouse=True)
def pins(tmp_path_factory, tmp_path, monkeypatch):
    """Here the pinned record is that of fill()'s stand-in models (the real one pins the real weights)."""
    path = tmp_path / "pins.json"
    path.write_text(_fake_pins(str(tmp_path_factory.getbasetemp())))
    monkeypatch.setattr(artifacts, "PINS_FILE", path)
    return path


@pytest.fixture
def mirror(tmp_path):
    return fill(tmp_path / "mirror")


@pytest.fixture
def root(tmp_path):
    return tmp_path / "root"


def run(capsys, *argv) -> tuple[int, str, str]:
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def weights(root: Path, name: str = "StoryLM-1M") -> bytes:
    return (artifact_dir(name, root) / "model.safetensors").read_bytes()


# -- verify ----------------------------------------------------------------------------------

def test_verify_all_ok_prints_one_line_each(capsys, mirror):
    rc, out, _ = run(capsys, "--root", mirror)
    assert rc == 0
    lines = out.splitlines()
    assert [line.split()[0] for line in lines[:5]] == ["TinyStories-sample", "StoryTokenizer", *model_names()]
    assert all(line.split()[1] == "OK" for line in lines[:5])
    assert "8,051 stories, CDLA-Sharing-1.0" in lines[0] and "MB" in lines[0]
    assert "vocab 4096" in lines[1]
    assert "val_loss 3.5000" in lines[2] and "val_loss 2.0000" in lines[4]
    assert "KB" in lines[1]
    assert "12/12 artifacts OK" in out


def test_verify_corrupt_reports_and_fails(capsys, mirror):
    flip_byte(artifact_dir("StoryLM-5M", mirror) / "model.safetensors")
    rc, out, err = run(capsys, "--root", mirror)
    assert rc == 1
    line = next(line for line in out.splitlines() if line.startswith("StoryLM-5M"))
    assert line.split()[1] == "CORRUPT"
    assert "checksum mismatch" in err and "--from DIR" in err and "$G2C_ARTIFACTS_URL" in err
    assert "11/12 artifacts OK" in err


def test_verify_missing_reports_and_fails(capsys, mirror):
    shutil.rmtree(artifact_dir("StoryLM-30M", mirror))
    rc, out, err = run(capsys, "--root", mirror)
    assert rc == 1
    assert "StoryLM-30M          MISSING" in out
    assert "./checkpoints.sh --train StoryLM-30M" in err


def test_verify_selected_names_case_insensitive(capsys, mirror):
    shutil.rmtree(artifact_dir("StoryLM-30M", mirror))
    rc, out, _ = run(capsys, "storylm-1m", "STORYTOKENIZER", "--root", mirror)
    assert rc == 0
    assert [line.split()[0] for line in out.splitlines()[:2]] == ["StoryTokenizer", "StoryLM-1M"]


def test_verify_shipped_corpus(capsys):
    rc, out, _ = run(capsys, "tinystories-sample")
    assert rc == 0 and out.startswith("TinyStories-sample   OK")
    manifest = verify_artifact("TinyStories-sample")
    assert manifest["kind"] == "corpus" and manifest["license"] == "CDLA-Sharing-1.0"
    assert set(manifest["files"]) == {"tinystories-collected.txt.xz", "LICENSE.md"}
    licence = (artifact_dir("TinyStories-sample") / "LICENSE.md").read_text(encoding="utf-8")
    for words in ("CDLA-Sharing-1.0", "Ronen Eldan", "Yuanzhi Li", "arXiv:2305.07759", "roneneldan/TinyStories"):
        assert words in licence


def test_verify_repairs_a_corrupted_corpus_from_a_mirror(capsys, mirror, tmp_path):
    root = fill(tmp_path / "root")
    flip_byte(artifact_dir("TinyStories-sample", root) / "tinystories-collected.txt.xz", 100)
    rc, out, err = run(capsys, "--root", root)
    assert rc == 1 and "TinyStories-sample   CORRUPT" in out and "checksum mismatch" in err
    assert "--train TinyStories-sample" not in err  # data is restored, never trained
    rc, out, _ = run(capsys, "--root", root, "--from", mirror)
    assert rc == 0 and "was CORRUPT: installed from" in out
    verify_artifact("TinyStories-sample", root)


def test_train_refuses_the_corpus(capsys):
    rc, _, err = run(capsys, "--train", "TinyStories-sample")
    assert rc == 2 and "is data, not trained" in err


def test_verify_shipped_tokenizer(capsys):
    rc, out, _ = run(capsys, "StoryTokenizer")
    assert rc == 0 and out.startswith("StoryTokenizer       OK")


def test_unknown_name_lists_names(capsys, mirror):
    rc, _, err = run(capsys, "StoryLM-2M", "--root", mirror)
    assert rc == 2
    assert "unknown artifact 'StoryLM-2M'" in err and "StoryLM-30M-Block, StoryTokenizer" in err


# -- --from ----------------------------------------------------------------------------------

def test_from_installs_everything(capsys, mirror, root):
    rc, out, _ = run(capsys, "--root", root, "--from", mirror)
    assert rc == 0, out
    for name in checkpoints.all_names():
        assert verify_artifact(name, root)["files"] == verify_artifact(name, mirror)["files"]
    assert out.count(f"installed from {mirror}") == 12
    assert not [p for p in (root / "models").iterdir() if p.name.startswith(".")]  # no temp folder left


def test_from_installs_selected_names(capsys, mirror, root):
    assert run(capsys, "storylm-5m", "--root", root, "--from", mirror)[0] == 0
    assert [p.name for p in (root / "models").iterdir()] == ["StoryLM-5M"]
    assert not (root / "tokenizers").exists()


def test_from_accepts_a_checkout_holding_artifacts(capsys, tmp_path, root):
    fill(tmp_path / "clone" / "artifacts")
    assert run(capsys, "--root", root, "--from", tmp_path / "clone")[0] == 0


def test_from_refuses_to_overwrite_verified_without_force(capsys, mirror, tmp_path):
    root = fill(tmp_path / "root")
    inode = artifact_dir("StoryLM-1M", root).stat().st_ino
    rc, out, _ = run(capsys, "--root", root, "--from", mirror)
    assert rc == 0
    assert out.count("already installed and verified; --force replaces it") == 12
    assert artifact_dir("StoryLM-1M", root).stat().st_ino == inode          # not rewritten
    rc, out, _ = run(capsys, "--root", root, "--from", mirror, "--force")
    assert rc == 0
    assert artifact_dir("StoryLM-1M", root).stat().st_ino != inode          # replaced by the mirror's copy
    assert weights(root) == weights(mirror)


def test_from_repairs_a_corrupted_install_without_force(capsys, mirror, tmp_path):
    root = fill(tmp_path / "root")
    flip_byte(artifact_dir("StoryLM-1M", root) / "model.safetensors")
    rc, out, _ = run(capsys, "--root", root, "--from", mirror)
    assert rc == 0
    assert "StoryLM-1M           OK" in out
    verify_artifact("StoryLM-1M", root)


def test_from_rejects_a_corrupted_source(capsys, mirror, root):
    flip_byte(artifact_dir("StoryLM-1M", mirror) / "model.safetensors")
    rc, out, err = run(capsys, "storylm-1m", "--root", root, "--from", mirror)
    assert rc == 1
    assert "install failed" in out and "unusable" in err and "checksum mismatch" in err
    assert not artifact_dir("StoryLM-1M", root).exists()


def test_from_rejects_an_incomplete_source(mirror, root):
    folder = artifact_dir("StoryLM-1M", mirror)
    (folder / "config.json").unlink()
    write_artifact("StoryLM-1M", {"model.safetensors": folder / "model.safetensors"}, {}, root=mirror, force=True)
    with pytest.raises(ChecksumError, match="does not list config.json"):
        checkpoints.install_from_dir("StoryLM-1M", mirror, root=root)


def test_from_missing_folder_is_an_error(capsys, tmp_path, root):
    rc, _, err = run(capsys, "--root", root, "--from", tmp_path / "nowhere")
    assert rc == 2 and "no such folder" in err


def test_from_a_file_is_named_a_file(capsys, tmp_path, root):
    (tmp_path / "mirror.tar").write_text("not a folder")
    rc, _, err = run(capsys, "--root", root, "--from", tmp_path / "mirror.tar")
    assert rc == 2 and "is a file; give the mirror's folder" in err and "no such folder" not in err


def test_from_mirror_manifest_leaving_its_folder_changes_no_file(capsys, tmp_path):
    """Family 7: a mirror's manifest that names ``../../../victim.txt`` is refused before any copy."""
    mirror = fill(tmp_path / "m" / "mirror")
    root = tmp_path / "r" / "root"
    (tmp_path / "m" / "victim.txt").write_text("from the mirror\n")
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "victim.txt").write_text("mine\n")
    folder = artifact_dir("StoryLM-1M", mirror)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["files"]["../../../victim.txt"] = hashlib.sha256(b"from the mirror\n").hexdigest()
    (folder / "manifest.json").write_text(json.dumps(manifest))
    rc, out, err = run(capsys, "storylm-1m", "--root", root, "--from", mirror)
    assert rc == 1
    assert "unsafe file name '../../../victim.txt'" in err
    assert (tmp_path / "r" / "victim.txt").read_text() == "mine\n"
    assert not artifact_dir("StoryLM-1M", root).exists()


@pytest.mark.parametrize("force", [False, True])
def test_restore_keeps_an_untracked_user_file(capsys, mirror, tmp_path, force):
    """Family 7: a restore replaces the files the manifest owns and nothing else."""
    root = fill(tmp_path / "root")
    folder = artifact_dir("StoryLM-1M", root)
    (folder / "notes.txt").write_text("my notes\n")
    (folder / "plots").mkdir()
    (folder / "plots" / "loss.csv").write_text("1,2\n")
    flip_byte(folder / "model.safetensors")
    rc, out, _ = run(capsys, "storylm-1m", "--root", root, "--from", mirror, *(["--force"] if force else []))
    assert rc == 0, out
    assert weights(root) == weights(mirror)
    assert (folder / "notes.txt").read_text() == "my notes\n"
    assert (folder / "plots" / "loss.csv").read_text() == "1,2\n"
    verify_artifact("StoryLM-1M", root)


@pytest.mark.parametrize("manifest", ['["model.safetensors"]', '{"files": ["model.safetensors"]}',
                                      '{"files": {"model.safetensors": 5}}', '{"files": {"config.json": "ab"}}'])
def test_manifest_of_the_wrong_structure_is_one_line_and_fails(capsys, mirror, manifest):
    (artifact_dir("StoryLM-1M", mirror) / "manifest.json").write_text(manifest)
    rc, out, err = run(capsys, "storylm-1m", "--root", mirror)
    assert rc == 1
    assert "StoryLM-1M           CORRUPT" in out
    assert "wrong structure" in err or "not a 64-digit sha256" in err
    assert "Traceback" not in err and "see below" not in out
    with pytest.raises(ChecksumError, match=r"(wrong structure|not a 64-digit sha256).*checkpoints\.sh --force"):
        verify_artifact("StoryLM-1M", mirror)


def test_failed_force_replace_is_reported_and_fails(capsys, mirror, tmp_path):
    """A broken mirror under --force leaves the verified copy in place and says why (exit 1)."""
    root = fill(tmp_path / "root")
    flip_byte(artifact_dir("StoryLM-1M", mirror) / "model.safetensors")
    rc, out, err = run(capsys, "storylm-1m", "--root", root, "--from", mirror, "--force")
    assert rc == 1
    assert "OK" in out and "the installed copy is kept: the new copy could not replace it, see below" in out
    assert "checksum mismatch" in err and "(fix or replace the mirror's copy)" in err
    assert "./checkpoints.sh" not in err              # that advice repairs artifacts/, not the mirror
    verify_artifact("StoryLM-1M", root)


def test_an_empty_mirror_is_named_and_its_missing_copy_not_blamed_on_artifacts(capsys, tmp_path):
    """A helper's trial: an empty --from folder passed in silence (12/12 OK), and under --force the line
    said OK, the summary 0/1, and the advice "run ./checkpoints.sh to install it"."""
    root = fill(tmp_path / "root")
    (tmp_path / "empty").mkdir()
    rc, out, err = run(capsys, "storylm-1m", "--root", root, "--from", tmp_path / "empty")
    assert rc == 0 and "holds none of the 1 artifacts asked for" in err and "mirror laid out like artifacts/" in err
    rc, out, err = run(capsys, "storylm-1m", "--root", root, "--from", tmp_path / "empty", "--force")
    assert rc == 1 and "the installed copy is kept" in out and "0/1 artifacts OK" in err
    assert "manifest.json not found) (fix or replace the mirror's copy)" in err and "./checkpoints.sh" not in err
    verify_artifact("StoryLM-1M", root)


# -- $G2C_ARTIFACTS_URL ----------------------------------------------------------------------

@pytest.fixture
def server(mirror):
    """A local HTTP server over the mirror, on 127.0.0.1."""
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(mirror)))
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_url_downloads_missing_artifacts_over_http(capsys, monkeypatch, server, mirror, root):
    monkeypatch.setenv(checkpoints.URL_ENV, server + "/")
    rc, out, _ = run(capsys, "--root", root)
    assert rc == 0, out
    assert out.count(f"downloaded from {server}/") == 12
    assert weights(root, "StoryLM-30M") == weights(mirror, "StoryLM-30M")


def test_url_file_scheme_repairs_a_corrupted_artifact(capsys, monkeypatch, mirror, tmp_path):
    root = fill(tmp_path / "root")
    flip_byte(artifact_dir("StoryTokenizer", root) / "tokenizer.json", 10)
    monkeypatch.setenv(checkpoints.URL_ENV, mirror.as_uri())
    rc, out, _ = run(capsys, "--root", root)
    assert rc == 0
    assert out.count("downloaded from") == 1  # only the corrupted one; verified ones are left alone
    verify_artifact("StoryTokenizer", root)


def test_url_tampered_file_is_rejected(capsys, monkeypatch, server, mirror, root):
    flip_byte(artifact_dir("StoryLM-1M", mirror) / "model.safetensors")
    monkeypatch.setenv(checkpoints.URL_ENV, server)
    rc, _, err = run(capsys, "storylm-1m", "--root", root)
    assert rc == 1
    assert "downloaded" in err and "model.safetensors" in err
    assert not artifact_dir("StoryLM-1M", root).exists()


def test_url_unreachable_names_the_url(root):
    with pytest.raises(ArtifactMissingError, match=r"could not download http://127\.0\.0\.1:9/models/StoryLM-1M/"):
        install_from_url("StoryLM-1M", "http://127.0.0.1:9", root=root, timeout=2)


def test_url_missing_artifact_on_server(capsys, monkeypatch, server, mirror, root):
    shutil.rmtree(artifact_dir("StoryLM-5M", mirror))
    monkeypatch.setenv(checkpoints.URL_ENV, server)
    rc, out, err = run(capsys, "--root", root)
    assert rc == 1
    assert "StoryLM-5M           MISSING" in out and "404" in err


def test_url_manifest_with_unsafe_file_name_is_rejected(tmp_path, root):
    folder = artifact_dir("StoryLM-1M", tmp_path / "evil")
    folder.mkdir(parents=True)
    (folder / "manifest.json").write_text('{"files": {"../../escape": "00"}}')
    with pytest.raises(ChecksumError, match="unsafe file name"):
        install_from_url("StoryLM-1M", (tmp_path / "evil").as_uri(), root=root)


# -- git HEAD as the last source -------------------------------------------------------------

@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_git_head_restores_a_corrupted_artifact(capsys, tmp_path):
    repo = tmp_path / "clone"
    root = fill(repo / "artifacts")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run(git + ["init", "-q"], check=True)
    subprocess.run(git + ["add", "artifacts"], check=True)
    subprocess.run(git + ["commit", "-q", "-m", "artifacts"], check=True)
    good = weights(root)
    flip_byte(artifact_dir("StoryLM-1M", root) / "model.safetensors")
    rc, out, _ = run(capsys, "--root", root, "--force")
    assert rc == 0
    assert "restored from git HEAD" in out
    assert weights(root) == good


# -- --train guard ---------------------------------------------------------------------------

def test_train_skips_verified_artifacts(capsys, mirror):
    rc, out, _ = run(capsys, "--train", "storytokenizer", "StoryLM-1M", "--root", mirror)
    assert rc == 0
    assert out.count("already trained and verified; skipping (--force retrains it)") == 2


def test_train_unknown_name_lists_names(capsys):
    rc, _, err = run(capsys, "--train", "StoryLM-7M")
    assert rc == 2 and "known: StoryLM-1M" in err


def test_train_only_writes_to_the_real_root(capsys, root):
    rc, out, _ = run(capsys, "--train", "StoryLM-1M", "--root", root)
    assert rc == 2 and "drop --root" in out


def test_train_and_from_do_not_mix(capsys, mirror):
    rc, _, err = run(capsys, "--train", "--from", mirror)
    assert rc == 2 and "do not mix" in err


def test_help_lists_the_options(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for word in ("--train", "--from", "--force", "G2C_ARTIFACTS_URL", "StoryLM-30M", "case-insensitive"):
        assert word in out
    assert "--root" not in out  # a hidden option for tests


def test_train_selects_the_solutions_before_anything_imports_a_course_module():
    """A fresh process: ``--train`` must apply every reference solution itself, even though the
    parser's help lists the ladder's names (module 09's LADDER). Regression: building the parser
    first imported module 09, and every ``./checkpoints.sh --train`` then refused to run."""
    import os
    import sys

    code = ("import g2c, g2c.assets.checkpoints as c\n"
            "from g2c.course import module_ids\n"
            "c.train = lambda *a, **k: print('applied', set(module_ids()) <= set(g2c.APPLIED_SOLUTIONS)) or 0\n"
            "raise SystemExit(c.main(['--train', 'StoryLM-1M']))\n")
    env = {k: v for k, v in os.environ.items() if k != "G2C_APPLY_SOLUTIONS"}
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "applied True" in proc.stdout


@pytest.mark.parametrize("manifest", ['{"files": 3}', '[1, 2]', '{"files": {"model.safetensors": null}}'])
def test_from_mirror_with_a_manifest_of_the_wrong_structure_is_one_line(capsys, mirror, root, manifest):
    (artifact_dir("StoryLM-1M", mirror) / "manifest.json").write_text(manifest)
    rc, out, err = run(capsys, "storylm-1m", "--root", root, "--from", mirror)
    assert rc == 1
    assert "install failed, see below" in out
    lines = [line for line in err.splitlines() if line.strip()]
    assert "unusable" in lines[0] and ("wrong structure" in lines[0] or "not a 64-digit sha256" in lines[0])
    assert "Traceback" not in err and not artifact_dir("StoryLM-1M", root).exists()


def test_a_drafters_agreement_names_the_text_it_was_measured_on():
    """A student's trial: ./checkpoints.sh listed the block drafter's 0.836 beside EAGLE's 0.814, though the
    block drafter's validation text is the base's own greedy text, not the corpus."""
    block = {"drafter": "block", "base": "StoryLM-30M", "val": {"val_agree_1": 0.836},
             "recipe": {"text": "greedy"}}
    eagle = {"drafter": "eagle", "base": "StoryLM-30M", "val": {"val_agree": 0.814}, "recipe": {}}
    assert checkpoints._summary("StoryLM-30M-Block", block).endswith(
        "val top-1 agreement 0.836 (on the base's own text)")
    assert checkpoints._summary("StoryLM-30M-EAGLE", eagle).endswith("val top-1 agreement 0.814")
