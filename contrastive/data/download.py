"""Downloads that never leave a half-written file behind, and say what to do when offline."""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tarfile
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

logger = logging.getLogger(__name__)


class DownloadError(RuntimeError):
    """A download or checksum failed; the message says how to provide a local copy."""


def md5sum(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    h = hashlib.md5()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def download(url: str, dest: str | os.PathLike, md5: str | None = None, *, timeout: float = 60.0,
             local_hint: str = "") -> Path:
    """Fetch ``url`` to ``dest`` atomically: written to a temporary file in the same folder,
    checked against ``md5``, then renamed. On any failure the temporary file is removed, so a
    later run never trusts a partial file.

    Raises :class:`DownloadError` saying the source could not be reached (or the checksum did
    not match) and how to point at a local copy (``local_hint``).
    """
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".part", dir=dest.parent)
    tmp = Path(tmp_name)
    hint = local_hint or f"download it by other means and place it at {dest}"
    try:
        h = hashlib.md5()
        logger.info("downloading %s -> %s", url, dest)
        try:
            with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=timeout) as src:
                while block := src.read(1 << 20):
                    h.update(block)
                    out.write(block)
        except (urllib.error.URLError, OSError, TimeoutError, ValueError) as e:
            raise DownloadError(
                f"could not reach {url} ({type(e).__name__}: {e}). Offline? {hint}"
            ) from e
        if md5 is not None and h.hexdigest() != md5:
            raise DownloadError(
                f"checksum mismatch for {url}: md5 {h.hexdigest()}, expected {md5}; the file was "
                f"discarded. Retry, or {hint}"
            )
        os.replace(tmp, dest)
        return dest
    finally:
        if tmp.exists():
            tmp.unlink()


def extract_tar(archive: str | os.PathLike, root: str | os.PathLike, member: str) -> Path:
    """Extract ``archive`` into a temporary folder under ``root`` and move its top-level
    ``member`` folder to ``root/member`` in one rename (so an interrupted extraction never
    leaves a partial ``root/member``). Returns ``root/member``.
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".extract-", dir=root))
    try:
        with tarfile.open(archive) as tar:
            tar.extractall(tmp, filter="data")
        src = tmp / member
        if not src.is_dir():
            raise DownloadError(f"{archive} does not contain the folder {member!r}")
        target = root / member
        if target.exists():
            return target
        os.replace(src, target)
        return target
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def unpack_image_folder(archive: str | os.PathLike, dest: str | os.PathLike | None = None) -> Path:
    """Unpack an ImageFolder tar (``train/`` at its top or inside one top folder) to ``dest``
    once: returns ``dest`` at once when it already holds ``train/``; otherwise extracts beside
    it and renames into place, so an interrupted extraction never leaves a partial ``dest``.
    ``dest`` defaults to the archive's name without ``.tar`` in the cache folder
    (``$CONTRASTIVE_CACHE``, else ``~/.cache/contrastive``): the shared CIFAR-10 JPEG copy
    ``cifar10-jpeg.tar`` -> ``~/.cache/contrastive/cifar10-jpeg``, as tests and benchmarks use it."""
    if dest is None:
        cache = os.environ.get("CONTRASTIVE_CACHE", Path.home() / ".cache" / "contrastive")
        dest = Path(cache) / Path(archive).name.split(".tar")[0]
    dest = Path(dest).expanduser()
    if (dest / "train").is_dir():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=dest.parent))
    try:
        with tarfile.open(archive) as tar:
            tar.extractall(tmp, filter="data")
        tops = [tmp] + [p for p in tmp.iterdir() if p.is_dir()]
        root = next((p for p in tops if (p / "train").is_dir()), None)
        if root is None:
            raise DownloadError(f"{archive} holds no train/ folder (ImageFolder layout expected)")
        shutil.rmtree(dest, ignore_errors=True)
        os.replace(root, dest)
        return dest
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def fetch_and_extract(url: str, md5: str, root: str | os.PathLike, member: str, *,
                      download_ok: bool = True, local_hint: str = "") -> Path:
    """Make sure ``root/member`` exists: download ``url`` (checked by ``md5``) and extract it.

    ``download_ok=False`` raises ``FileNotFoundError`` instead of downloading.
    """
    root = Path(root).expanduser()
    target = root / member
    if target.is_dir():
        return target
    archive = root / url.rsplit("/", 1)[-1]
    if not archive.exists():
        if not download_ok:
            raise FileNotFoundError(
                f"{target} not found and download=False. {local_hint or 'Point the spec at a local copy.'}"
            )
        download(url, archive, md5, local_hint=local_hint)
    elif md5sum(archive) != md5:
        raise DownloadError(
            f"{archive} exists but its md5 is not {md5}: delete it and retry, or {local_hint}"
        )
    return extract_tar(archive, root, member)
