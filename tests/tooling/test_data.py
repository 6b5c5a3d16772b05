"""TinyStories preparation (g2c/assets/data.py, provided code): reading, the split, the cache.

Everything runs on tiny synthetic corpora under ``tmp_path``; the real ``data/`` is never touched.
"""

from __future__ import annotations

import json
import lzma
import time

import numpy as np
import pytest

from g2c.assets import data
from g2c.assets.data import EOT, is_validation, prepare, read_stories, split_stories, tokenize_splits


def story(i: int) -> str:
    return f"Once upon a time there was a cat number {i}.\nIt liked milk and the sun."


def write_corpus(path, stories, *, xz: bool = False):
    text = f"\n{EOT}\n".join(stories) + f"\n{EOT}\n"
    if xz:
        with lzma.open(path, "wt", encoding="utf-8") as f:
            f.write(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture
def corpus(tmp_path):
    return write_corpus(tmp_path / "stories.txt", [story(i) for i in range(200)])


def quiet(*_args, **_kwargs):
    pass


# -- read_stories -----------------------------------------------------------------------------

def test_read_stories_txt_splits_on_eot_lines(tmp_path):
    path = tmp_path / "s.txt"
    path.write_text(f"First story.\nSecond line.\n{EOT}\n\n  Second story.  \n{EOT}\n{EOT}\n", encoding="utf-8")
    assert read_stories(path) == ["First story.\nSecond line.", "Second story."]


def test_read_stories_xz_matches_txt(tmp_path):
    stories = [story(i) for i in range(5)] + ["Unicode: café, 😀."]
    plain = read_stories(write_corpus(tmp_path / "s.txt", stories))
    packed = read_stories(write_corpus(tmp_path / "s.txt.xz", stories, xz=True))
    assert plain == packed == stories


def test_read_stories_eot_inside_a_line_is_not_a_separator(tmp_path):
    path = tmp_path / "s.txt"
    path.write_text(f"She said {EOT} twice.\n{EOT}\nNext.\n", encoding="utf-8")
    assert read_stories(path) == [f"She said {EOT} twice.", "Next."]


def test_read_stories_missing_file_raises(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        read_stories(tmp_path / "nope.txt")


def test_read_stories_empty_file_raises(tmp_path):
    path = tmp_path / "empty.txt"
    path.write_text(f"\n{EOT}\n  \n", encoding="utf-8")
    with pytest.raises(ValueError, match="holds no stories"):
        read_stories(path)


# -- the split --------------------------------------------------------------------------------

def test_is_validation_is_deterministic_and_about_five_percent():
    stories = [f"Story {i}: a dog found a ball." for i in range(4000)]
    first = [is_validation(s) for s in stories]
    assert first == [is_validation(s) for s in stories]
    # The hash split is a Binomial(4000, 0.05) draw: mean 200, sd 13.8; 150..250 is > 3.5 sd.
    assert 150 <= sum(first) <= 250


def test_split_stories_partitions_in_order():
    stories = [f"Story {i}." for i in range(500)]
    train, val = split_stories(stories)
    assert sorted(train + val) == sorted(stories)
    assert train == [s for s in stories if not is_validation(s)]
    assert val == [s for s in stories if is_validation(s)]
    assert val  # 500 stories: P(no validation story) = 0.95**500 < 1e-11


def test_split_does_not_depend_on_order_or_company():
    stories = [f"Story {i}." for i in range(300)]
    _, val_a = split_stories(stories)
    _, val_b = split_stories(list(reversed(stories))[:150])
    assert set(val_b) == {s for s in val_a if s in set(stories[150:])}


# -- prepare ----------------------------------------------------------------------------------

def test_prepare_writes_split_and_manifest(corpus, tmp_path):
    out = tmp_path / "out"
    manifest = prepare(corpus, out_dir=out, log=quiet)
    train, val = split_stories(read_stories(corpus))
    assert read_stories(out / "train.txt") == train
    assert read_stories(out / "val.txt") == val
    on_disk = json.loads((out / "manifest.json").read_text())
    assert on_disk == manifest
    assert manifest["train_stories"] == len(train) and manifest["val_stories"] == len(val)
    assert manifest["source"]["kind"] == "file" and manifest["source"]["sha256"] == data.sha256_file(corpus)
    assert "% 100 < 5" in manifest["split_rule"]
    assert set(manifest["files"]) == {"train.txt", "val.txt"}


def test_prepare_refuses_a_source_with_an_empty_split_and_keeps_the_old_data(corpus, tmp_path):
    out = tmp_path / "data"
    prepare(corpus, out_dir=out, log=quiet)
    before = {f.name: f.read_bytes() for f in out.iterdir()}
    tiny = tmp_path / "two.txt"
    tiny.write_text("one story\n<|endoftext|>\nanother\n<|endoftext|>\n")
    with pytest.raises(ValueError, match="0 validation stories.*Nothing was changed"):
        prepare(tiny, out_dir=out, log=quiet)
    assert {f.name: f.read_bytes() for f in out.iterdir()} == before


def test_prepare_second_call_is_a_no_op(corpus, tmp_path):
    out = tmp_path / "out"
    prepare(corpus, out_dir=out, log=quiet)
    mtime = (out / "train.txt").stat().st_mtime_ns
    lines = []
    again = prepare(corpus, out_dir=out, log=lines.append)
    assert again["skipped"] is True
    assert "nothing to do" in lines[0]
    assert (out / "train.txt").stat().st_mtime_ns == mtime


def test_prepare_force_redoes(corpus, tmp_path):
    out = tmp_path / "out"
    prepare(corpus, out_dir=out, log=quiet)
    (out / "train.bin").write_bytes(b"stale")
    lines = []
    again = prepare(corpus, out_dir=out, force=True, log=lines.append)
    assert "skipped" not in again
    assert "wrote" in lines[0]
    assert not (out / "train.bin").exists()  # a redone split drops the old token cache


def test_prepare_redoes_when_a_file_was_edited(corpus, tmp_path):
    out = tmp_path / "out"
    prepare(corpus, out_dir=out, log=quiet)
    (out / "val.txt").write_text("edited", encoding="utf-8")
    assert "skipped" not in prepare(corpus, out_dir=out, log=quiet)
    assert read_stories(out / "val.txt") == split_stories(read_stories(corpus))[1]


def test_prepare_reads_env_source(corpus, tmp_path, monkeypatch):
    monkeypatch.setenv("G2C_TINYSTORIES", str(corpus))
    manifest = prepare(out_dir=tmp_path / "out", log=quiet)
    assert manifest["source"]["path"] == str(corpus.resolve())


def test_prepare_missing_source_raises(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        prepare(tmp_path / "nope.txt.xz", out_dir=tmp_path / "out", log=quiet)


# -- the Hugging Face path --------------------------------------------------------------------

def fake_loader(calls):
    def load(name, split):
        calls.append((name, split))
        n = data.TINY_STORIES if split.startswith("train[:") else 2 * data.TINY_STORIES
        return {"text": [f"Hub story {i}." for i in range(n)] + ["", "   "]}
    return load


def test_load_hf_stories_tiny_asks_for_a_prefix():
    calls = []
    stories = data.load_hf_stories(tiny=True, loader=fake_loader(calls))
    assert calls == [("roneneldan/TinyStories", f"train[:{data.TINY_STORIES}]")]
    assert len(stories) == data.TINY_STORIES  # blank stories dropped
    assert stories[0] == "Hub story 0."


def test_load_hf_stories_full_split():
    calls = []
    stories = data.load_hf_stories(tiny=False, loader=fake_loader(calls))
    assert calls == [("roneneldan/TinyStories", "train")]
    assert len(stories) == 2 * data.TINY_STORIES


def test_prepare_from_hub_with_a_stand_in(tmp_path, monkeypatch):
    monkeypatch.delenv("G2C_TINYSTORIES", raising=False)
    out = tmp_path / "out"
    calls = []
    manifest = prepare(tiny=True, hub=True, out_dir=out, hf_loader=fake_loader(calls), log=quiet)
    assert manifest["source"] == {"kind": "huggingface", "dataset": "roneneldan/TinyStories", "tiny": True}
    assert manifest["train_stories"] + manifest["val_stories"] == data.TINY_STORIES
    again = prepare(tiny=True, hub=True, out_dir=out, hf_loader=fake_loader(calls), log=quiet)
    assert again["skipped"] is True and len(calls) == 1


def test_hub_unreachable_fails_fast_naming_the_fixes(tmp_path, monkeypatch):
    monkeypatch.delenv("G2C_TINYSTORIES", raising=False)
    monkeypatch.setattr(data, "_hub_reachable", lambda *a, **k: False)
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match=r"--hub: .*unreachable.*--from PATH.*\$G2C_TINYSTORIES.*drop --hub"):
        prepare(tiny=True, hub=True, out_dir=tmp_path / "out", log=quiet)
    assert time.monotonic() - t0 < 2.0
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_main_reports_unreachable_hub(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("G2C_TINYSTORIES", raising=False)
    monkeypatch.setattr(data, "_hub_reachable", lambda *a, **k: False)
    # main() writes to prepare's default out_dir (the real data/); point it at tmp_path.
    orig = data.prepare
    monkeypatch.setattr(data, "prepare", lambda *a, **k: orig(*a, **{**k, "out_dir": tmp_path / "out"}))
    assert data.main(["--hub", "--tiny"]) == 1
    assert "--from" in capsys.readouterr().err


def test_main_refuses_an_empty_from_and_notes_a_tiny_without_hub(tmp_path, monkeypatch, capsys):
    # a trial: --from '' fell back to the default source in silence, and --tiny alone was ignored in silence
    monkeypatch.delenv("G2C_TINYSTORIES", raising=False)
    with pytest.raises(SystemExit) as exit_:
        data.main(["--from", ""])
    assert exit_.value.code == 2 and "--from '': give the path of a .txt or .txt.xz file" in capsys.readouterr().err
    seen = {}
    monkeypatch.setattr(data, "_run", lambda args: seen.setdefault("tiny", args.tiny) and 0)
    assert data.main(["--tiny"]) == 0 and seen == {"tiny": True}    # the seed's command still runs
    assert "note: --tiny cuts the Hugging Face download (--hub)" in capsys.readouterr().err


# -- the embedded default: the shipped TinyStories sample -------------------------------------

SAMPLE_SPLIT = (7639, 412)  # train / validation stories of the 8,051-story sample under the hash rule


def test_prepare_defaults_to_the_shipped_sample(tmp_path, monkeypatch):
    monkeypatch.delenv("G2C_TINYSTORIES", raising=False)
    monkeypatch.setattr(data, "load_hf_stories", lambda **k: pytest.fail("the default must not touch the hub"))
    out = tmp_path / "out"
    manifest = prepare(tiny=True, out_dir=out, log=quiet)
    assert manifest["source"]["kind"] == "artifact" and manifest["source"]["name"] == "TinyStories-sample"
    assert manifest["source"]["path"] == "artifacts/corpora/TinyStories-sample/tinystories-collected.txt.xz"
    assert manifest["source"]["sha256"] == "23b05fe79927eae342760007432a059eb29c0a05ff3df34ea7f4f9eb710cb65e"
    assert (manifest["train_stories"], manifest["val_stories"]) == SAMPLE_SPLIT


def test_prepared_data_is_kept_without_an_explicit_source(corpus, tmp_path, monkeypatch):
    monkeypatch.delenv("G2C_TINYSTORIES", raising=False)
    out = tmp_path / "out"
    prepare(corpus, out_dir=out, log=quiet)
    lines = []
    again = prepare(out_dir=out, log=lines.append)  # no source: keep what is there
    assert again["skipped"] is True and again["source"]["path"] == str(corpus.resolve())
    assert "nothing to do" in lines[0] and str(corpus.resolve()) in lines[0]


def test_prepared_data_with_hub_is_kept_offline(corpus, tmp_path, monkeypatch):
    monkeypatch.delenv("G2C_TINYSTORIES", raising=False)
    monkeypatch.setattr(data, "_hub_reachable", lambda *a, **k: False)
    out = tmp_path / "out"
    prepare(tiny=True, hub=True, out_dir=out, hf_loader=fake_loader([]), log=quiet)
    assert prepare(tiny=True, hub=True, out_dir=out, log=quiet)["skipped"] is True  # no network needed
    assert prepare(tiny=True, out_dir=out, log=quiet)["skipped"] is True


def test_prepare_file_and_hub_together_is_an_error(corpus, tmp_path):
    with pytest.raises(ValueError, match="pick one"):
        prepare(corpus, hub=True, out_dir=tmp_path / "out", log=quiet)


def test_prepare_corrupted_sample_names_checkpoints_sh(tmp_path, monkeypatch):
    import shutil

    from g2c.assets.artifacts import artifact_dir

    monkeypatch.delenv("G2C_TINYSTORIES", raising=False)
    shutil.copytree(artifact_dir("TinyStories-sample"), artifact_dir("TinyStories-sample", tmp_path / "arts"))
    xz = artifact_dir("TinyStories-sample", tmp_path / "arts") / "tinystories-collected.txt.xz"
    raw = bytearray(xz.read_bytes())
    raw[-100] ^= 0xFF
    xz.write_bytes(bytes(raw))
    with pytest.raises(FileNotFoundError, match=r"checksum mismatch.*Run \./checkpoints\.sh to restore it"):
        prepare(out_dir=tmp_path / "out", corpus_root=tmp_path / "arts", log=quiet)


# -- the token cache --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_tokenizer():
    from g2c.tokenizer import BPETokenizer

    return BPETokenizer.train([story(i) for i in range(50)], vocab_size=300, show_progress=False)


def test_tokenize_splits_writes_uint16_with_eot(corpus, tmp_path, tiny_tokenizer):
    out = tmp_path / "out"
    prepare(corpus, out_dir=out, log=quiet)
    counts = tokenize_splits(tiny_tokenizer, data_dir=out, log=quiet)
    for split in ("train", "val"):
        arr = data.load_token_stream(split, data_dir=out)
        assert arr.dtype == np.uint16 and arr.size == counts[split]
        stories = read_stories(out / f"{split}.txt")
        expected = []
        for ids in tiny_tokenizer.encode_batch_fast(stories):
            expected += ids + [tiny_tokenizer.eot_id]
        assert arr.tolist() == expected
        assert int((arr == tiny_tokenizer.eot_id).sum()) == len(stories)


def test_tokenize_splits_reuses_cache(corpus, tmp_path, tiny_tokenizer):
    out = tmp_path / "out"
    prepare(corpus, out_dir=out, log=quiet)
    first = tokenize_splits(tiny_tokenizer, data_dir=out, log=quiet)
    mtime = (out / "train.bin").stat().st_mtime_ns
    lines = []
    assert tokenize_splits(tiny_tokenizer, data_dir=out, log=lines.append) == first
    assert (out / "train.bin").stat().st_mtime_ns == mtime and not lines
    tokenize_splits(tiny_tokenizer, data_dir=out, force=True, log=lines.append)
    assert lines  # force rebuilt it


def test_tokenize_splits_rebuilds_for_another_tokenizer(corpus, tmp_path, tiny_tokenizer):
    from g2c.tokenizer import BPETokenizer

    out = tmp_path / "out"
    prepare(corpus, out_dir=out, log=quiet)
    tokenize_splits(tiny_tokenizer, data_dir=out, log=quiet)
    other = BPETokenizer.train([story(i) for i in range(50)], vocab_size=280, show_progress=False)
    lines = []
    tokenize_splits(other, data_dir=out, log=lines.append)
    assert lines
    assert json.loads((out / "tokens.json").read_text())["tokenizer_sha256"] == \
        data.hashlib.sha256(other.to_tokenizers().to_str().encode()).hexdigest()


def test_tokenize_splits_rejects_a_vocab_over_uint16(tmp_path):
    class Huge:
        vocab_size = (1 << 16) + 1

    with pytest.raises(ValueError, match="uint16"):
        tokenize_splits(Huge(), data_dir=tmp_path, log=quiet)


def test_load_split_text_missing_names_datasets_sh(tmp_path):
    with pytest.raises(FileNotFoundError, match="datasets.sh"):
        data.load_split_text("train", data_dir=tmp_path)


def test_load_token_stream_missing_names_datasets_sh(tmp_path):
    with pytest.raises(FileNotFoundError, match="datasets.sh"):
        data.load_token_stream("val", data_dir=tmp_path)


@pytest.mark.parametrize("damage", ["truncate", "flip", "no_record"])
def test_damaged_token_cache_is_redone_never_trusted(corpus, tmp_path, tiny_tokenizer, damage):
    """Family 6: a truncated or bit-flipped ``*.bin`` (or one without a recorded sha256) is refused
    by ``load_token_stream`` with the fix, and ``tokenize_splits`` redoes it instead of reusing it."""
    out = tmp_path / "out"
    prepare(corpus, out_dir=out, log=quiet)
    first = tokenize_splits(tiny_tokenizer, data_dir=out, log=quiet)
    good = (out / "train.bin").read_bytes()
    if damage == "truncate":
        (out / "train.bin").write_bytes(good[:-2])
        match = r"train\.bin has [\d,]+ bytes, tokens\.json recorded \d+ \(truncated\?\)\. Run \./datasets\.sh"
    elif damage == "flip":
        (out / "train.bin").write_bytes(good[:10] + bytes([good[10] ^ 1]) + good[11:])
        match = r"train\.bin does not match the sha256 recorded in tokens\.json .*Run \./datasets\.sh"
    else:
        meta = json.loads((out / "tokens.json").read_text())
        del meta["files"]
        (out / "tokens.json").write_text(json.dumps(meta))
        match = r"train\.bin has no recorded sha256 .*Run \./datasets\.sh"
    with pytest.raises(ValueError, match=match):
        data.load_token_stream("train", data_dir=out)
    lines = []
    assert tokenize_splits(tiny_tokenizer, data_dir=out, log=lines.append) == first
    assert any("re-tokenizing" in line for line in lines)
    assert (out / "train.bin").read_bytes() == good
    assert data.load_token_stream("train", data_dir=out).tolist() == np.frombuffer(good, np.uint16).tolist()


# -- ./datasets.sh: every source-reading error is one line with the fix -------------------------

def _source(tmp_path, kind):
    good = write_corpus(tmp_path / "good.txt.xz", [story(i) for i in range(60)], xz=True)
    if kind == "not_xz":
        path = tmp_path / "plain.txt.xz"
        path.write_text("just text, not compressed\n")
        return path, r"plain\.txt\.xz is not an xz file .*pass the plain \.txt, or compress it"
    if kind == "truncated_xz":
        path = tmp_path / "cut.txt.xz"
        path.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
        return path, r"cut\.txt\.xz is a truncated xz file .*copy or download it again"
    if kind == "not_utf8":
        path = tmp_path / "latin.txt"
        path.write_bytes("Caf\xe9 story.\n<|endoftext|>\n".encode("latin1"))
        return path, r"latin\.txt is not UTF-8 text \(byte 3: .*iconv"
    if kind == "directory":
        return tmp_path, r"is a directory: pass a \.txt or \.txt\.xz file inside it"
    if kind == "device":
        return "/dev/null", r"/dev/null is not a regular file .*pass a \.txt or \.txt\.xz file"
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["not_xz", "truncated_xz", "not_utf8", "directory", "device"])
def test_datasets_sh_source_errors_are_one_line_with_the_fix(tmp_path, capsys, kind):
    import re

    path, match = _source(tmp_path, kind)
    with pytest.raises(ValueError, match=match):
        prepare(path, out_dir=tmp_path / "out", log=quiet)
    assert not (tmp_path / "out").exists()
    assert data.main(["--from", str(path)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("datasets: error: ") and re.search(match, err), err


def test_truncated_tokens_json_is_redone_or_refused(corpus, tmp_path, tiny_tokenizer):
    out = tmp_path / "out"
    prepare(corpus, out_dir=out, log=quiet)
    first = tokenize_splits(tiny_tokenizer, data_dir=out, log=quiet)
    text = (out / "tokens.json").read_text()
    (out / "tokens.json").write_text(text[: len(text) // 2])
    with pytest.raises(ValueError, match=r"tokens\.json is corrupted .*run \./datasets\.sh to re-tokenize"):
        data.load_token_stream("val", data_dir=out)
    lines = []
    assert tokenize_splits(tiny_tokenizer, data_dir=out, log=lines.append) == first
    assert any("corrupted; re-tokenizing" in line for line in lines)
    assert data.load_token_stream("val", data_dir=out).size == first["val"]


def test_validation_prompts_refuse_a_length_no_story_has(corpus, tmp_path):
    """Benchmarks take their prompts from here: a prompt length longer than every validation story
    used to return no prompt at all, and the benches then divided by zero."""
    out = tmp_path / "out"
    prepare(corpus, out_dir=out, log=quiet)

    class Words:                                            # one token per word
        def encode(self, text):
            return [len(w) for w in text.split()]

    longest = max(len(s.split()) for s in read_stories(out / "val.txt"))
    prompts = data.validation_prompts(Words(), 3, longest, data_dir=out)
    assert 1 <= len(prompts) <= 3 and all(len(p) == longest for p in prompts)
    with pytest.raises(ValueError, match=rf"no validation story has {longest + 1:,} tokens \(the longest has "
                                         rf"{longest:,}\): ask for at most {longest:,} prompt tokens"):
        data.validation_prompts(Words(), 3, longest + 1, data_dir=out)
    with pytest.raises(ValueError, match=r"need n >= 1 prompts of num_tokens >= 1 tokens, got n=0"):
        data.validation_prompts(Words(), 0, 4, data_dir=out)
