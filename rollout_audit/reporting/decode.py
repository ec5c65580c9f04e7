"""Token ids back to text for `rollout-audit show`: a local Hugging Face tokenizer directory, or the
vocabulary a producer declared in the file metadata `rollout_log.tokenizer` (written by RolloutWriter)."""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..contract import schema as S
from ..contract.errors import DecodeError

MAX_VOCABULARY = 1_000_000  # entries of a declared vocabulary; a larger one is ignored, not loaded


@dataclass(frozen=True)
class Decoder:
    """Per-token text pieces for token ids. `vocabulary` holds a declared word list; `hf` a loaded
    Hugging Face tokenizer (decoded one id at a time, so each piece is that token's own text)."""

    name: str
    vocabulary: tuple[str, ...] = ()
    hf: Any = None
    file: str = ""  # the tokenizer's file, for messages

    def pieces(self, ids: Sequence[int]) -> list[str]:
        """The text of each token; an id outside the vocabulary shows as `<id?>`."""
        if self.hf is not None:
            n = len(self.hf)
            with rust_panics(f"--tokenizer {self.file}: decoding failed"):
                return [self.hf.decode([i]) if 0 <= i < n else f"<{i}?>" for i in ids]
        v = self.vocabulary
        return [v[i] if 0 <= i < len(v) else f"<{i}?>" for i in ids]


def declared(meta: Mapping[bytes, bytes] | None) -> dict:
    """The producer's tokenizer declaration from file metadata: {"name": str, "vocabulary": [str]}
    (each key optional); {} when absent or malformed (a hostile value is ignored, never trusted)."""
    d = S.meta_object(meta, S.META_TOKENIZER)
    out: dict = {}
    if isinstance(d.get("name"), str):
        out["name"] = d["name"][:200]
    vocab = d.get("vocabulary")
    if isinstance(vocab, list) and len(vocab) <= MAX_VOCABULARY and all(isinstance(w, str) for w in vocab):
        out["vocabulary"] = vocab
    return out


def from_declaration(meta: Mapping[bytes, bytes] | None) -> Decoder | None:
    """A decoder from the file's declared vocabulary, or None when it declares none."""
    d = declared(meta)
    if "vocabulary" not in d:
        return None
    return Decoder(d.get("name", "declared vocabulary"), vocabulary=tuple(d["vocabulary"]))


def from_directory(path: str | Path) -> Decoder:
    """A local Hugging Face tokenizer directory (nothing downloaded, no remote code)."""
    p = Path(path)
    if not p.is_dir():
        raise DecodeError(f"--tokenizer {path}: not a directory (a local Hugging Face tokenizer directory is needed)")
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise DecodeError("--tokenizer needs the transformers package: pip install transformers") from None
    file = p / "tokenizer.json" if (p / "tokenizer.json").is_file() else p
    try:
        with rust_panics(f"--tokenizer {file}: cannot load a tokenizer"):
            tok = AutoTokenizer.from_pretrained(str(p), local_files_only=True, trust_remote_code=False)
    except DecodeError:
        raise
    except Exception as e:  # noqa: BLE001 - transformers raises many kinds; the user gets one line
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise DecodeError(f"--tokenizer {path}: cannot load a tokenizer: {first}") from None
    return Decoder(getattr(tok, "name_or_path", str(p)) or str(p), hf=tok, file=str(file))


@contextmanager
def rust_panics(what: str) -> Iterator[None]:
    """Run tokenizers code with file descriptor 2 captured: a panic inside the Rust library (a
    regular expression that backtracks past the engine's limit, say) prints its message and a
    backtrace straight to the process's stderr, then reaches Python as pyo3's PanicException, a
    BaseException. The panic becomes one DecodeError line, `what` and the panic's message; text
    written to stderr without a panic is passed on."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        panic: BaseException | None = None
        try:
            yield
        except BaseException as e:
            if type(e).__name__ != "PanicException":
                raise
            panic = e
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            if panic is None:
                captured.seek(0)
                sys.stderr.write(captured.read().decode(errors="replace"))
        if panic is not None:
            msg = (str(panic).strip().splitlines() or ["a panic"])[0][:300]
            hint = " (a regular expression in it backtracks too much)" if "retry-limit" in msg else ""
            raise DecodeError(f"{what}: the tokenizers library failed{hint}: {msg}") from None
