"""A container's view of the filesystem: a private mount namespace with a copy-on-write root.

Why: a container process runs on the host, so without this its absolute paths (`/airflow/xcom`,
`/var/run/secrets/...`, `/tmp`) would be the host's. In the child, between fork and exec, the kubelet
  1. unshares the mount namespace (nothing mounted there propagates back to the host),
  2. mounts an overlay whose lower layer is the host's `/` and whose upper layer lives in the pod's
     directory (a write anywhere in the container's root lands there, never on the host),
  3. binds /proc, /sys and /dev, gives the container a private 64 MiB tmpfs at /dev/shm (as a container
     runtime does), hides the cluster's state dir (store log with every Secret, admin kubeconfig) behind
     an empty tmpfs, and binds the pod's own directory back in at its real path,
  4. chroots into that root and binds each volume at the mountPath the container asked for,
  5. runs the command in its own PID namespace (`unshare --pid --fork --mount-proc`) under dumb-init as
     PID 1: the container sees only its own processes in /proc, and PID 1 forwards SIGTERM (a process
     that is PID 1 itself would ignore it). Without this, a container's `kill $(pgrep sh)`, which
     KubernetesPodOperator runs in its XCom sidecar, would signal the host's processes.
`kubectl exec` joins the container's namespaces and root with nsenter.
This needs CAP_SYS_ADMIN (the cluster runs as root, as in CI) and util-linux's unshare and nsenter. Where it is not permitted, the kubelet
does not run the container unconfined: it fails to start with a Warning Event naming the reason and the
fix (run as root, or `podIsolation: none` in the cluster spec to run pods on the host filesystem knowingly).

The plan is computed in the parent; the child only makes syscalls (no imports, no allocation-heavy work
between fork and exec in a threaded parent).
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

_libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWNS = 0x00020000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 32, 4096, 16384, 1 << 18
DEV_SHM_SIZE = "64m"  # a container runtime's default /dev/shm
UNSHARE, NSENTER = shutil.which("unshare"), shutil.which("nsenter")
DUMB_INIT = shutil.which("dumb-init", path=f"{os.path.dirname(sys.executable)}:{os.environ.get('PATH', '')}")


def container_argv(argv: list[str]) -> list[str]:
    """The command line of a confined container: a PID namespace of its own, dumb-init as its PID 1."""
    return [UNSHARE, "--pid", "--fork", "--mount-proc", "--kill-child", "--", DUMB_INIT, "--", *argv]


def container_init_pid(launcher_pid: int) -> int | None:
    """The container's PID 1 (dumb-init, the child of unshare) as the host sees it; None if gone."""
    try:
        with open(f"/proc/{launcher_pid}/task/{launcher_pid}/children") as fh:
            children = fh.read().split()
    except OSError:
        return None
    return int(children[0]) if children else None


def enter(init_pid: int, workdir: str) -> None:
    """In the child of `kubectl exec`, before exec: join the container's mount namespace and root (as
    nsenter --mount --root) and its working dir. The root is opened before setns: after it the host's
    paths are gone. Then exec `exec_argv`: nsenter joins the PID namespace (only a child can be in it)."""
    try:
        root = os.open(f"/proc/{init_pid}/root", os.O_RDONLY | os.O_DIRECTORY)
        namespace = os.open(f"/proc/{init_pid}/ns/mnt", os.O_RDONLY)
    except OSError as exc:
        raise OSError(exc.errno, f"the container's process {init_pid} is gone: {exc.strerror}") from None
    if _libc.setns(namespace, CLONE_NEWNS) != 0:
        _fail("setns(CLONE_NEWNS)")
    os.fchdir(root)
    os.chroot(".")
    os.chdir(workdir)


def exec_argv(argv: list[str]) -> list[str]:
    """`kubectl exec`'s command line, run after enter(): into the PID namespace, whose PID 1 (dumb-init)
    is /proc/1 in the container's own /proc."""
    return [NSENTER, "--target=1", "--pid", "--", *argv]


@dataclass(frozen=True)
class Bind:
    source: str  # host path (inside the new root: the pod directory is bound at its real path)
    target: str  # absolute path inside the container
    read_only: bool = False
    is_file: bool = False


