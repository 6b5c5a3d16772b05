#!/usr/bin/env python3
"""Build llama.cpp's command-line tools from PyPI's llama-cpp-python source distribution.

A benchmark-only setup step (never run by ``./setup.sh`` or CI): it needs a C++ compiler,
cmake and 10-30 minutes of 2 CPU cores (27 minutes on the shared course VM).

    python bench/setup_llamacpp.py              # download, unpack, build into runs/llama.cpp/
    python bench/setup_llamacpp.py --jobs 4     # more parallel compile jobs
    python bench/setup_llamacpp.py --print-dir  # print the folder of the built tools and exit

What it does, reproducibly (no hand edits):

1. ``pip download --no-binary :all: --no-deps llama-cpp-python==VERSION`` into
   ``runs/llama.cpp/`` (the sdist vendors llama.cpp: sources, ``convert_hf_to_gguf.py``,
   ``gguf-py``, the speculative example and the server);
2. unpack it there;
3. ``cmake`` configure (Release, CPU only unless ``--backend metal|cuda``, no network features,
   no web UI download) and
   ``cmake --build --target`` of ``llama-completion`` (plain generation), ``llama-cli``,
   ``llama-speculative`` and ``llama-speculative-simple`` (draft-model speculative decoding),
   ``llama-server`` (the OpenAI-style server, with ``--model-draft``) and ``llama-bench``.

Afterwards ``runs/llama.cpp/build/bin/`` holds the tools and ``runs/llama.cpp/src`` points at the
vendored llama.cpp tree (``bench/llamacpp.py`` and ``scripts/export_gguf.py`` read both).
Each step is skipped when its output already exists (``--force`` redoes them).

Raises (exit code 1 with a one-line message): pip, tar, cmake or the compiler failing, or
cmake / a C++ compiler missing from PATH.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

from g2c.assets.cli import count, output_dir

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / "runs" / "llama.cpp"
VERSION = "0.3.36"          # the llama-cpp-python release the numbers in docs/llamacpp.md come from
TARGETS = ("llama-completion", "llama-cli", "llama-speculative", "llama-speculative-simple", "llama-server",
           "llama-bench")
BACKENDS = {"cpu": ("-DGGML_CUDA=OFF", "-DGGML_METAL=OFF"), "metal": ("-DGGML_METAL=ON",),
            "cuda": ("-DGGML_CUDA=ON",)}
CMAKE_FLAGS = ("-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF", "-DGGML_NATIVE=ON", "-DLLAMA_CURL=OFF",
               "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF",
               "-DLLAMA_BUILD_EXAMPLES=ON", "-DLLAMA_BUILD_TOOLS=ON", "-DLLAMA_BUILD_SERVER=ON")


def source_dir(work: Path = WORK, version: str = VERSION) -> Path:
    """The vendored llama.cpp tree inside the unpacked sdist."""
    return work / f"llama_cpp_python-{version}" / "vendor" / "llama.cpp"


def bin_dir(work: Path = WORK) -> Path:
    """Where ``cmake --build`` puts the tools."""
    return work / "build" / "bin"


def _run(cmd: list[str], **kw) -> None:
    print("+", " ".join(cmd), flush=True)
    done = subprocess.run(cmd, **kw)
    if done.returncode != 0:
        raise SystemExit(f"setup_llamacpp: command failed (exit {done.returncode}): {' '.join(cmd)}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--version", default=VERSION, help=f"llama-cpp-python sdist version (default {VERSION})")
    ap.add_argument("--work", type=output_dir(as_path=True), default=WORK,
                    help="build folder (default runs/llama.cpp, git-ignored)")
    ap.add_argument("--jobs", type=count(1), default=2, help="parallel compile jobs (default 2)")
    ap.add_argument("--backend", choices=tuple(BACKENDS), default="cpu",
                    help="cpu (default: what the benchmark compares), metal (Apple GPUs) or cuda (needs the CUDA "
                         "toolkit)")
    ap.add_argument("--targets", default=",".join(TARGETS), help="comma-separated cmake targets")
    ap.add_argument("--force", action="store_true", help="download, unpack and build again")
    ap.add_argument("--print-dir", action="store_true", help="print the tools' folder and exit")
    args = ap.parse_args(argv)
    if args.print_dir:
        print(bin_dir(args.work))
        return 0
    for tool in ("cmake", "c++"):
        if shutil.which(tool) is None:
            raise SystemExit(f"setup_llamacpp: {tool} is not on PATH; install it (e.g. apt-get install cmake g++)")
    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    sdist = work / f"llama_cpp_python-{args.version}.tar.gz"
    if args.force or not sdist.exists():
        _run([sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
              "-d", str(work), f"llama-cpp-python=={args.version}"])
    src = source_dir(work, args.version)
    if args.force or not (src / "CMakeLists.txt").exists():
        print(f"+ unpack {sdist.name}", flush=True)
        with tarfile.open(sdist) as tar:
            tar.extractall(work, filter="data")
    link = work / "src"
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(src.relative_to(work))
    build = work / "build"
    if args.force and build.exists():
        shutil.rmtree(build)
    _run(["cmake", "-S", str(src), "-B", str(build), *CMAKE_FLAGS, *BACKENDS[args.backend]])
    targets = [t for t in args.targets.split(",") if t]
    _run(["cmake", "--build", str(build), "--config", "Release", "-j", str(args.jobs), "--target", *targets])
    missing = [t for t in targets if not (bin_dir(work) / t).exists()]
    if missing:
        raise SystemExit(f"setup_llamacpp: the build finished but {', '.join(missing)} is missing from {bin_dir(work)}")
    print(f"llama.cpp tools ready in {bin_dir(work)}: {', '.join(targets)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
