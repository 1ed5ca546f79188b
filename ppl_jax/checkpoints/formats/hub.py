"""Hugging Face hub ids as checkpoints: `hf://org/name[@revision]`, or a bare `org/name` that is
not a local path.

Resolved by `huggingface_hub.snapshot_download` from the local hub cache, offline unless
downloads are allowed (`checkpoint.allow_download`); `HF_HOME`, `HF_HUB_CACHE` and
`HF_HUB_OFFLINE` are honoured (huggingface_hub reads them; `HF_HUB_OFFLINE=1` forbids downloads
even when allowed). Only `config.json`, tokenizer files and safetensors weights are fetched. A
revision is a branch, tag or commit; its 40-hex commit is what the run records. Training runs
published as revision branches (Pythia's and OLMo's `step1000`, ...) are the repository's steps:
`Repo.steps()` lists the cached `refs/step<N>` (or the hub's branches when downloads are
allowed), so `checkpoint.step=step1000,step2000` sweeps them like Orbax steps.

On several processes, process 0 resolves each revision and the others use its commit
(`agree_commit`), so that every process scores the same weights even if their caches differ.
"""

from __future__ import annotations

import dataclasses
import os
import re

import jax
import numpy as np
from jax.experimental import multihost_utils

from ppl_jax.errors import CheckpointError, ConfigError

PREFIX = "hf://"
PATTERNS = ["config.json", "*.safetensors", "*.safetensors.index.json", "tokenizer*",
            "special_tokens_map.json", "generation_config.json"]  # fmt: skip
_REPO = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_STEP = re.compile(r"^(?P<prefix>[A-Za-z_-]*?)(?P<n>\d+)$")
_PICKLES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
_COMMIT = re.compile(r"^[0-9a-fA-F]{40}$|^[0-9a-fA-F]{64}$")  # a git commit (SHA-1 or SHA-256)


def is_hub_id(path: str) -> bool:
    """`hf://...`, or `org/name[@rev]` that names no local file or folder."""
    if path.startswith(PREFIX):
        return True
    repo = path.split("@", 1)[0]
    return bool(_REPO.match(repo)) and not os.path.exists(os.path.expanduser(path))


def parse(path: str) -> tuple[str, str | None]:
    """`(repo_id, revision or None)` of a hub id.

    Raises:
      ConfigError: a malformed id.
    """
    body = path[len(PREFIX) :] if path.startswith(PREFIX) else path
    repo, _, revision = body.partition("@")
    if not _REPO.match(repo):
        raise ConfigError(
            f"checkpoint.dir={path!r} is not a hub id 'hf://org/name[@revision]' (org/name)."
        )
    return repo, revision or None


def step_of(revision: str) -> int | None:
    """The step number of a revision name `step1000` (any letters before the digits), or None."""
    m = _STEP.match(revision)
    return int(m.group("n")) if m else None


