"""Token ids back to text for `rollout-audit show`: a local Hugging Face tokenizer directory, or the
vocabulary a producer declared in the file metadata `rollout_log.tokenizer` (written by RolloutWriter)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
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

    def pieces(self, ids: Sequence[int]) -> list[str]:
        """The text of each token; an id outside the vocabulary shows as `<id?>`."""
        if self.hf is not None:
            n = len(self.hf)
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
    try:
        tok = AutoTokenizer.from_pretrained(str(p), local_files_only=True, trust_remote_code=False)
    except Exception as e:  # noqa: BLE001 - transformers raises many kinds; the user gets one line
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise DecodeError(f"--tokenizer {path}: cannot load a tokenizer: {first}") from None
    return Decoder(getattr(tok, "name_or_path", str(p)) or str(p), hf=tok)
