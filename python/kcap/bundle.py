"""`kcap export MODEL -o DIR`: what a C++ host needs to run MODEL without Python (a bundle).

DIR/kcap-bundle.json is the manifest (docs/embedding.md): the spec the architecture module built
(every field, and each tensor as a byte range of the GGUF file, which the C++ library
memory-maps: the weights are not copied), the GGUF file's path, size and fingerprint, the token
ids a host needs and the chat template. The core writes it (cpp/core/bundle.cpp), the same code
that reads it. DIR/tokenizer.json is the tokenizer kcap built from the GGUF, in the format of
Hugging Face's tokenizers library; its post-processor adds the BOS/EOS tokens as kcap does, so
`Tokenizer.from_file(...).encode(text).ids` equals `model.tokenize(text)`.
"""
from __future__ import annotations

import os

from kcap import _core
from kcap.arch import build_spec
from kcap.errors import InvalidArgumentError, ModelError
from kcap.gguf import GGUFFile
from kcap.model import register_tensors

MANIFEST = _core.BUNDLE_MANIFEST
TOKENIZER = _core.BUNDLE_TOKENIZER


def export_bundle(model_path: str | os.PathLike, directory: str | os.PathLike, relative: bool = False) -> dict:
    """Writes the bundle of the GGUF file model_path (a path or hf://ORG/REPO/FILE.gguf) into
    directory (made if absent; a bundle already there is replaced). relative: the manifest names
    the GGUF file by its path relative to directory (for a bundle shipped beside its file)
    instead of its absolute path. Returns the manifest fields as the C++ library reads them back."""
    from kcap import __version__
    from kcap.hub import resolve_model_path
    from kcap.tokenizer import load_tokenizer

    path = os.path.abspath(resolve_model_path(model_path))
    directory = os.fspath(directory)
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise InvalidArgumentError(f"{directory}: exists and is not a directory")
    if os.path.isdir(directory) and os.listdir(directory) and not os.path.exists(os.path.join(directory, MANIFEST)):
        raise InvalidArgumentError(f"{directory}: is a directory with other files in it and no {MANIFEST}; "
                                   "export into a new or empty directory")
    gguf = GGUFFile(path)
    spec = build_spec(gguf)
    register_tensors(spec, gguf)
    has_vocab = gguf.metadata.get("tokenizer.ggml.model", "no_vocab") != "no_vocab"
    tokenizer = load_tokenizer(gguf.metadata) if has_vocab else None

    os.makedirs(directory, exist_ok=True)
    tokenizer_file = os.path.join(directory, TOKENIZER)
    if tokenizer is not None:
        _write(tokenizer_file, _tokenizer_json(tokenizer))
    elif os.path.exists(tokenizer_file):
        os.remove(tokenizer_file)  # a bundle replaced here had one
    gguf_path = os.path.relpath(path, os.path.abspath(directory)) if relative else path
    manifest = _core.bundle_manifest(
        spec,
        gguf._array,
        gguf_path=gguf_path,
        bos_id=tokenizer.bos_id if tokenizer is not None and tokenizer.bos_id is not None else -1,
        eos_ids=sorted(tokenizer.eos_ids) if tokenizer is not None else [],
        add_bos=bool(tokenizer is not None and tokenizer.add_bos),
        add_eos=bool(tokenizer is not None and tokenizer.add_eos),
        chat_template=(tokenizer.chat_template or "") if tokenizer is not None else "",
        has_tokenizer=tokenizer is not None,
        kcap_version=__version__,
    )
    _write(os.path.join(directory, MANIFEST), manifest)
    # Read back as a host will: a bundle that does not load is never left behind silently.
    _, fields = _core.load_bundle(directory)
    return fields


def _tokenizer_json(tokenizer) -> str:
    """The tokenizer's backend as tokenizer.json, with BOS/EOS added by its post-processor as
    kcap's encode adds them (kcap keeps that step outside the backend)."""
    from tokenizers import Tokenizer
    from tokenizers.processors import TemplateProcessing

    backend = Tokenizer.from_str(tokenizer._backend.to_str())
    if tokenizer.add_bos or tokenizer.add_eos:
        specials, single, pair = [], "$A", "$A $B"
        if tokenizer.add_bos:
            bos = backend.id_to_token(tokenizer.bos_id)
            specials.append((bos, tokenizer.bos_id))
            single, pair = f"{bos} {single}", f"{bos} $A {bos} $B"
        if tokenizer.add_eos:
            eos = backend.id_to_token(tokenizer.eos_id)
            specials.append((eos, tokenizer.eos_id))
            single = f"{single} {eos}"
            pair = pair.replace("$A", f"$A {eos}").replace("$B", f"$B {eos}")
        backend.post_processor = TemplateProcessing(single=single, pair=pair, special_tokens=specials)
    if backend.id_to_token(0) is None:
        raise ModelError("the tokenizer has no token 0; it cannot be written as tokenizer.json")
    return backend.to_str(pretty=False)


def _write(path: str, text: str) -> None:
    """Writes text to path through a temporary file, so a failed export never leaves half a file."""
    partial = path + ".partial"
    with open(partial, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(partial, path)