@dataclass
class MountPlan:
    rootfs: Path  # <pod dir>/.rootfs/<container>-<restart>
    pod_dir: Path
    hidden_dir: Path  # the cluster's state dir: hidden from the container, except pod_dir
    workdir: Path
    binds: list[Bind] = field(default_factory=list)
    shm_is_volume: bool = False
    read_only_root: bool = False  # readOnlyRootFilesystem: the root and the working dir, not the volumes
    # (path, mode): host directories a non-root container must traverse to reach its interpreter (such
    # as a 0700 /root holding pyenv), opened in its copy-on-write root only (the host is untouched)
    traversable: list[tuple[str, int]] = field(default_factory=list)

    def prepare(self) -> None:
        """In the parent: the overlay's directories, inside the pod directory."""
        for name in ("upper", "work", "merged"):
            (self.rootfs / name).mkdir(parents=True, exist_ok=True)

    @property
    def error_path(self) -> Path:
        return self.rootfs / "setup-error"

    def apply(self) -> None:
        """In the child, before exec. Raises OSError naming the step that failed, and writes it to
        error_path (the exception itself does not cross exec back to the parent)."""
        fd = os.open(str(self.error_path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            self._apply()
        except OSError as exc:
            os.write(fd, str(exc).encode())
            raise

    def setup_error(self) -> str:
        try:
            return self.error_path.read_text().strip() or "unknown error"
        except OSError:
            return "unknown error"

    def _apply(self) -> None:
        merged = str(self.rootfs / "merged")
        if _libc.unshare(CLONE_NEWNS) != 0:
            _fail("unshare(CLONE_NEWNS)")
        _mount(None, "/", None, MS_REC | MS_PRIVATE)
        _mount("overlay", merged, "overlay", 0,
               f"lowerdir=/,upperdir={self.rootfs / 'upper'},workdir={self.rootfs / 'work'}")
        for sub in ("proc", "sys", "dev"):
            _mount(f"/{sub}", f"{merged}/{sub}", None, MS_BIND | MS_REC)
        # 0711: a container running as another user can still reach its pod directory, not list its neighbours
        _mount("tmpfs", f"{merged}{self.hidden_dir}", "tmpfs", MS_NOSUID | MS_NODEV, "mode=0711,size=1m")
        os.makedirs(f"{merged}{self.pod_dir}", exist_ok=True)
        _mount(str(self.pod_dir), f"{merged}{self.pod_dir}", None, MS_BIND)
        if not self.shm_is_volume:
            _mount("tmpfs", f"{merged}/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, f"mode=1777,size={DEV_SHM_SIZE}")
        os.chroot(merged)
        os.chdir("/")
        for bind in self.binds:  # inside the new root: symlinks in mount paths resolve there, not on the host
            if bind.is_file:
                os.makedirs(os.path.dirname(bind.target) or "/", exist_ok=True)
                if not os.path.exists(bind.target):
                    os.close(os.open(bind.target, os.O_CREAT | os.O_WRONLY, 0o644))
            else:
                os.makedirs(bind.target, exist_ok=True)
            _mount(bind.source, bind.target, None, MS_BIND | MS_REC)
            if bind.read_only:
                _mount(None, bind.target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_REC)
        for path, mode in self.traversable:  # copies up the directory's inode only
            os.chmod(path, mode)
        if self.read_only_root:  # the volumes are mounts of their own and stay writable
            _mount(None, "/", None, MS_REMOUNT | MS_BIND | MS_RDONLY)
            _mount(None, str(self.pod_dir), None, MS_REMOUNT | MS_BIND | MS_RDONLY)
        os.chdir(str(self.workdir))


def traversable_for_others(paths: list[str]) -> list[tuple[str, int]]:
    """(directory, mode with o+x) for each ancestor of `paths` (symlinks followed) that other users
    cannot traverse on the host."""
    out: dict[str, int] = {}
    for path in paths:
        for candidate in {path, os.path.realpath(path)}:
            parent = os.path.dirname(candidate)
            while parent and parent != "/":
                try:
                    mode = os.stat(parent).st_mode & 0o7777
                except OSError:
                    break
                if not mode & 0o001:
                    out[parent] = mode | 0o011
                parent = os.path.dirname(parent)
    return list(out.items())


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    if _libc.mount(source and source.encode(), target.encode(), fstype and fstype.encode(),
                   ctypes.c_ulong(flags), data and data.encode()) != 0:
        _fail(f"mount {target}")


def _fail(step: str) -> None:
    errno = ctypes.get_errno()
    raise OSError(errno, f"{step}: {os.strerror(errno)}")


def probe(scratch: Path) -> str | None:
    """None when containers can be confined here, else why not (run once when the kubelet starts)."""
    pod_dir = scratch / "isolation-probe"
    plan = MountPlan(pod_dir / ".rootfs" / "probe", pod_dir, scratch, pod_dir)
    plan.prepare()
    try:
        missing = [name for name, path in (("unshare", UNSHARE), ("nsenter", NSENTER), ("dumb-init", DUMB_INIT))
                   if path is None]
        if missing:
            return f"{' and '.join(missing)} not found (util-linux; dumb-init is a dependency of airflow-gpu)"
        result = subprocess.run(container_argv(["/bin/sh", "-c", "echo x > /probe-write; echo $$"]),
                                preexec_fn=plan.apply, capture_output=True, text=True, timeout=30)
        if result.returncode != 0 or not (plan.rootfs / "upper" / "probe-write").exists():
            return f"a confined test process failed: {result.stderr.strip()[-300:]}"
        if result.stdout.strip() != "2":  # PID 1 is dumb-init, the command the first process under it
            return f"the container's PID namespace was not set up (its shell has PID {result.stdout.strip()!r})"
        return None
    except (OSError, subprocess.SubprocessError):
        return f"the mount namespace could not be set up ({plan.setup_error()}); it needs CAP_SYS_ADMIN"
    finally:
        shutil.rmtree(pod_dir, ignore_errors=True)