@dataclasses.dataclass
class Repo:
    """A hub repository opened from the cache (or the hub, when downloads are allowed).

    Attributes:
      repo_id: `org/name`. revision: the id's revision (None: `main`). allow_download: as set.
      prefix: the letters of step revisions (`step` in `step1000`), from the id's revision.
    """

    repo_id: str
    revision: str | None
    allow_download: bool
    prefix: str = "step"
    steps_only: bool = False  # a cache's repository folder: step None is the latest step revision
    _commits: dict[str, str] = dataclasses.field(default_factory=dict, repr=False)

    def revision_of(self, step: int | None) -> str:
        """The revision name of a step (None: the id's own revision, or `main`; for a cache's
        repository folder, the latest step revision)."""
        if step is None and self.steps_only and self.steps():
            step = self.steps()[-1]
        return (self.revision or "main") if step is None else f"{self.prefix}{step}"

    def snapshot(self, step: int | None) -> str:
        """The local folder of the step's revision (`snapshots/<commit>`), resolved offline
        unless downloads are allowed.

        Raises:
          CheckpointError: an unknown repository or revision (naming it and the cache), a
            revision with only pickled weights.
        """
        revision = self.revision_of(step)
        folder = self._download(revision)
        self._check_inside_cache(folder, revision)
        own = os.path.basename(os.path.normpath(folder))
        commit = agree_commit(own)
        self._commits[revision] = commit
        folder = os.path.join(os.path.dirname(os.path.normpath(folder)), commit)
        self._check_inside_cache(folder, revision)
        if not os.path.isdir(folder):  # process 0's commit, absent from this host's cache
            raise CheckpointError(
                f"process 0 scores commit {commit} of {self.repo_id!r}, which this process's hub "
                f"cache ({_cache()}) does not hold (here {revision!r} is commit {own}); give "
                f"every host the same revisions (huggingface-cli download {self.repo_id} "
                f"--revision <revision> on each), or one shared cache."
            )
        _check_weights(folder, self.repo_id, revision)
        return folder

    def _download(self, revision: str) -> str:
        """`snapshot_download` of `revision` (the commit it resolved to before, if any): offline
        unless downloads are allowed, only `PATTERNS` (and pickles, to name them).

        Raises:
          CheckpointError: a revision not in the cache (offline) or not on the hub, naming it.
        """
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

        commit = self._commits.get(revision)
        offline = not self.allow_download or _env_offline()
        try:
            return snapshot_download(
                self.repo_id,
                revision=commit or revision,
                allow_patterns=PATTERNS + [f"*{p}" for p in _PICKLES],
                local_files_only=offline,
                cache_dir=_cache(),
            )
        except (LocalEntryNotFoundError, HFValidationError, FileNotFoundError) as e:
            how = (
                "it is not in the local hub cache"
                if offline
                else f"it cannot be downloaded ({' '.join(str(e).split())[:200]})"
            )
            raise CheckpointError(
                f"hub revision {revision!r} of {self.repo_id!r}: {how} ({_cache()}). Download it "
                f"(huggingface-cli download {self.repo_id} --revision {revision}), or set "
                f"checkpoint.allow_download=true."
            ) from None
        except Exception as e:  # the hub's HTTP errors: an unknown repository, no network
            raise CheckpointError(
                f"hub revision {revision!r} of {self.repo_id!r} cannot be resolved "
                f"({type(e).__name__}: {' '.join(str(e).split())[:200]})."
            ) from None

    def _check_inside_cache(self, folder: str, revision: str) -> None:
        """Refuses a snapshot folder outside the repository's `snapshots/` (a ref file naming
        `../../elsewhere`, or a snapshot that is a link out of the cache): the hub's revision
        would be another folder's weights.

        Raises:
          CheckpointError: naming the ref, the folder and the repair.
        """
        snapshots = os.path.realpath(os.path.join(repo_folder(self.repo_id), "snapshots"))
        real = os.path.realpath(folder)
        name = os.path.basename(os.path.normpath(folder))
        if os.path.dirname(real) != snapshots or not _COMMIT.match(name):
            raise CheckpointError(
                f"hub revision {revision!r} of {self.repo_id!r} resolves to {real!r}, outside the "
                f"hub cache's snapshots of the repository ({snapshots}); ppl_jax reads no folder "
                f"outside the cache. Repair the cache (delete refs/{revision} and run "
                f"huggingface-cli download {self.repo_id} --revision {revision})."
            )

    def commit(self, step: int | None) -> str:
        """The 40-hex commit of the step's revision (resolved by `snapshot`)."""
        revision = self.revision_of(step)
        if revision not in self._commits:
            self.snapshot(step)
        return self._commits[revision]

    def steps(self) -> list[int]:
        """The step revisions (`<prefix><N>` branches) cached (or on the hub, when downloads are
        allowed), ascending."""
        names: list[str] = []
        if self.allow_download and not _env_offline():
            from huggingface_hub import list_repo_refs

            try:
                names = [b.name for b in list_repo_refs(self.repo_id).branches]
            except Exception:  # offline after all: the cache's refs
                names = []
        if not names:
            refs = os.path.join(_cache(), "models--" + self.repo_id.replace("/", "--"), "refs")
            names = os.listdir(refs) if os.path.isdir(refs) else []
        steps = []
        for name in names:
            m = _STEP.match(name)
            if m and m.group("prefix") == self.prefix:
                steps.append(int(m.group("n")))
        return sorted(steps)


def _check_weights(folder: str, repo_id: str, revision: str) -> None:
    """Refuses a revision whose snapshot holds no safetensors weights (only pickles, or none).

    Raises:
      CheckpointError: naming the revision, the repository and the pickled files.
    """
    names = os.listdir(folder)
    if not any(n.endswith(".safetensors") for n in names):
        pickles = [n for n in names if n.endswith(_PICKLES)]
        what = f"only pickled weights ({', '.join(sorted(pickles))})" if pickles else "no weights"
        raise CheckpointError(
            f"hub revision {revision!r} of {repo_id!r} holds {what}; ppl_jax reads "
            f"safetensors only (a pickle can run code). Convert it, or pick a revision with "
            f"model.safetensors."
        )


def open_repo(path: str, allow_download: bool) -> Repo:
    """The `Repo` of a hub id; its revision's step prefix (`step` of `step1000`) is kept."""
    repo_id, revision = parse(path)
    m = _STEP.match(revision or "")
    return Repo(repo_id, revision, allow_download, m.group("prefix") if m else "step")


def repo_folder(repo_id: str) -> str:
    """The repository's folder in the hub cache (`<cache>/models--org--name`)."""
    return os.path.join(_cache(), "models--" + repo_id.replace("/", "--"))


def is_repo_folder(path: str) -> bool:
    """A hub cache's repository folder (`models--org--name` with `refs/` and `snapshots/`)."""
    name = os.path.basename(os.path.normpath(path))
    return (
        name.startswith("models--")
        and os.path.isdir(os.path.join(path, "refs"))
        and os.path.isdir(os.path.join(path, "snapshots"))
    )


def repo_of_folder(path: str, allow_download: bool) -> Repo:
    """The `Repo` of a cache's repository folder given as the checkpoint (its step None: the
    latest step revision)."""
    name = os.path.basename(os.path.normpath(path))[len("models--") :]
    return Repo(name.replace("--", "/", 1), None, allow_download, steps_only=True)


def agree_commit(commit: str) -> str:
    """Process 0's commit on every process (a no-op on one process)."""
    if jax.process_count() == 1:
        return commit
    data = np.frombuffer(commit.encode("ascii").ljust(64, b" "), np.uint8)
    got = np.asarray(multihost_utils.broadcast_one_to_all(data))
    return bytes(got.astype(np.uint8)).decode("ascii").strip()


def _env_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def _cache() -> str:
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "huggingface"
    )
    return os.path.join(home, "hub")
