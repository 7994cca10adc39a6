"""Models by name: "hf://ORG/REPO/FILE.gguf" (optionally "hf://ORG/REPO@REVISION/FILE.gguf")
names a GGUF file on the Hugging Face Hub. huggingface_hub downloads it once into its cache
(HF_HOME / HF_HUB_CACHE) and answers from there afterwards, offline too (HF_HUB_OFFLINE=1)."""
from __future__ import annotations

import os

from kcap.errors import HubError

PREFIX = "hf://"


def is_hub_reference(path) -> bool:
    return isinstance(path, str) and path.startswith(PREFIX)


def parse_reference(reference: str) -> tuple[str, str, str | None]:
    """"hf://org/repo[@revision]/path/in/repo.gguf" -> (repo_id, filename, revision)."""
    parts = reference[len(PREFIX):].split("/")
    if len(parts) < 3 or not all(parts):
        raise HubError(f"{reference!r} is not a Hub file reference; write hf://ORG/REPO/FILE.gguf "
                       "(or hf://ORG/REPO@REVISION/FILE.gguf)")
    repo_name, _, revision = parts[1].partition("@")
    if not repo_name or (revision == "" and "@" in parts[1]):
        raise HubError(f"{reference!r}: empty repository name or revision")
    return f"{parts[0]}/{repo_name}", "/".join(parts[2:]), revision or None


def download(reference: str) -> str:
    """The local path of a Hub file, downloaded into the Hub cache unless it is there already."""
    repo_id, filename, revision = parse_reference(reference)
    try:
        from huggingface_hub import hf_hub_download
        from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError
    except ImportError:
        raise HubError(f"loading {reference} needs huggingface_hub: pip install 'kcap[hub]'") from None
    try:
        return hf_hub_download(repo_id=repo_id, filename=filename, revision=revision)
    except LocalEntryNotFoundError as exc:
        raise HubError(f"{reference}: not in the Hub cache and it cannot be downloaded now "
                       f"(offline, HF_HUB_OFFLINE=1, or the Hub unreachable): {exc}") from None
    except HfHubHTTPError as exc:  # includes missing repositories, files and revisions
        raise HubError(f"{reference}: the Hub refused the download: {exc}") from None
    except (OSError, ValueError) as exc:
        raise HubError(f"{reference}: {exc}") from None


def resolve_model_path(path) -> str:
    """A local path for what load() was given: a file path as it is, a Hub reference downloaded."""
    if is_hub_reference(path):
        return download(path)
    return os.fspath(path)
